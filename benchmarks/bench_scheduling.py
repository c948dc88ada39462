"""Benchmark: how long the schedulers take.

Prints (1) the time to schedule 30 tasks one after another on NSFNET, per scheduler
(target: under 50 ms in total), and (2) the time to schedule one task with 100 local models on
a generated 1000-site topology (target: under 2 s for `mst`). Each figure is also given as a
ratio to its target, measured in this run. ``--quick`` runs a smaller second case.
"""

from __future__ import annotations

import argparse
import time

from orchestrator.scheduling import SCHEDULERS, NetworkState, get_scheduler
from orchestrator.scheduling.tasks import generate_tasks
from topologies.generators import random_connected
from topologies.loaders import load


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="200 sites / 20 locals instead of 1000 / 100")
    args = ap.parse_args()

    nsfnet = load("sndlib/nobel-us")
    print("30 tasks on NSFNET (sndlib/nobel-us), 1..13 locals each, reservations accumulating")
    print(f"{'scheduler':<10}{'total ms':>10}{'per task ms':>13}{'/ 50 ms target':>16}{'blocked':>9}")
    for name in SCHEDULERS:
        tasks = [
            t
            for n in range(1, 14)
            for t in generate_tasks(nsfnet, count=3, locals_per_task=n, seed=n, first_id=100 * n)
        ][:30]
        scheduler = get_scheduler(name)
        state = NetworkState(nsfnet)
        blocked = 0
        t0 = time.perf_counter()
        for task in tasks:
            s = scheduler.schedule(state, task)
            if s.blocked:
                blocked += 1
            else:
                state.admit(s)
        total_ms = (time.perf_counter() - t0) * 1e3
        print(f"{name:<10}{total_ms:>10.2f}{total_ms / len(tasks):>13.3f}{total_ms / 50:>16.3f}{blocked:>9}")

    sites, n_locals = (200, 20) if args.quick else (1000, 100)
    big = random_connected(sites, seed=1)
    task = generate_tasks(big, count=1, locals_per_task=n_locals, seed=1)[0]
    print(f"\none task with {n_locals} locals on a generated {sites}-site topology "
          f"({len(big.links)} links)")
    print(f"{'scheduler':<10}{'seconds':>10}{'/ 2 s target':>14}{'reserved Gbit/s':>17}")
    for name in SCHEDULERS:
        t0 = time.perf_counter()
        s = get_scheduler(name).schedule(NetworkState(big), task)
        dt = time.perf_counter() - t0
        reserved = "blocked" if s.blocked else f"{s.reserved_mbps_total / 1000:.1f}"
        print(f"{name:<10}{dt:>10.3f}{dt / 2:>14.3f}{reserved:>17}")


if __name__ == "__main__":
    main()
