"""Benchmark: the exact optimum (ILP, HiGHS) on NSFNET, and how far the heuristics are from it.

Prints (1) the ILP's solve time for one task on NSFNET (sndlib/nobel-us, empty network) at 4, 8
and 12 locals, over several seeded tasks: mean and largest wall time (building the model and
solving it), how many solves proved
optimality within the time limit, and the largest time as a ratio to the 60 s target (the target
is set for 8 locals); the same with half the sites without compute (switch-only sites make
copies that cannot branch, and candidate paths through them); and (2) each heuristic's mean
ratio of reserved bandwidth to the optimum's, and to the Pareto front's at its own chain latency,
over 30 tasks one after another with reservations accumulating (`netai compare --optimum`).
``--quick`` uses fewer tasks. No emulation, no root.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.cli.topo import compare
from orchestrator.scheduling import SCHEDULERS, NetworkState
from orchestrator.scheduling.ilp import solve_optimum
from orchestrator.scheduling.tasks import generate_tasks
from topologies.loaders import load, with_compute_sites
from topologies.model import NetworkModel

TARGET_S = 60.0
LOCALS = (4, 8, 12)


def solve_times(model: NetworkModel, locals_range: tuple[int, ...], count: int, time_limit_s: float) -> None:
    print(f"{'locals':>6}{'tasks':>7}{'mean s':>9}{'max s':>9}{'/ 60 s':>8}{'proven':>8}"
          f"{'columns':>9}{'rows':>7}{'optimum Gbit/s':>16}")
    for n in locals_range:
        if n > len(model.compute_sites) - 1:
            continue
        times, proven, optimum = [], 0, []
        cols = rows = 0
        for task in generate_tasks(model, count=count, locals_per_task=n, seed=n):
            t0 = time.perf_counter()
            r = solve_optimum(NetworkState(model), task, time_limit_s=time_limit_s)
            times.append(time.perf_counter() - t0)  # building the model included
            proven += r.proven_optimal
            cols, rows = r.variables, r.constraints
            if r.objective_mbps is not None:
                optimum.append(r.objective_mbps / 1000)
        opt = f"{statistics.fmean(optimum):.1f}" if optimum else "-"
        print(f"{n:>6}{count:>7}{statistics.fmean(times):>9.3f}{max(times):>9.3f}{max(times) / TARGET_S:>8.4f}"
              f"{proven:>5}/{count:<2}{cols:>9}{rows:>7}{opt:>16}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="3 tasks per size and 5 compared tasks instead of 10 and 30")
    ap.add_argument("--time-limit", type=float, default=TARGET_S, help="HiGHS's time limit per solve, seconds")
    args = ap.parse_args()
    count, tasks = (3, 5) if args.quick else (10, 30)

    nsfnet = load("sndlib/nobel-us")
    print(f"one task on NSFNET ({len(nsfnet.sites)} sites, {len(nsfnet.links)} links, all with compute), "
          f"empty network, time limit {args.time_limit:g} s")
    solve_times(nsfnet, LOCALS, count, args.time_limit)
    half = with_compute_sites(nsfnet, list(nsfnet.sites)[::2])
    print(f"\nthe same with {len(half.compute_sites)} of the {len(half.sites)} sites with compute "
          "(the others only switch)")
    solve_times(half, (2, 4, 6), count, args.time_limit)

    print(f"\n{tasks} tasks per size on NSFNET one after another (reservations accumulating): each "
          "heuristic's reserved bandwidth over the optimum's, and over the Pareto front's at its own "
          "chain latency (1 = on the front), mean over admitted tasks")
    names = list(SCHEDULERS)
    rows = compare(nsfnet, schedulers=names, locals_range=list(LOCALS), tasks=tasks, seed=0,
                   demand_mbps=1000.0, model_bytes=10_000_000, optimum=True, time_limit_s=args.time_limit)
    by = {(r["scheduler"], r["locals"]): r for r in rows}
    print(f"{'scheduler':<10}" + "".join(f"{f'{n} x opt':>10}{f'{n} x front':>12}{'blocked':>8}" for n in LOCALS)
          + f"{'unproven':>10}")
    for name in names:
        line = f"{name:<10}"
        unproven = 0
        for n in LOCALS:
            r = by[(name, n)]
            unproven += r["tasks"] - r["blocked"] - r["optimum_proven"]
            opt = "-" if r["optimum_ratio_mean"] is None else f"{r['optimum_ratio_mean']:.3f}"
            front = "-" if r["front_ratio_mean"] is None else f"{r['front_ratio_mean']:.3f}"
            line += f"{opt:>10}{front:>12}{r['blocked']:>8}"
        print(line + f"{unproven:>10}")


if __name__ == "__main__":
    main()
