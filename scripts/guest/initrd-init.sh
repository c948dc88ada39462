#!/bin/sh
# The guest's initramfs /init (busybox): load the modules that reach the root disk and the shared
# checkout, mount both, and hand over to the checkout's scripts/guest/guest-init.sh (docs/guest.md).
# Kernel command line: netai.probe=1 only prints a marker and powers off (the KVM probe of run.sh).
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
if grep -q 'netai.probe=1' /proc/cmdline; then
    echo "NETAI-GUEST-PROBE ok"
    poweroff -f
fi
for m in $(cat /modules.list); do insmod "/lib/modules/$m" || echo "netai initrd: insmod $m failed"; done
mkdir -p /newroot
i=0
while [ ! -b /dev/vda ] && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if ! mount -t ext4 /dev/vda /newroot; then
    echo "NETAI-GUEST-EXIT 125 (the root disk /dev/vda did not mount)"
    poweroff -f
fi
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro netai /newroot/opt/netai/src; then
    echo "NETAI-GUEST-EXIT 125 (the shared checkout did not mount)"
    poweroff -f
fi
mount -t 9p -o trans=virtio,version=9p2000.L job /newroot/job || echo "netai initrd: no job share"
umount /proc /sys /dev

exec switch_root /newroot /bin/sh /opt/netai/src/scripts/guest/guest-init.sh
