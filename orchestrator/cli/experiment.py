"""`netai experiment CONFIG [--out DIR]`: run an experiment config end to end."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from orchestrator.cli.dashboard import add_dashboard_args
from orchestrator.experiment.config import load_config
from orchestrator.experiment.faults import mixed_triggers
from orchestrator.experiment.k_store import ENV_RECALIBRATE


def cmd_experiment(args: argparse.Namespace) -> int:
    from orchestrator.experiment.runner import run_experiment, trimmed
    from orchestrator.results.report import print_summary

    cfg = load_config(args.config)  # every config error is raised here, before anything starts
    if getattr(args, "recalibrate", False):
        os.environ[ENV_RECALIBRATE] = "1"  # orchestrator.experiment.k_store
    for warning in mixed_triggers(cfg.events):
        print(f"netai: warning: {warning}", file=sys.stderr)
    if args.locals or args.tasks or args.rounds:
        cfg = trimmed(
            cfg,
            locals_=tuple(int(x) for x in args.locals.split(",")) if args.locals else cfg.locals,
            tasks_per_point=args.tasks or cfg.tasks_per_point,
            rounds=args.rounds or cfg.task.rounds,
        )
        from orchestrator.experiment.config import parse_config

        cfg = parse_config(cfg.to_dict(), where=str(args.config))  # re-validate the trimmed copy
    if args.time_dilation is not None or args.max_time_dilation is not None:
        from orchestrator.experiment.host_dilation import with_dilation

        cfg = with_dilation(cfg, args.time_dilation, args.max_time_dilation,
                            where=str(args.config))
    outcome = run_experiment(cfg, out_root=Path(args.out), progress=not args.no_progress,
                             dashboard_port=args.dashboard_port if args.dashboard else None,
                             figures=not args.no_figures)
    if cfg.sweep:  # the sweep printed each run's summary and its own table
        print(f"report: {outcome.report}")
        return 0 if outcome.status == "completed" else 1
    summary = outcome.summary
    if summary is None:  # writing the results failed (logged): summarise what the database holds
        from orchestrator.results.db import ResultsDB
        from orchestrator.results.summary import run_summary

        with ResultsDB(outcome.run_dir / "results.db") as db:
            summary = run_summary(db, outcome.run_id)
    print_summary(summary, outcome.run_dir)
    if outcome.report:
        print(f"report: {outcome.report}")
    return 0 if outcome.status == "completed" else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment", help="run an experiment config (needs root): results, figures, report")
    p.add_argument("config", help="experiment YAML, e.g. experiments/quick.yaml")
    p.add_argument("--out", default="runs", help="folder for the run folders (default: runs)")
    p.add_argument("--locals", help="override: comma-separated numbers of local models")
    p.add_argument("--tasks", type=int, help="override: tasks per point")
    p.add_argument("--rounds", type=int, help="override: rounds per task")
    p.add_argument("--time-dilation", metavar="K", help="override emulation.time_dilation: a number, auto (the "
                   "smallest faithful K from trials before the run) or host (this host's, netai calibrate)")
    p.add_argument("--max-time-dilation", metavar="CAP", type=float,
                   help="with --time-dilation auto: the largest K its trials try")
    p.add_argument("--recalibrate", action="store_true",
                   help="with time dilation auto: run the trials even if this host chose a K for the same workload")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (log lines only)")
    p.add_argument("--no-figures", action="store_true",
                   help="results, CSVs and report without the plots (faster, e.g. in scripted runs)")
    add_dashboard_args(p)
    p.set_defaults(func=cmd_experiment)
