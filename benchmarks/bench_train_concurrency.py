"""Benchmark: the wall time of N concurrent trainings against their CPU time, with no network at all.

N processes (default 8, quick.yaml's and small.yaml's locals), each a `workers.learning.Learner` of the
default mlp on its part of the data (1 of N), train in a loop under a priority scheme
(`workers.priority.SCHEMES`: ``network-first`` puts training under SCHED_IDLE, as the site servers
do); after three warm-up passes they start together and each times 30 passes. Printed: the median over
processes of each one's median pass, in wall time and in CPU time, and their ratio against N over the
host's cores (what a CPU-bound pass would take with N sharing the cores).

This is the floor under a modelled training on this host, without the relays, the datapath or the
containers: a faithful K needs a training's wall time under its modelled time times K
(docs/fidelity.md). Run it alone: ``.venv/bin/python benchmarks/bench_train_concurrency.py [N]
[--scheme S]``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PASSES, WARMUP = 30, 3


def worker(i: int, n: int, scheme: str, q: Any, start: Any) -> None:
    import torch

    from workers import priority
    from workers.config import AgentConfig
    from workers.learning import Learner, tune_process

    priority.use(scheme)
    tune_process()
    torch.set_num_threads(1)
    cfg = AgentConfig(task=1, site=f"s{i}", host="127.0.0.1", broadcast_port=0, upload_port=0, rounds=1,
                      num_parts=n, part_index=i, local_epochs=1)
    learner = Learner(cfg)
    for _ in range(WARMUP):
        learner.train()
    start.wait()
    walls, cpus = [], []
    for _ in range(PASSES):
        t0, c0 = time.perf_counter(), time.process_time()
        learner.train()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    q.put((statistics.median(walls), statistics.median(cpus)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=8, help="concurrent trainings (default 8)")
    parser.add_argument("--scheme", default="network-first", help="priority scheme (workers.priority.SCHEMES)")
    args = parser.parse_args(argv)
    from workers.priority import SCHEMES

    if args.n < 1 or args.scheme not in SCHEMES:
        print(f"bench_train_concurrency: N >= 1 and a scheme of {', '.join(SCHEMES)}", file=sys.stderr)
        return 2
    q: Any = mp.Queue()
    start = mp.Event()
    procs = [mp.Process(target=worker, args=(i, args.n, args.scheme, q, start)) for i in range(args.n)]
    for p in procs:
        p.start()
    try:
        time.sleep(8)  # every process built and warmed up (bounded: the warm-up takes about 2 s)
        start.set()
        got = [q.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    wall, cpu = statistics.median(g[0] for g in got), statistics.median(g[1] for g in got)
    cores = os.cpu_count() or 1
    share = max(1.0, args.n / cores)
    print(f"{args.n} concurrent trainings of the default mlp ({args.scheme}), {cores} cores: median pass "
          f"{wall * 1e3:.2f} ms wall, {cpu * 1e3:.2f} ms CPU; wall / (CPU x N / cores) = {wall / (cpu * share):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
