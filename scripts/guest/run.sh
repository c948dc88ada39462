#!/usr/bin/env bash
# Boot the stock-kernel test guest and run one command in it (docs/guest.md).
#
#   scripts/guest/run.sh [options] -- COMMAND [ARG...]
#     --accel auto|kvm|tcg   auto (default): KVM when a short probe boot shows it boots this kernel
#                            (the answer is cached per host kernel, QEMU and guest), else TCG
#     --timeout S            power the guest off after S seconds (default 900); exit status 124
#     --interactive          the command's stdin is the console (e.g. -- bash)
#     --memory MB            guest memory (default 2048)
#
# The guest is built first if needed (scripts/guest/build.sh). The checkout is shared read-only at
# /opt/netai/src (the command runs there, with the guest's venv, NETAI_IN_GUEST=1); the root disk is
# a throwaway snapshot, so every boot starts from the built image. The guest has no network to the
# host: its console (this script's stdout) is the channel. Prints "NETAI-GUEST-ACCEL kvm|tcg" before
# the boot; the guest prints "NETAI-GUEST-EXIT <status>" at the end. Exits with the command's status.
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
CACHE=${NETAI_GUEST_CACHE:-/var/cache/netai-guest}
die() { printf 'scripts/guest/run.sh: %s\n' "$*" >&2; exit 2; }

accel=auto timeout_s=900 interactive=0 memory_mb=2048
while [ $# -gt 0 ]; do
    case "$1" in
        --accel) accel=$2; shift 2 ;;
        --timeout) timeout_s=$2; shift 2 ;;
        --interactive) interactive=1; shift ;;
        --memory) memory_mb=$2; shift 2 ;;
        --) shift; break ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) die "unknown option $1 (the command goes after --)" ;;
    esac
done
[ $# -gt 0 ] || die "no command given (scripts/guest/run.sh -- COMMAND [ARG...])"
case "$accel" in auto|kvm|tcg) ;; *) die "--accel must be auto, kvm or tcg, got $accel" ;; esac
case "$timeout_s" in ''|*[!0-9]*) die "--timeout must be whole seconds, got $timeout_s" ;; esac

GUEST=$(bash scripts/guest/build.sh | tail -n 1)
[ -f "$GUEST/root.img" ] || die "the guest build gave no root.img in $GUEST"
# The share is read-only to the guest, whose processes would each compile the project's modules they
# import (about 30 s of the first one's, under TCG): the byte code is compiled here, for the guest's
# Python (the build's, scripts/guest/build.sh), where the host has that version.
GUEST_PY=python$(sed -n "s/^PYVER=//p" scripts/guest/build.sh)
if command -v "$GUEST_PY" >/dev/null; then bash scripts/compile_sources.sh "$GUEST_PY"; fi
QEMU=qemu-system-x86_64
APPEND="console=ttyS0 quiet loglevel=3 panic=-1"

kvm_boots() {  # a probe boot of the initramfs alone under KVM; answer cached
    [ -w /dev/kvm ] || return 1
    local key file
    key=$( { uname -r; "$QEMU" --version | head -n 1; basename "$GUEST"; } | sha256sum | cut -c1-16)
    file=$CACHE/kvm-probe-$key
    if [ ! -f "$file" ]; then
        if timeout 30 "$QEMU" -accel kvm -cpu host -m 256 -nodefaults -display none -serial stdio -no-reboot \
                -kernel "$GUEST/vmlinuz" -initrd "$GUEST/initrd.img" -append "$APPEND netai.probe=1" \
                </dev/null 2>/dev/null | grep -q "NETAI-GUEST-PROBE ok"; then
            echo kvm >"$file"
        else
            echo tcg >"$file"
        fi
    fi
    [ "$(cat "$file")" = kvm ]
}
if [ "$accel" = auto ]; then
    if kvm_boots; then accel=kvm; else accel=tcg; fi
fi
if [ "$accel" = kvm ]; then
    accel_args=(-accel kvm -cpu host)
else
    accel_args=(-accel tcg,thread=multi -cpu max)
fi

JOB=$(mktemp -d "${TMPDIR:-/var/tmp}/netai-guest-job.XXXXXX")
trap 'rm -rf "$JOB"' EXIT
printf '%s\0' "$@" >"$JOB/argv"
if [ "$interactive" = 1 ]; then : >"$JOB/interactive"; fi
echo "NETAI-GUEST-ACCEL $accel"
set +e
timeout --foreground "$timeout_s" "$QEMU" "${accel_args[@]}" -smp 2 -m "$memory_mb" \
    -nodefaults -display none -serial stdio -no-reboot \
    -kernel "$GUEST/vmlinuz" -initrd "$GUEST/initrd.img" -append "$APPEND" \
    -drive "file=$GUEST/root.img,format=raw,if=virtio,snapshot=on" \
    -virtfs "local,path=$ROOT,mount_tag=netai,security_model=none,readonly=on" \
    -virtfs "local,path=$JOB,mount_tag=job,security_model=none" \
    | tee "$JOB/console.log"
qemu_rc=${PIPESTATUS[0]}
set -e
[ "$qemu_rc" = 124 ] && { echo "scripts/guest/run.sh: the guest ran over ${timeout_s} s" >&2; exit 124; }
status=$(sed -n 's/^NETAI-GUEST-EXIT \([0-9]*\).*/\1/p' "$JOB/console.log" | tail -n 1)
[ -n "$status" ] || { echo "scripts/guest/run.sh: the guest stopped without an exit status (QEMU $qemu_rc)" >&2; exit 125; }
exit "$status"
