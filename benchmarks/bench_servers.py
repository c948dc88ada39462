"""Site-server and online figures, measured in one run of each experiment on this machine.

- start overhead: per task at 8 locals, admission to G's first broadcast byte (``tasks.start_overhead_s``),
  median, from ``experiments/quick.yaml``;
- useful time: time in rounds over the run's wall time after bring-up, ``quick.yaml``;
- online: ``experiments/online.yaml`` (30 tasks, Poisson arrivals, spff and mst): per scheduler the
  tasks done, the blocking ratio, the mean round latency, the most tasks running at once and the
  machine's peak memory in use;
- paper scale (``--paper``, about 35 minutes): ``experiments/paper.yaml``'s wall time.

Usage: ``sudo .venv/bin/python benchmarks/bench_servers.py [--paper] [--only quick,online]``, or
``--from RUN_DIR ...`` to print the figures of runs already made. Runs one Mininet at a time.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.results.db import ResultsDB  # noqa: E402
from orchestrator.results.stats import max_overlap, online_figures, useful_time  # noqa: E402
from orchestrator.results.summary import task_summaries  # noqa: E402

CONFIGS = {"quick": "experiments/quick.yaml", "online": "experiments/online.yaml", "paper": "experiments/paper.yaml"}


def run(config: str, out: Path) -> tuple[Path, float]:
    """Run one experiment with the CLI; its run directory and wall time (bring-up included)."""
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "orchestrator.cli", "experiment", config, "--out", str(out),
                          "--no-progress"], cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if res.returncode != 0:
        raise SystemExit(f"{config} failed (status {res.returncode}):\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    (run_dir,) = sorted(out.glob("*-*"))
    return run_dir, wall


def figures(run_dir: Path, wall_s: float | None = None) -> None:
    with ResultsDB(run_dir / "results.db") as db:
        run = db.run(1)
        tasks = task_summaries(db, 1)
        env = run["environment"]
        clock_end = env.get("clock_end_s")
        print(f"\n{run_dir.name}: status {run['status']}, mode {env.get('mode')}, backend {env.get('backend')}, "
              f"{len(tasks)} tasks ({sum(t.state == 'done' for t in tasks)} done, "
              f"{sum(t.state == 'blocked' for t in tasks)} blocked, {sum(t.state == 'failed' for t in tasks)} failed)")
        if wall_s is not None:
            print(f"  wall time, bring-up included: {wall_s:.0f} s ({wall_s / 3600:.2f} h; paper target <= 1 h)")
        over = [t.start_overhead_s for t in tasks if t.start_overhead_s is not None]
        at8 = [t.start_overhead_s for t in tasks if t.start_overhead_s is not None and t.n_locals == 8]
        if over:
            print(f"  start overhead, median: all tasks {statistics.median(over):.3f} s (n={len(over)}); "
                  f"8 locals {statistics.median(at8):.3f} s (n={len(at8)}) -> / 1 s target = "
                  f"{statistics.median(at8) / 1.0:.3f}" if at8 else "  (no task at 8 locals)")
        useful = useful_time(tasks, clock_end)
        if useful is not None:
            print(f"  useful time (time in rounds / wall after bring-up {clock_end:.1f} s): {useful:.3f} "
                  f"(target >= 0.3); most tasks at once {max_overlap(tasks)}")
        if env.get("mode") == "online":
            for o in online_figures(db, 1, tasks):
                mem = o["memory_peak_bytes"]
                lat = o["latency_s_mean"]
                print(f"  online {o['scheduler']}: {o['done']}/{o['tasks']} done, blocking ratio "
                      f"{o['blocking_ratio']:.3f}, mean round latency {'-' if lat is None else f'{lat * 1e3:.1f} ms'}, "
                      f"most at once {o['max_overlap']} (target >= 10), peak memory in use "
                      f"{'-' if mem is None else f'{mem / 1e9:.2f} GB'} (target < 6 GB)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", default="quick,online", help="comma-separated: quick, online, paper")
    parser.add_argument("--paper", action="store_true", help="also run paper.yaml (about 35 minutes)")
    parser.add_argument("--from", dest="runs", type=Path, nargs="+", help="print the figures of these run dirs")
    parser.add_argument("--keep", type=Path, help="keep the runs in this directory")
    args = parser.parse_args(argv)
    if args.runs:
        for d in args.runs:
            figures(d)
        return 0
    if os.geteuid() != 0:
        print("bench_servers: run as root (it runs experiments in Mininet)", file=sys.stderr)
        return 2
    names = [n for n in args.only.split(",") if n] + (["paper"] if args.paper and "paper" not in args.only else [])
    with tempfile.TemporaryDirectory(prefix="netai-bench-servers-") as d:
        root = args.keep or Path(d)
        for name in names:
            run_dir, wall = run(CONFIGS[name], root / name)
            figures(run_dir, wall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
