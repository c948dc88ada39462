#!/usr/bin/env bash
# The time of `make test` from a fresh clone, revision against revision, on this machine.
#
#   sudo scripts/suite_time.sh [--pairs N] BASE [HEAD]      (HEAD defaults to HEAD)
#
# A time target such as "make test takes no longer than it did at BASE" only means something on one
# machine: one revision's suite took 918 s when it was new and 1668 s on a two-core host
# later. This runs CI's command (`CI=true bash .ci/run`, the README's `make test`, set-up included)
# on a fresh clone of each revision, N pairs alternating BASE, HEAD, HEAD, BASE, ... so that drift
# in the machine's load falls on both alike, and prints each run's seconds and outcome (each run's
# output is kept as $TMPDIR/netai-suite-time-LABEL-N.log, until the next invocation writes over it:
# its slowest tests say where a difference lies), then the medians and the paired ratios HEAD / BASE.
# A run whose suite fails is timed and paired all the same (an old base may fail tests its successors
# fixed), and named at the end; the script then exits 1.
#
# Each run gets the machine as CI does: the Docker images the suite builds are put back as they
# were before every run (a revision's worker image must not be taken over by the next), and the
# guest's build cache and pip's cache stay warm, as on CI. Run as root with nothing else emulating;
# it takes as long as the 2N suites (each about 15-30 minutes on a two-core host).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

pairs=1
if [ "${1:-}" = "--pairs" ]; then pairs=$2; shift 2; fi
if [ $# -lt 1 ] || [ $# -gt 2 ] || ! [[ "$pairs" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [--pairs N] BASE [HEAD]" >&2
    exit 2
fi
if [ "$(id -u)" != 0 ]; then echo "$0: run as root (the suite's integration tests need it)" >&2; exit 2; fi
base=$(git -C "$ROOT" rev-parse --verify --quiet "$1^{commit}") || { echo "$0: unknown revision: $1" >&2; exit 2; }
head=$(git -C "$ROOT" rev-parse --verify --quiet "${2:-HEAD}^{commit}") \
    || { echo "$0: unknown revision: ${2:-HEAD}" >&2; exit 2; }

IMAGES=(netai-worker netai-worker-base netai-machine)
KEEP=netai-suite-time-keep
work=$(mktemp -d "${TMPDIR:-/tmp}/netai-suite-time.XXXXXX")
restore_images() {
    local image
    for image in "${IMAGES[@]}"; do
        if docker image inspect "$image:$KEEP" >/dev/null 2>&1; then
            docker tag "$image:$KEEP" "$image:latest"
        fi
    done
}
finish() {
    restore_images
    for image in "${IMAGES[@]}"; do docker rmi "$image:$KEEP" >/dev/null 2>&1 || true; done
    rm -rf "$work"
}
trap finish EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
for image in "${IMAGES[@]}"; do
    if docker image inspect "$image:latest" >/dev/null 2>&1; then docker tag "$image:latest" "$image:$KEEP"; fi
done

declare -A times
one_run() {  # one_run LABEL REV INDEX: a fresh clone of REV, CI's command, its seconds into times
    local label=$1 rev=$2 i=$3 clone="$work/clone" log="$work/$1-$3.log" t0 t1 status
    rm -rf "$clone"
    git clone -q "$ROOT" "$clone"
    git -C "$clone" checkout -q "$rev"
    restore_images
    t0=$(date +%s.%N)
    status=0
    (cd "$clone" && CI=true bash .ci/run) >"$log" 2>&1 </dev/null || status=$?
    t1=$(date +%s.%N)
    times[$label-$i]=$(python3 -c 'import sys; print(f"{float(sys.argv[2]) - float(sys.argv[1]):.1f}")' "$t0" "$t1")
    cp "$log" "${TMPDIR:-/tmp}/netai-suite-time-$label-$i.log"  # kept: its slowest tests explain a ratio
    echo "[suite-time] $label ${rev:0:10} run $i: ${times[$label-$i]} s, exit status $status ($(grep -Eo \
        '[0-9]+ (passed|failed)[^=]*in [0-9.]+s' "$log" | tail -1 || true)); its output: \
${TMPDIR:-/tmp}/netai-suite-time-$label-$i.log"
    if [ "$status" != 0 ]; then  # still paired: a revision whose suite fails (an old base) is timed all the same
        failed+=("$label run $i")
    fi
}
failed=()

for i in $(seq 1 "$pairs"); do
    if [ $((i % 2)) = 1 ]; then one_run base "$base" "$i"; one_run head "$head" "$i"
    else one_run head "$head" "$i"; one_run base "$base" "$i"; fi
done

args=()
for i in $(seq 1 "$pairs"); do args+=("${times[base-$i]}" "${times[head-$i]}"); done
python3 - "${args[@]}" <<'EOF'
import statistics
import sys

base = [float(x) for x in sys.argv[1::2]]
head = [float(x) for x in sys.argv[2::2]]
ratios = [h / b for h, b in zip(head, base, strict=True)]
print(f"[suite-time] median seconds: base {statistics.median(base):.1f}, head {statistics.median(head):.1f}; "
      f"head / base per pair: {', '.join(f'{r:.3f}' for r in ratios)} (median {statistics.median(ratios):.3f})")
EOF
if [ ${#failed[@]} -gt 0 ]; then
    echo "[suite-time] failed: ${failed[*]} (a failed run's time is its own: a test that fails may end early," \
        "or wait out its timeout; its output says which)"
    exit 1
fi
