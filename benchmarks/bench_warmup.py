"""A site server's warm-up (`workers.site_server.warm`) with the training's own optimizer
(`workers.sgd.SGD`) against ``torch.optim.SGD``, whose constructor and ``step`` import torch's compiler
stack (``torch._dynamo``: sympy, inductor).

Each sample starts N fresh Python processes at once, as an emulation's worker containers start their
servers together, each importing torch and warming up; it records the wall time until all ended and
their summed CPU time. The two variants alternate within each pair, and the paired ratios
(``workers.sgd`` / ``torch.optim``) are printed: the machine is shared, so compare within a pair, not
across runs. No root, no Mininet::

    python benchmarks/bench_warmup.py [--at-once 4] [--pairs 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: A site server's warm-up (`workers.site_server.warm`, one torch thread), with the optimizer named by argv[1].
_WARM = """
import sys
import torch
import workers.learning
import workers.site_server
if sys.argv[1] == "torch.optim":
    workers.learning.SGD = torch.optim.SGD
workers.site_server.warm(1)
"""


def sample(at_once: int, variant: str) -> tuple[float, float]:
    """(wall seconds until all `at_once` processes ended, their summed CPU seconds)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-c", _WARM, variant], cwd=ROOT, env=env) for _ in range(at_once)]
    statuses = [p.wait() for p in procs]
    wall = time.monotonic() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the children reaped since `before`: these
    if any(statuses):
        raise RuntimeError(f"the {variant} warm-up exited with status {max(statuses, key=abs)}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(values: list[float]) -> str:
    """``median [lowest, highest]`` of `values`, to three decimals."""
    return f"{statistics.median(values):.3f} [{min(values):.3f}, {max(values):.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--at-once", type=int, default=4, help="processes warming up together")
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    if args.at_once < 1 or args.pairs < 1:
        parser.error("--at-once and --pairs must be at least 1")
    ours, theirs = "workers.sgd", "torch.optim"
    walls: dict[str, list[float]] = {ours: [], theirs: []}
    cpus: dict[str, list[float]] = {ours: [], theirs: []}
    for i in range(args.pairs):
        got = {}
        for variant in ((ours, theirs) if i % 2 == 0 else (theirs, ours)):  # alternate which goes first
            got[variant] = sample(args.at_once, variant)
            walls[variant].append(got[variant][0])
            cpus[variant].append(got[variant][1])
        print(f"pair {i + 1}: {ours} {got[ours][0]:.2f} s wall, {got[ours][1]:.2f} s CPU; {theirs} "
              f"{got[theirs][0]:.2f} s wall, {got[theirs][1]:.2f} s CPU", flush=True)
    print(f"{args.at_once} warm-ups at once: wall median {ours} {statistics.median(walls[ours]):.2f} s, {theirs} "
          f"{statistics.median(walls[theirs]):.2f} s; CPU per process median {ours} "
          f"{statistics.median(cpus[ours]) / args.at_once:.2f} s, {theirs} {statistics.median(cpus[theirs]) / args.at_once:.2f} s")
    wall_ratios = [a / b for a, b in zip(walls[ours], walls[theirs], strict=True)]  # pair by pair
    cpu_ratios = [a / b for a, b in zip(cpus[ours], cpus[theirs], strict=True)]
    print(f"{ours} / {theirs} (paired): wall median {spread(wall_ratios)}, CPU median {spread(cpu_ratios)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
