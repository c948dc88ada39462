#!/usr/bin/env bash
# `make test`: set-up, then ruff, mypy, the docs site (strict) and pytest (README, "Tests").
#
# The stock-kernel checks (tests/guest) boot a QEMU guest and take minutes of one core. When the whole
# suite runs and the guest's build is cached, they start first, before the set-up, with the system's
# python3 (tests/guest/driver.py `record`), and the suite adopts their run (NETAI_GUEST_RECORD): the
# guest then overlaps the set-up, the lint and the type check. Any exit (an error, Ctrl-C) ends them.
# NETAI_GUEST_EARLY=0 leaves them to the suite (which starts them at collection).
#
# As root, the whole suite runs as two pytest sessions at once (tests/conftest.py, NETAI_SUITE_PART):
# the rest as before, and beside it, once the guest's checks are done, the part that needs no network
# of this host's (the unit tests, and the integration tests marked neither root nor docker: the
# simulation's) at idle CPU priority (SCHED_IDLE), in the CPU the emulation leaves (its tests wait on
# emulated time and links: about 60 % of two cores was idle while they ran). The part beside prints
# its output after the rest's; `make test` fails if either fails, and any exit ends both.
# NETAI_SUITE_BESIDE=0 runs one session instead.
#
# Environment: VENV (default .venv), PYTEST_ARGS (split into words, as make gives them).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTEST_ARGS=${PYTEST_ARGS:-}

record=""
beside=""
beside_pid=""
end_all() {
    if [ -n "$beside_pid" ]; then  # its own process group (setsid): its servers and runs end with it
        kill -TERM -- "-$beside_pid" 2>/dev/null || true
        for _ in $(seq 1 100); do kill -0 "$beside_pid" 2>/dev/null || break; sleep 0.1; done  # 10 s at most
        kill -KILL -- "-$beside_pid" 2>/dev/null || true
    fi
    if [ -n "$beside" ]; then rm -rf "$beside"; fi
    if [ -n "$record" ]; then
        if [ -f "$record/pid" ]; then kill -TERM "$(cat "$record/pid")" 2>/dev/null || true; fi
        rm -rf "$record"
    fi
}
trap end_all EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -z "$PYTEST_ARGS" ] && [ "${NETAI_GUEST_EARLY:-1}" != 0 ] && [ "$(id -u)" = 0 ] \
        && python3 -m tests.guest.driver can-start-early; then
    record=$(mktemp -d "${TMPDIR:-/tmp}/netai-guest-record.XXXXXX")
    python3 -m tests.guest.driver record "$record" </dev/null >"$record/log" 2>&1 &
    echo $! >"$record/pid"
    export NETAI_GUEST_RECORD=$record
    echo "[test] the stock-kernel checks started in the guest, ahead of the set-up"
fi

bash scripts/provision.sh
make --no-print-directory lint typecheck docs VENV="$VENV"  # the Makefile's own recipes

if [ -z "$PYTEST_ARGS" ] && [ "${NETAI_SUITE_BESIDE:-1}" != 0 ] && [ "$(id -u)" = 0 ] \
        && command -v setsid >/dev/null && command -v chrt >/dev/null; then
    beside=$(mktemp -d "${TMPDIR:-/tmp}/netai-suite-beside.XXXXXX")
    guest_pid=""
    if [ -n "$record" ] && [ -f "$record/pid" ]; then guest_pid=$(cat "$record/pid"); fi
    # It starts once the guest's checks are done: even at idle priority it would slow them (the rest
    # waits for them), and the rest's own tests leave it more CPU than it needs.
    NETAI_SUITE_PART=beside NETAI_GUEST_EARLY=0 GUEST_PID=$guest_pid setsid bash -c '
        while [ -n "$GUEST_PID" ] && kill -0 "$GUEST_PID" 2>/dev/null; do sleep 1; done
        exec chrt --idle 0 "$0" -m pytest --durations=25 -p no:cacheprovider --basetemp "$1/tmp"' \
        "$VENV/bin/python" "$beside" </dev/null >"$beside/log" 2>&1 &
    beside_pid=$!
    export NETAI_SUITE_PART=main
    echo "[test] the unit tests and the simulation's run beside the rest at idle CPU priority (once the guest's" \
        "checks are done); their output follows the rest's"
fi
status=0
# shellcheck disable=SC2086
"$VENV/bin/python" -m pytest --durations=25 $PYTEST_ARGS || status=$?
if [ -n "$beside_pid" ]; then
    beside_status=0
    wait "$beside_pid" || beside_status=$?
    beside_pid=""
    echo "[test] the part run beside the rest (the unit tests and the simulation's), exit status $beside_status:"
    cat "$beside/log"
    if [ "$status" = 0 ]; then status=$beside_status; fi
fi
exit "$status"
