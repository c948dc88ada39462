#!/usr/bin/env bash
# `make test`: set-up, then ruff, mypy, the docs site (strict) and pytest (README, "Tests").
#
# The stock-kernel checks (tests/guest) boot a QEMU guest and take minutes of one core. When the whole
# suite runs and the guest's build is cached, they start first, before the set-up, with the system's
# python3 (tests/guest/driver.py `record`), and the suite adopts their run (NETAI_GUEST_RECORD): the
# guest then overlaps the set-up, the lint, the type check, the unit tests and the other tests that
# need neither root nor Docker (tests/conftest.py). Any exit (an error, Ctrl-C) ends them.
# NETAI_GUEST_EARLY=0 leaves them to the suite (which starts them at collection).
#
# Environment: VENV (default .venv), PYTEST_ARGS (split into words, as make gives them).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTEST_ARGS=${PYTEST_ARGS:-}

record=""
end_record() {
    if [ -n "$record" ]; then
        if [ -f "$record/pid" ]; then kill -TERM "$(cat "$record/pid")" 2>/dev/null || true; fi
        rm -rf "$record"
    fi
}
trap end_record EXIT

if [ -z "$PYTEST_ARGS" ] && [ "${NETAI_GUEST_EARLY:-1}" != 0 ] && [ "$(id -u)" = 0 ] \
        && python3 -m tests.guest.driver can-start-early; then
    record=$(mktemp -d "${TMPDIR:-/tmp}/netai-guest-record.XXXXXX")
    python3 -m tests.guest.driver record "$record" </dev/null >"$record/log" 2>&1 &
    echo $! >"$record/pid"
    export NETAI_GUEST_RECORD=$record
    echo "[test] the stock-kernel checks started in the guest, ahead of the set-up"
fi

bash scripts/provision.sh
# mypy's cache outside the checkout, as root: a fresh checkout's type check then rechecks only the
# files whose contents differ from those of a checkout checked before (mypy compares their hashes)
if [ -z "${MYPY_CACHE_DIR:-}" ] && [ "$(id -u)" = 0 ] && mkdir -p /var/cache/netai-mypy 2>/dev/null \
        && [ -w /var/cache/netai-mypy ]; then
    export MYPY_CACHE_DIR=/var/cache/netai-mypy
fi
make --no-print-directory lint typecheck docs VENV="$VENV"  # the Makefile's own recipes
# shellcheck disable=SC2086
"$VENV/bin/python" -m pytest --durations=25 $PYTEST_ARGS
