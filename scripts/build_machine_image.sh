#!/usr/bin/env bash
# Build the image of a test machine: what a provisioned lab server looks like to the cluster mode,
# minus the distance (docs/cluster.md). No image registry is needed.
#
# From the worker's base image (netai-worker-base: Debian bookworm, Python 3.11 and the worker's
# packages in /opt/venv, torch pinned as workers/docker/requirements.txt pins it), apt-get inside a
# container adds openssh-server, openvswitch-switch, mininet, iproute2, net-tools, ethtool, iperf3;
# the worker's packages are made visible to the system's Python (a .pth file), as a lab server with
# torch installed system-wide; then `docker commit`. The project itself is NOT in the image:
# `netai cluster prepare` ships it.
#
# Usage: scripts/build_machine_image.sh [--if-stale] [--force]
#   --if-stale   do nothing when the image exists with the current input hash (about a second)
#   --force      rebuild even when up to date
# Environment: NETAI_MACHINE_IMAGE (default netai-machine:latest), NETAI_WORKER_IMAGE (its base is
#   ${NETAI_WORKER_IMAGE%%:*}-base:latest, built by scripts/build_worker_image.sh when missing),
#   DEBIAN_MIRROR (default http://deb.debian.org/debian).
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE=${NETAI_MACHINE_IMAGE:-netai-machine:latest}
WORKER_IMAGE=${NETAI_WORKER_IMAGE:-netai-worker:latest}
BASE_IMAGE=${WORKER_IMAGE%%:*}-base:latest
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
LABEL=org.netai.source_hash
PACKAGES=(openssh-server openvswitch-switch mininet iproute2 net-tools ethtool iperf3 iputils-ping procps)
log() { printf '[machine-image] %s\n' "$*"; }
die() { printf 'build_machine_image.sh: %s\n' "$*" >&2; exit 1; }

if_stale=0 force=0
for arg in "$@"; do
    case "$arg" in
        --if-stale) if_stale=1 ;;
        --force) force=1 ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) die "unknown argument $arg (use --if-stale or --force)" ;;
    esac
done

command -v docker >/dev/null || die "the docker client is not installed"
docker info >/dev/null 2>&1 || die "no Docker daemon answers (start it: sudo make setup)"

image_label() { docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null || true; }
if [ -z "$(image_label "$BASE_IMAGE")" ]; then
    log "no $BASE_IMAGE yet: building the worker image first"
    bash scripts/build_worker_image.sh --if-stale
fi
hash=$( { image_label "$BASE_IMAGE"; cat scripts/build_machine_image.sh; echo "$MIRROR"; } | sha256sum | cut -c1-16)
if [ "$force" = 0 ] && [ "$if_stale" = 1 ] && [ "$(image_label "$IMAGE")" = "$hash" ]; then
    log "$IMAGE is up to date (hash $hash)"
    exit 0
fi
t_start=$(date +%s)
old_id=$(docker image inspect -f '{{ .Id }}' "$IMAGE" 2>/dev/null || true)
name=netai-machine-build-$$
cleanup() { docker rm -f "$name" >/dev/null 2>&1 || true; }
trap cleanup EXIT
# The build container is on Docker's default network (the mirror must be reachable); the machines
# a test starts from the image are on an internal network only.
site=/opt/venv/lib/python3.11/site-packages
log "apt-get install ${PACKAGES[*]} (a few minutes)"
docker run --name "$name" --env DEBIAN_FRONTEND=noninteractive --env MIRROR="$MIRROR" --env SITE="$site" \
    "$BASE_IMAGE" sh -euc '
        echo "deb $MIRROR bookworm main" > /etc/apt/sources.list
        apt-get update -q
        apt-get install -q -y --no-install-recommends "$@"
        rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
        # the worker packages, system-wide for the system Python (a venv made with
        # --system-site-packages sees them); not the /opt/netai/src of the worker image
        rm -f "$SITE/netai.pth"
        mkdir -p /usr/local/lib/python3.11/dist-packages
        echo "$SITE" > /usr/local/lib/python3.11/dist-packages/netai-machine-packages.pth
        rm -f /etc/ssh/ssh_host_*
        mkdir -p /run/sshd
        /usr/bin/python3 -c "import torch, numpy, yaml, networkx, safetensors, sklearn"
    ' sh "${PACKAGES[@]}" > /tmp/$name.log 2>&1 || { tail -n 30 "/tmp/$name.log" >&2; die "the package install failed"; }
rm -f "/tmp/$name.log"
docker commit \
    --change "LABEL $LABEL=$hash" \
    --change "LABEL org.netai.role=machine" \
    --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    --change 'CMD ["sleep", "infinity"]' \
    "$name" "$IMAGE" >/dev/null
docker run --rm --network none "$IMAGE" sh -c 'command -v sshd ovs-vswitchd mnexec iperf3 tc ethtool >/dev/null' \
    || die "the built image lacks a tool"
new_id=$(docker image inspect -f '{{ .Id }}' "$IMAGE")
if [ -n "$old_id" ] && [ "$old_id" != "$new_id" ]; then docker rmi "$old_id" >/dev/null 2>&1 || true; fi
log "built $IMAGE (hash $hash) in $(( $(date +%s) - t_start )) s"
