"""Benchmark: the flow-level simulation (`engine: simulation`) at scale, and how its cost grows.

Two parts, both with the background on (the emulation's default demand-matrix plan, simulated) and
compute modelled (training from the task's measured profile at each site's speed; the CPU model
with this host's calibration, `netai calibrate`, if there is one: the run says whether it used one):

1. growth: the same workload (30 tasks, 10 per point at 10, 25 and 49 locals, every scheduler,
   3 rounds, at the emulated rates) on generated topologies of 50, 200, 500 and 1000 sites
   (random:N:1); prints each run's wall time (scheduling, simulation, database, figures and
   report) and its ratio to the 50-site run's, and the same for the part spent simulating;
2. the headline: 1000 sites (random:1000:1), 30 tasks at 10, 50 and 100 locals (target: minutes).

``--quick`` stops the growth at 200 sites and runs the headline at 200 sites, 3 tasks per point.
``--max-segments N`` simulates each transfer as at most N segments (`simulation.max_segments`).
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from orchestrator.experiment.config import parse_config
from orchestrator.experiment.simulated import run_simulated
from orchestrator.results.db import ResultsDB

SCHEDULERS = ["spff", "mst", "steiner", "spt"]
#: The default MLP (two hidden layers of 800 on digits' 64 inputs, float32).
MODEL_BYTES = 4 * (64 * 800 + 800 + 800 * 800 + 800 + 800 * 10 + 10)


def bench(topology: str, locals_: list[int], tasks_per_point: int, out: Path, max_segments: int = 0) -> dict[str, Any]:
    cfg = parse_config({"name": topology.replace("/", "-").replace(":", "-"), "engine": "simulation",
                        "topology": topology, "schedulers": SCHEDULERS, "locals": locals_,
                        "tasks_per_point": tasks_per_point, "task": {"rounds": 3},
                        "background": {"enabled": True, "pattern": "demand-matrix", "load": 0.3, "pairs": 6},
                        "simulation": {"rates": "emulated", "max_segments": max_segments}}, where="bench")
    t0 = time.monotonic()
    outcome = run_simulated(cfg, out_root=out, model_bytes=MODEL_BYTES)
    wall = time.monotonic() - t0
    with ResultsDB(outcome.run_dir / "results.db") as db:
        env = db.run(outcome.run_id)["environment"]
        n = db.query("SELECT COUNT(*) AS n, SUM(state = 'done') AS done FROM tasks WHERE run_id = ?",
                     (outcome.run_id,))[0]
        rounds = db.query("SELECT COUNT(*) AS n FROM rounds WHERE run_id = ?", (outcome.run_id,))[0]["n"]
    return {"wall_s": wall, "sim_wall_s": env.get("simulation_wall_s"), "sim_rss_mb": env.get("simulation_peak_rss_mb"),
            "sched_wall_s": env.get("scheduling_wall_s"), "processes": env.get("simulation_processes"),
            "runs": n["n"], "done": n["done"], "rounds": rounds, "status": outcome.status,
            "calibration": env.get("calibration_id") or "none (uncalibrated)", "cpu_cores": env.get("cpu_cores"),
            "background": env.get("background")}


HEADER = (f"{'topology':<16}{'locals':<10}{'task runs':>10}{'done':>6}{'rounds':>8}{'wall s':>9}"
          f"{'sched s':>9}{'sim s':>8}{'procs':>6}{'sim peak MB':>13}")


def row(topo: str, locals_: list[int], r: dict[str, Any]) -> str:
    return (f"{topo:<16}{','.join(map(str, locals_)):<10}{r['runs']:>10}{r['done']:>6}{r['rounds']:>8}"
            f"{r['wall_s']:>9.1f}{r['sched_wall_s']:>9.1f}{r['sim_wall_s']:>8.1f}{r['processes']:>6}"
            f"{r['sim_rss_mb']:>13.1f}")


def growth(sizes: list[int], out: Path, max_segments: int) -> None:
    """Part 1: the same workload on growing topologies; wall and simulation time over the smallest's."""
    locals_ = [10, 25, 49]
    print(f"growth: 10 tasks per point at {locals_} locals, {', '.join(SCHEDULERS)}, 3 rounds, background on")
    print(HEADER + f"{'wall / 50':>11}{'sim / 50':>10}")
    base: dict[str, Any] | None = None
    for n in sizes:
        topo = f"random:{n}:1"
        r = bench(topo, locals_, 10, out, max_segments)
        base = base or r
        print(row(topo, locals_, r) + f"{r['wall_s'] / base['wall_s']:>11.2f}"
              f"{r['sim_wall_s'] / max(base['sim_wall_s'], 1e-9):>10.2f}", flush=True)
    print(f"calibration used: {base['calibration'] if base else '-'}; CPU model cores: "
          f"{base['cpu_cores'] if base else '-'}; background: {base['background'] if base else '-'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="growth up to 200 sites, headline at 200 sites")
    ap.add_argument("--max-segments", type=int, default=0, metavar="N",
                    help="simulate each transfer as at most N segments (simulation.max_segments; default 0: off)")
    ap.add_argument("--out", type=Path, help="where to keep the run folders (default: a temporary folder)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="netai-bench-sim-") as tmp:
        out = args.out or Path(tmp)
        growth([50, 200] if args.quick else [50, 200, 500, 1000], out, args.max_segments)
        per, topo, locals_ = (3, "random:200:1", [5, 10, 20]) if args.quick else (10, "random:1000:1", [10, 50, 100])
        print(f"\nheadline: {topo}, {3 * per} tasks, {', '.join(SCHEDULERS)}, 3 rounds, "
              f"max_segments {args.max_segments or 'off'}")
        print(HEADER)
        print(row(topo, locals_, bench(topo, locals_, per, out, args.max_segments)), flush=True)
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"peak memory of this process (scheduling, database, report): {own:.1f} MB")


if __name__ == "__main__":
    main()
