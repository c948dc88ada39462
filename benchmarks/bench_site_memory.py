"""Site servers' memory against the model's size, on loopback (no root, no Mininet).

Real site servers (`tests/site_memory.py`) run the same task eight times, one after another: G, a relay
with three children and three locals, the ``large`` model (about 40 MB), 2 rounds. Every server's
resident set is sampled every 10 ms. Printed, per role: the peak above the server's own memory before
any task, in copies of the model, against the copies admission counts for that role
(`orchestrator.scheduling.memory`); and per server, what each task left behind, in copies.
``--children 1``: the relay serves one local and G the other two; ``--pace-mbps R``: every copy
paced at R, as a link would carry it (by default at loopback's speed, where updates pile up in a
node's queue)::

    python benchmarks/bench_site_memory.py [--hidden 3200] [--rounds 2] [--tasks 8] [--children 3] [--pace-mbps R]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.scheduling import memory as need
from tests.site_memory import relay_tree, run_tasks

COPIES = {"global": need.GLOBAL_COPIES, "local": need.LOCAL_COPIES, "relay": need.RELAY_COPIES}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--hidden", type=int, default=3200, help="the large model's hidden width (3200: ~40 MB)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=8, help="tasks in a row on the same servers")
    parser.add_argument("--pace-mbps", type=float, help="pace every copy at this rate (default: loopback's speed)")
    parser.add_argument("--children", type=int, choices=(1, 3), default=3, help="the relay's children")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="netai-bench-memory-") as d:
        base, model_bytes, tasks = run_tasks(Path(d), [relay_tree(i + 1, args.children) for i in range(args.tasks)],
                                             model="large", model_args={"hidden": args.hidden}, rounds=args.rounds,
                                             pace_mbps=args.pace_mbps)
    mb = 2**20
    print(f"site memory (loopback, large model of {model_bytes / mb:.1f} MB, {args.rounds} rounds, {args.tasks} tasks; "
          f"servers' own memory {min(base.values()) / mb:.0f}-{max(base.values()) / mb:.0f} MB, admission counts "
          f"{need.SERVER_BASE_BYTES / mb:.0f} MB):")
    pace = f"copies paced at {args.pace_mbps:g} Mbit/s" if args.pace_mbps else "copies at loopback's speed"
    print(f"  ({pace}; the relay has {args.children} child{'ren' if args.children > 1 else ''})")
    for role, sites in (("global", ["G"]), ("relay", ["R"]), ("local", ["A", "B", "C"])):
        above = [t.peak_bytes[s] - base[s] for t in tasks for s in sites]
        copies = [a / model_bytes for a in above]
        print(f"  {role}: peak above the server's own {min(copies):.1f}-{max(copies):.1f} copies of the model, "
              f"{min(above) / mb:.0f}-{max(above) / mb:.0f} MB (admission counts {need.ROLE_BASE_BYTES / mb:.0f} MB "
              f"and {COPIES[role]} copies)")
    for s in sorted(base):
        left = " ".join(f"{(t.after_bytes[s] - base[s]) / model_bytes:.1f}" for t in tasks)
        print(f"  {s}: left after each task {left} copies")
    return 0


if __name__ == "__main__":
    sys.exit(main())
