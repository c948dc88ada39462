#!/usr/bin/env bash
# Build the stock-kernel test guest from Debian packages, once, and cache it (docs/guest.md).
#
# The guest is what a user's Debian/Ubuntu host has and this project's hosts may lack: a stock
# kernel (Debian's linux-image-*-amd64, unpacked, not installed on the host) with the Open vSwitch
# kernel datapath and sch_netem as modules, and a bookworm root file system (debootstrap) with
# Open vSwitch, Mininet, iperf3 and the project's Python dependencies without torch (training does
# not belong in an emulated CPU). The project's code is not baked in: scripts/guest/run.sh shares the
# checkout read-only at boot.
#
# Output, in $NETAI_GUEST_CACHE/<key>/ (default /var/cache/netai-guest): vmlinuz, initrd.img (a
# busybox initramfs that loads virtio, ext4 and 9p and switches to the root disk), root.img (ext4),
# inputs.txt. <key> hashes the inputs: this script, the package list, the kernel version and the
# Python requirements (read from setup.py); a change of any rebuilds, a warm cache costs a second.
# Older builds are removed. Prints the build directory on stdout (last line).
#
# Usage: scripts/guest/build.sh [--force]     (root: debootstrap, chroot, mkfs)
# Environment: NETAI_GUEST_CACHE, DEBIAN_MIRROR (default http://deb.debian.org/debian),
#   VENV (the project's venv whose pip fills the guest's; default .venv).
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
CACHE=${NETAI_GUEST_CACHE:-/var/cache/netai-guest}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
VENV=${VENV:-$ROOT/.venv}
PYVER=3.11
log() { printf '[guest-build] %s\n' "$*" >&2; }
die() { printf 'scripts/guest/build.sh: %s\n' "$*" >&2; exit 1; }

force=0
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
        *) die "unknown argument $arg" ;;
    esac
done

# The guest's packages: the data plane and what Mininet runs in it. busybox-static gives the
# initramfs its one binary; kmod gives modprobe; python3-venv the venv.
PACKAGES="openvswitch-switch iproute2 iperf3 mininet ethtool net-tools iputils-ping procps psmisc kmod
          python3 python3-venv busybox-static ca-certificates"
# Modules the initramfs loads (with their dependencies) to reach the root disk and the shared checkout.
INITRD_MODULES="virtio_pci virtio_blk crc32c_generic ext4 9pnet_virtio 9p"

# -- host tools (idempotent) ------------------------------------------------------------------------
need=""
for p in qemu-system-x86 debootstrap e2fsprogs kmod cpio; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need="$need $p"
done
if [ -n "$need" ]; then
    [ "$(id -u)" = 0 ] || die "missing host packages:$need (run as root once)"
    log "installing host packages:$need"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $need >/dev/null
fi

# -- inputs and the cache key -----------------------------------------------------------------------
kernel_version() {  # the version linux-image-amd64 points at, e.g. 6.1.0-56-amd64
    apt-cache depends linux-image-amd64 2>/dev/null | sed -n 's/^ *Depends: linux-image-\(.*\)$/\1/p' | head -n 1
}
KVER=$(kernel_version)
if [ -z "$KVER" ]; then
    [ "$(id -u)" = 0 ] || die "apt knows no linux-image-amd64 (run apt-get update as root)"
    apt-get update -qq
    KVER=$(kernel_version)
fi
[ -n "$KVER" ] || die "apt knows no linux-image-amd64 package: cannot pick the guest's kernel"
# install_requires, the 'net' extra (os-ken pinned there) and pytest (the checks reuse the integration
# tests' helpers), read from setup.py: declared once.
REQUIREMENTS=$(python3 - <<'PY'
import ast
tree = ast.parse(open("setup.py").read())
call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "setup")
kw = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg in ("install_requires", "extras_require")}
test = [r for r in kw["extras_require"]["test"] if r.split(">")[0].split("=")[0] == "pytest"]
print("\n".join(kw["install_requires"] + kw["extras_require"]["net"] + test))
PY
)
KEY=$( { cat scripts/guest/build.sh scripts/guest/initrd-init.sh; echo "$PACKAGES"; echo "$INITRD_MODULES"; echo "$KVER"; echo "$REQUIREMENTS"; } \
    | sha256sum | cut -c1-16)
OUT=$CACHE/$KEY
if [ "$force" = 0 ] && [ -f "$OUT/inputs.txt" ]; then
    log "guest $KEY is up to date (kernel $KVER)"
    echo "$OUT"
    exit 0
fi

# -- build -----------------------------------------------------------------------------------------
[ "$(id -u)" = 0 ] || die "building the guest needs root (debootstrap, chroot)"
[ -x "$VENV/bin/python" ] || die "no venv at $VENV: its pip fills the guest's (make setup)"
mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock 9  # one build at a time; a build that finished meanwhile is taken as it is
if [ "$force" = 0 ] && [ -f "$OUT/inputs.txt" ]; then echo "$OUT"; exit 0; fi
t0=$(date +%s)
WORK=$(mktemp -d "$CACHE/build.XXXXXX")
TREE=$WORK/tree
mounted=""
cleanup() {
    for m in $mounted; do umount -l "$m" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT

log "1/5 kernel linux-image-$KVER (apt-get download, unpacked)"
( cd "$WORK" && apt-get download -q "linux-image-$KVER" >"$WORK/download.log" 2>&1 ) \
    || { apt-get update -qq && ( cd "$WORK" && apt-get download -q "linux-image-$KVER" >"$WORK/download.log" 2>&1 ); } \
    || { cat "$WORK/download.log" >&2; die "could not download linux-image-$KVER"; }

log "2/5 debootstrap --variant=minbase bookworm"
debootstrap --variant=minbase bookworm "$TREE" "$MIRROR" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -n 20 "$WORK/debootstrap.log" >&2; die "debootstrap failed"; }
# Packages' maintainer scripts must not start services inside the chroot (or on the host).
printf '#!/bin/sh\nexit 101\n' >"$TREE/usr/sbin/policy-rc.d"
chmod +x "$TREE/usr/sbin/policy-rc.d"
mount -t proc proc "$TREE/proc" && mounted="$TREE/proc $mounted"
# shellcheck disable=SC2086
chroot "$TREE" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $PACKAGES \
    >"$WORK/apt.log" 2>&1 || { tail -n 20 "$WORK/apt.log" >&2; die "apt-get install in the guest tree failed"; }
umount "$TREE/proc" && mounted=""
rm -f "$TREE/usr/sbin/policy-rc.d"
# Unpacked aside, then its modules copied in: extracting over the tree would replace the merged-/usr
# symlink /lib with a directory.
dpkg-deb -x "$WORK"/linux-image-*.deb "$WORK/kernel"
mkdir -p "$TREE/lib/modules"
cp -a "$WORK/kernel/lib/modules/$KVER" "$TREE/lib/modules/"
depmod -b "$TREE" "$KVER"

log "3/5 Python packages without torch (host pip, --target, into the guest's venv /opt/venv)"
chroot "$TREE" /usr/bin/python3 -m venv --without-pip --system-site-packages /opt/venv
site=$TREE/opt/venv/lib/python$PYVER/site-packages
[ -d "$site" ] || die "the guest's venv has no $site (is its Python $PYVER?)"
printf '%s\n' "$REQUIREMENTS" >"$WORK/requirements.txt"
"$VENV/bin/python" -m pip install -q --no-warn-script-location --target "$site" -r "$WORK/requirements.txt" \
    >"$WORK/pip.log" 2>&1 || { grep -v 'is ignored' "$WORK/pip.log" | tail -n 20 >&2; die "pip failed"; }
# Console scripts (osken-manager) next to the guest's Python, where the project looks for them.
for f in "$site"/bin/*; do
    [ -f "$f" ] || continue
    sed '1s|^#!.*python.*$|#!/opt/venv/bin/python|' "$f" >"$TREE/opt/venv/bin/$(basename "$f")"
    chmod +x "$TREE/opt/venv/bin/$(basename "$f")"
done
rm -rf "$site/bin"
echo /opt/netai/src >"$site/netai.pth"
printf '#!/bin/sh\nexec /opt/venv/bin/python -m orchestrator.cli "$@"\n' >"$TREE/usr/local/bin/netai"
chmod +x "$TREE/usr/local/bin/netai"
mkdir -p "$TREE/opt/netai/src" "$TREE/job"
echo netai-guest >"$TREE/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 netai-guest\n' >"$TREE/etc/hosts"
rm -rf "$TREE"/var/cache/apt/archives/*.deb "$TREE"/var/lib/apt/lists/* "$TREE"/usr/share/doc/* \
    "$TREE"/usr/share/man/* "$TREE"/usr/share/locale/*

log "4/5 initramfs (busybox; modules: $INITRD_MODULES)"
mkdir -p "$WORK/initrd/bin" "$WORK/initrd/lib/modules" "$WORK/initrd/proc" "$WORK/initrd/sys" "$WORK/initrd/dev" "$WORK/out"
cp "$TREE/bin/busybox" "$WORK/initrd/bin/busybox"
for cmd in sh mount umount insmod mkdir switch_root cat echo poweroff sleep grep; do
    ln -s busybox "$WORK/initrd/bin/$cmd"
done
: >"$WORK/initrd/modules.list"
for mod in $INITRD_MODULES; do
    # modprobe --show-depends lists the insmods in load order (dependencies first); built-ins print none.
    modprobe -d "$TREE" -S "$KVER" --show-depends "$mod" 2>/dev/null | awk '$1 == "insmod" {print $2}' | while read -r ko; do
        name=$(basename "$ko")
        grep -qx "$name" "$WORK/initrd/modules.list" && continue
        cp "$ko" "$WORK/initrd/lib/modules/$name"
        echo "$name" >>"$WORK/initrd/modules.list"
    done
done
cp scripts/guest/initrd-init.sh "$WORK/initrd/init"
chmod +x "$WORK/initrd/init"
( cd "$WORK/initrd" && find . | cpio -o -H newc --quiet | gzip -1 ) >"$WORK/out/initrd.img"
cp "$WORK/kernel/boot/vmlinuz-$KVER" "$WORK/out/vmlinuz"

log "5/5 root.img (ext4, $(du -sh "$TREE" | cut -f1) of files)"
size_mb=$(( $(du -sm "$TREE" | cut -f1) + 768 ))
mkfs.ext4 -q -L netai-root -d "$TREE" "$WORK/out/root.img" "${size_mb}M"
{ echo "kernel $KVER"; echo "packages $PACKAGES"; echo "requirements"; echo "$REQUIREMENTS"; } >"$WORK/out/inputs.txt"
rm -rf "$OUT"
mv "$WORK/out" "$OUT"
for old in "$CACHE"/*/; do  # older builds
    [ "${old%/}" = "$OUT" ] || [ "${old%/}" = "$WORK" ] || rm -rf "${old%/}"
done
log "built guest $KEY (kernel $KVER) in $(( $(date +%s) - t0 )) s"
echo "$OUT"
