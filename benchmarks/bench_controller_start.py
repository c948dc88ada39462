"""The controller's start: launched to its first ``/health`` answer, as every run's bring-up waits for it.

Starts the project's controller (``osken-manager controller.app``, `ControllerProcess`) for a plan
with no switch connected (no root, no Mininet), as the runs start it (eventlet's own resolver left
out, `controller_process.CONTROLLER_ENV`) and with eventlet's resolver loaded, alternating, and
prints each pair, the medians, and the paired ratio as-run / with-resolver (the machine is shared:
compare within a pair, not across runs)::

    python benchmarks/bench_controller_start.py [--topology sndlib/nobel-us] [--pairs 8]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pairs import alternating, summary
from orchestrator.emulation.controller_process import ControllerProcess
from topologies.loaders import load
from topologies.plan import EmulationPlan

#: The environment that loads eventlet's resolver again (what the runs' controller leaves out).
WITH_RESOLVER = {"EVENTLET_NO_GREENDNS": "no"}


def start_once(plan: EmulationPlan, env: dict[str, str]) -> float:
    """Seconds from the controller's launch to its first ``/health`` answer; it is stopped after."""
    with tempfile.TemporaryDirectory(prefix="netai-bench-controller-") as d:
        controller = ControllerProcess(plan, Path(d), env=env)
        t0 = time.monotonic()
        controller.start()
        try:
            controller.wait_ready(60.0)
            return time.monotonic() - t0
        finally:
            controller.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--topology", default="sndlib/nobel-us")
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    plan = EmulationPlan.from_model(load(args.topology))
    times = alternating(args.pairs, lambda: start_once(plan, {}), lambda: start_once(plan, WITH_RESOLVER),
                        lambda i, a, b: print(f"pair {i}: as run {a:.3f} s, with the resolver {b:.3f} s, "
                                              f"ratio {a / b:.3f}", flush=True))
    print(f"controller for {args.topology} up to /health: {summary('as run', 'with the resolver', *times, digits=3)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
