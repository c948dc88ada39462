#!/usr/bin/env bash
# Build the FL worker image without an image registry (see PLATFORM.md).
#
# Two layers, each rebuilt only when its own inputs change:
#   1. the base image  netai-worker-base:latest  a debootstrap --variant=minbase bookworm root file
#      system with python3, net-tools and ethtool (Mininet configures interfaces with them) and a venv
#      at /opt/venv holding workers/docker/requirements.txt, installed by the host's pip (--target) so
#      that the host's pip configuration (find-links, extra index, CA bundle) applies unchanged; then
#      `tar -C rootfs -c . | docker import`.
#   2. the worker image netai-worker:latest: the base plus the project's packages in /opt/netai/src
#      (docker create + docker cp + docker commit: no registry, no Dockerfile build needed).
# Each image records the hash of its inputs in a label (org.netai.source_hash).
#
# Usage: scripts/build_worker_image.sh [--if-stale] [--force]
#   --if-stale   do nothing when the worker image exists with the current source hash (the default
#                of provision.sh; takes about a second when nothing changed)
#   --force      rebuild both layers
# Environment: NETAI_IMAGE_BUILD (auto: rootfs when the venv's Python is 3.11 and debootstrap exists,
#   else dockerfile, i.e. `docker build -f workers/docker/Dockerfile`, which needs a registry),
#   NETAI_WORKER_IMAGE (default netai-worker:latest), NETAI_BUILD_DIR (scratch space,
#   default /var/tmp/netai-worker-build), DEBIAN_MIRROR (default http://deb.debian.org/debian),
#   VENV (the project's venv whose pip installs into the image; default .venv).
# Hosts with a registry can use workers/docker/Dockerfile instead.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
IMAGE=${NETAI_WORKER_IMAGE:-netai-worker:latest}
BASE_IMAGE=${IMAGE%%:*}-base:latest
BUILD_DIR=${NETAI_BUILD_DIR:-/var/tmp/netai-worker-build}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
VENV=${VENV:-$ROOT/.venv}
PYVER=3.11
LABEL=org.netai.source_hash
log() { printf '[worker-image] %s\n' "$*"; }
die() { printf 'build_worker_image.sh: %s\n' "$*" >&2; exit 1; }

if_stale=0 force=0
for arg in "$@"; do
    case "$arg" in
        --if-stale) if_stale=1 ;;
        --force) force=1 ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) die "unknown argument $arg (use --if-stale or --force)" ;;
    esac
done

command -v docker >/dev/null || die "the docker client is not installed"
docker info >/dev/null 2>&1 || die "no Docker daemon answers (start it: sudo make setup)"

# Inputs of each layer. The base depends on this script and the requirements; the worker image on
# the base hash and every source file of the project's packages (sorted, content-hashed).
base_hash=$(cat scripts/build_worker_image.sh workers/docker/requirements.txt workers/docker/Dockerfile | sha256sum | cut -c1-16)
src_files() {
    find topologies orchestrator workers -type f \( -name '*.py' -o -name '*.yaml' -o -name '*.txt' \) \
        -not -path '*/__pycache__/*' | LC_ALL=C sort
}
src_hash=$( { echo "$base_hash"; src_files | while read -r f; do echo "$f"; sha256sum < "$f"; done; } \
    | sha256sum | cut -c1-16)

image_label() {  # image -> its source hash label, or nothing
    docker image inspect -f "{{ index .Config.Labels \"$LABEL\" }}" "$1" 2>/dev/null || true
}

if [ "$if_stale" = 1 ] && [ "$force" = 0 ] && [ "$(image_label "$IMAGE")" = "$src_hash" ]; then
    log "$IMAGE is up to date (source hash $src_hash)"
    exit 0
fi
t_start=$(date +%s)
image_id() { docker image inspect -f '{{ .Id }}' "$1" 2>/dev/null || true; }
old_ids="$(image_id "$IMAGE") $(image_id "$BASE_IMAGE")"

# The rootfs recipe needs the host's Python to match the image's (bookworm: 3.11), since the host's
# pip fills the image's venv. Elsewhere (e.g. an Ubuntu VM, which has a registry) use the Dockerfile.
mode=${NETAI_IMAGE_BUILD:-auto}
if [ "$mode" = auto ]; then
    mode=dockerfile
    if command -v debootstrap >/dev/null && [ -x "$VENV/bin/python" ] \
            && [ "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = "$PYVER" ]; then
        mode=rootfs
    fi
fi
if [ "$mode" = dockerfile ]; then
    log "building $IMAGE from workers/docker/Dockerfile (needs an image registry)"
    docker build -q -f workers/docker/Dockerfile --label "$LABEL=$src_hash" -t "$IMAGE" . >/dev/null \
        || die "docker build failed (no registry? then build with Python $PYVER and debootstrap: NETAI_IMAGE_BUILD=rootfs)"
    log "built $IMAGE (source hash $src_hash) in $(( $(date +%s) - t_start )) s"
    exit 0
fi
[ "$mode" = rootfs ] || die "NETAI_IMAGE_BUILD must be auto, rootfs or dockerfile, got $mode"

# -- 1. base image -----------------------------------------------------------------------------
if [ "$force" = 1 ] || [ "$(image_label "$BASE_IMAGE")" != "$base_hash" ]; then
    [ "$(id -u)" = 0 ] || die "building the base image needs root (debootstrap, chroot)"
    command -v debootstrap >/dev/null || die "debootstrap is not installed (sudo make setup)"
    [ -x "$VENV/bin/python" ] || die "no venv at $VENV: its pip installs into the image (sudo make setup)"
    rootfs=$BUILD_DIR/rootfs
    mkdir -p "$BUILD_DIR"
    rm -rf "$rootfs"
    log "1/4 debootstrap --variant=minbase bookworm (about a minute)"
    debootstrap --variant=minbase \
        --include=python3,python3-venv,net-tools,ethtool,iproute2,iputils-ping,procps,ca-certificates \
        bookworm "$rootfs" "$MIRROR" > "$BUILD_DIR/debootstrap.log" 2>&1 \
        || { tail -n 20 "$BUILD_DIR/debootstrap.log" >&2; die "debootstrap failed (log: $BUILD_DIR/debootstrap.log)"; }
    log "2/4 venv /opt/venv and the worker's Python packages (host pip, --target)"
    chroot "$rootfs" /usr/bin/python3 -m venv --without-pip /opt/venv
    site=$rootfs/opt/venv/lib/python$PYVER/site-packages
    [ -d "$site" ] || die "the image's venv has no $site (is the image's Python $PYVER?)"
    # The host's pip reads the host's pip config (find-links, extra index, CA bundle); the image's
    # Python is the same minor version and platform, so the wheels match.
    "$VENV/bin/python" -m pip install -q --no-warn-script-location --target "$site" \
        -r workers/docker/requirements.txt > "$BUILD_DIR/pip.log" 2>&1 \
        || { grep -v 'is ignored' "$BUILD_DIR/pip.log" | tail -n 20 >&2; die "pip could not install the worker's packages"; }
    # What the worker never uses at run time: C++ headers and top-level test suites (byte-code
    # caches stay: without them every agent would compile torch at start-up).
    rm -rf "$site/torch/include" "$site"/*/tests "$site"/*/test
    echo /opt/netai/src > "$site/netai.pth"
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/locale/*
    mkdir -p "$rootfs/opt/netai/src"
    log "3/4 docker import ($(du -sh "$rootfs" | cut -f1) root file system)"
    tar -C "$rootfs" -c . | docker import \
        --change "ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
        --change "ENV PYTHONUNBUFFERED=1" \
        --change "ENV OMP_NUM_THREADS=1" \
        --change "WORKDIR /" \
        --change "LABEL $LABEL=$base_hash" \
        - "$BASE_IMAGE" >/dev/null
    rm -rf "$rootfs"
else
    log "1-3/4 base image $BASE_IMAGE is up to date (hash $base_hash)"
fi

# -- 2. the project's code on top ---------------------------------------------------------------
log "4/4 project code -> $IMAGE"
ctx=$(mktemp -d "${TMPDIR:-/var/tmp}/netai-src.XXXXXX")
cid=""
cleanup() { rm -rf "$ctx"; if [ -n "$cid" ]; then docker rm -f "$cid" >/dev/null 2>&1 || true; fi; }
trap cleanup EXIT
mkdir -p "$ctx/src"
src_files | while read -r f; do mkdir -p "$ctx/src/$(dirname "$f")"; cp "$f" "$ctx/src/$f"; done
cid=$(docker create "$BASE_IMAGE" /bin/true)
docker cp "$ctx/src/." "$cid:/opt/netai/src" >/dev/null
docker commit \
    --change "LABEL $LABEL=$src_hash" \
    --change "LABEL org.netai.role=worker" \
    --change 'CMD ["python", "-m", "workers.agent", "--help"]' \
    "$cid" "$IMAGE" >/dev/null
docker run --rm --network none "$IMAGE" python -c "import torch, safetensors, sklearn, workers" \
    || die "the built image cannot import the worker's packages"
# The images this build replaced, now untagged: remove them (refused, harmlessly, while in use).
for id in $old_ids; do
    if [ "$id" != "$(image_id "$IMAGE")" ] && [ "$id" != "$(image_id "$BASE_IMAGE")" ]; then
        docker rmi "$id" >/dev/null 2>&1 || true
    fi
done
log "built $IMAGE (source hash $src_hash) in $(( $(date +%s) - t_start )) s"
