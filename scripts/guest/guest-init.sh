#!/bin/sh
# PID 1 of the test guest, read from the shared checkout (docs/guest.md): mount what a Debian
# system has, start Open vSwitch as its package does (ovs-ctl, which loads the openvswitch module),
# run the job's command (/job/argv: NUL-separated arguments, from scripts/guest/run.sh) in the
# checkout, print "NETAI-GUEST-EXIT <status>" on the console and power off. No network to the host:
# the console and the job share are the only channels.
export PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The checkout is read-only: its byte code is compiled on the host before the boot (scripts/guest/run.sh),
# the venv's when it was built, and each process reads both where they lie. (A cache prefix would
# hide them both: the first process of each boot compiled them again, 30 s under TCG.)
export HOME=/root PYTHONUNBUFFERED=1 LANG=C.UTF-8 NETAI_IN_GUEST=1
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts /dev/shm
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null || true
mount -o remount,rw / 2>/dev/null || true
hostname netai-guest
ip link set lo up

finish() {
    echo "NETAI-GUEST-EXIT $1"
    sync
    echo o >/proc/sysrq-trigger
    sleep 10
}

if ! /usr/share/openvswitch/scripts/ovs-ctl start --system-id=random >/tmp/ovs-ctl.log 2>&1; then
    cat /tmp/ovs-ctl.log
    finish 124
fi
cd /opt/netai/src || finish 125
if [ ! -s /job/argv ]; then
    echo "netai guest: no command in /job/argv"
    finish 125
fi
# The arguments exactly as given (no shell between): exec'd from Python, which reads NULs plainly.
stdin=/dev/null
[ -e /job/interactive ] && stdin=/dev/ttyS0
/usr/bin/python3 -c 'import os; a = [x for x in open("/job/argv", "rb").read().split(b"\0") if x]; os.execvp(a[0], a)' <"$stdin"
finish $?
