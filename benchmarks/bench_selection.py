"""Local-model selection policies compared on one task, without root: accuracy against round latency
and update bytes (docs/selection.md).

One task of sndlib/nobel-us (G and `--locals` locals drawn with `--seed`, trees by `--scheduler`, so
the path costs are the schedule's), digits with a non-IID (Dirichlet) split so that data sizes
differ, run once per policy on loopback site servers (127.0.0.x; no Mininet, no shaping: latencies
are the agents' own, not a network's). Each policy's rounds go into one results database as a run
of their own; the report's selection table and the ``selection_accuracy`` figure are written to
`--out` (``selection.md``, ``selection_accuracy.png``/``.svg``, ``results.db``).

Usage: ``.venv/bin/python benchmarks/bench_selection.py [--locals 8] [--k 4] [--rounds 8] [--out DIR]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.results.db import ResultsDB  # noqa: E402
from orchestrator.results.report import selection_section  # noqa: E402
from orchestrator.results.summary_figures import plot_selection  # noqa: E402
from orchestrator.runtime.backends import LoopbackBackend  # noqa: E402
from orchestrator.runtime.compute import ComputeManager  # noqa: E402
from orchestrator.runtime.task_runner import FLOptions, path_costs, run_task  # noqa: E402
from orchestrator.scheduling import NetworkState, get_scheduler  # noqa: E402
from orchestrator.scheduling.tasks import generate_tasks  # noqa: E402
from topologies.loaders import load  # noqa: E402


def policies(k: int, seed: int) -> list[dict[str, Any] | None]:
    return [None, {"policy": "random", "k": k, "seed": seed}, {"policy": "data_size", "k": k},
            {"policy": "network_cost", "k": k}, {"policy": "contribution", "k": k},
            {"policy": "contribution", "k": k, "metric": "loss_reduction"}]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--locals", type=int, default=8)
    ap.add_argument("--k", type=int, default=4, help="locals per round of every policy but all")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--scheduler", default="mst")
    ap.add_argument("--out", type=Path, default=None, help="default: a new temporary folder")
    args = ap.parse_args()
    out: Path = args.out or Path(tempfile.mkdtemp(prefix="netai-selection-"))
    out.mkdir(parents=True, exist_ok=True)

    model = load("sndlib/nobel-us")
    (task,) = generate_tasks(model, count=1, locals_per_task=args.locals, seed=args.seed, rounds=args.rounds)
    schedule = get_scheduler(args.scheduler).schedule(NetworkState(model), task)
    if schedule.blocked:
        print(f"{args.scheduler} cannot place the task: {schedule.reason}", file=sys.stderr)
        return 1
    print(f"task: G={schedule.global_site}, locals={', '.join(schedule.local_sites)}; path costs (hops):",
          ", ".join(f"{s} {c:g}" for s, c in sorted(path_costs(schedule).items())))
    sites = schedule.overlay_nodes
    db = ResultsDB(out / "results.db")
    with ComputeManager(LoopbackBackend(sites, log_root=out / "logs"), sites) as cm:
        for selection in policies(args.k, args.seed):
            label = "all" if selection is None else ", ".join(f"{k}={v}" for k, v in selection.items())
            options = FLOptions(model="mlp", rounds=args.rounds, partitioning="dirichlet", alpha=0.5, seed=args.seed,
                                local_epochs=1, selection=selection)
            run_id = db.start_run(label, {"selection": selection}, {"backend": "loopback"})
            result = run_task(schedule, manager=cm, options=options, log_dir=cm.task_dir(f"run{run_id}"))
            for r in result.rounds:
                db.record_round(run_id, args.scheduler, schedule.task_id, r.round, latency_s=r.latency_s,
                                broadcast_s=r.broadcast_s, train_s=r.train_s, upload_s=r.upload_s,
                                accuracy=r.accuracy, lower_bound_s=None)
                db.record_round_selection(run_id, args.scheduler, schedule.task_id, r.round,
                                          policy=label, selected=r.selected, upload_bytes=r.upload_bytes)
            db.finish_run(run_id, "completed")
            print(f"{label:45s} accuracy {' '.join(f'{r.accuracy:.3f}' for r in result.rounds)} | "
                  f"update kB/round {sum(r.upload_bytes for r in result.rounds) / len(result.rounds) / 1e3:.1f} | "
                  f"latency ms/round {sum(r.latency_s for r in result.rounds) / len(result.rounds) * 1e3:.1f}")
    (out / "selection.md").write_text("\n".join(selection_section(db)) + "\n")
    figure = plot_selection(db, out)
    db.close()
    print(f"table: {out / 'selection.md'}; figure: {figure.files[0] if figure.ok else figure.skipped}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
