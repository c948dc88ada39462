"""Child process for teardown tests: bring a topology up, say so, and wait for a signal.

Usage: python bringup_child.py TOPOLOGY. Prints one JSON line ``{"run_id", "controller_pid"}``
once the network is up, then waits; SIGTERM/SIGINT must tear everything down, SIGKILL leaves the
run for `netai clean`.
"""

from __future__ import annotations

import json
import signal
import sys

from orchestrator.emulation.network import Emulation
from topologies.loaders import load
from topologies.plan import EmulationPlan


def main() -> int:
    # Behave like a program started from a terminal even if an ancestor ignored SIGINT (a shell's
    # background job does), so that the Ctrl-C test means the same everywhere.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    plan = EmulationPlan.from_model(load(sys.argv[1]))
    with Emulation(plan) as emu:
        assert emu.controller is not None
        print(json.dumps({"run_id": emu.run_id, "controller_pid": emu.controller.pid}), flush=True)
        while True:
            signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
