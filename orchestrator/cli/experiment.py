"""`netai experiment CONFIG [--out DIR]`: run an experiment config end to end; `netai experiment --resume
RUN_DIR`: continue one that was interrupted, crashed or killed (`orchestrator.experiment.resume`)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from orchestrator.cli.dashboard import add_dashboard_args
from orchestrator.errors import ConfigError
from orchestrator.experiment.config import ExperimentConfig, load_config
from orchestrator.experiment.faults import mixed_triggers
from orchestrator.experiment.k_store import ENV_RECALIBRATE


def overrides_of(args: argparse.Namespace) -> dict[str, Any]:
    """The command line's overrides of the config (recorded with the run, applied again on resume)."""
    keys = ("locals", "tasks", "rounds", "time_dilation", "max_time_dilation")
    return {k: getattr(args, k) for k in keys if getattr(args, k, None) is not None}


def cmd_experiment(args: argparse.Namespace) -> int:
    from orchestrator.experiment.resume import apply_overrides, source_record
    from orchestrator.experiment.runner import run_experiment

    if getattr(args, "resume", None):
        return _resume(args)
    if not args.config:
        raise ConfigError("give an experiment CONFIG, or --resume RUN_DIR")
    cfg = load_config(args.config)  # every config error is raised here, before anything starts
    if getattr(args, "recalibrate", False):
        os.environ[ENV_RECALIBRATE] = "1"  # orchestrator.experiment.k_store
    for warning in mixed_triggers(cfg.events):
        print(f"netai: warning: {warning}", file=sys.stderr)
    overrides = overrides_of(args)
    cfg = apply_overrides(cfg, overrides, where=str(args.config))
    outcome = run_experiment(cfg, out_root=Path(args.out), progress=not args.no_progress,
                             dashboard_port=args.dashboard_port if args.dashboard else None,
                             figures=not args.no_figures, source=source_record(args.config, overrides, cfg))
    return _finish(cfg, outcome)


def _resume(args: argparse.Namespace) -> int:
    """`--resume RUN_DIR`: every check before anything starts (`orchestrator.experiment.resume`)."""
    from orchestrator.experiment.resume import load_config_as, load_for_resume, load_sweep_for_resume
    from orchestrator.experiment.runner import run_experiment

    run_dir = Path(args.resume)
    if overrides_of(args):
        raise ConfigError("--resume runs the rest of the run as it started: no --locals, --tasks, --rounds or "
                          "--time-dilation")
    if (run_dir / "sweep.json").is_file():
        from orchestrator.experiment.resume import sweep_complete

        cfg = load_sweep_for_resume(run_dir, args.config, load_config_as)
        if sweep_complete(run_dir, cfg):
            print(f"netai: the sweep in {run_dir} is complete: nothing to resume, nothing changed")
            return 0
    else:
        found, cfg = load_for_resume(run_dir, args.config, load_config_as)
        from orchestrator.experiment.resume import is_complete, write_missing_results

        if is_complete(found, cfg):
            if write_missing_results(run_dir, found.run_id, figures=not args.no_figures):
                print(f"netai: {run_dir} is complete ({found.status}): nothing to resume; its report, CSVs and "
                      "figures, which were missing, written again")
            else:
                print(f"netai: {run_dir} is complete ({found.status}): nothing to resume, nothing changed")
            return 0
    outcome = run_experiment(cfg, out_root=run_dir.parent, progress=not args.no_progress,
                             dashboard_port=args.dashboard_port if args.dashboard else None,
                             figures=not args.no_figures, resume=run_dir)
    return _finish(cfg, outcome)


def _finish(cfg: ExperimentConfig, outcome: Any) -> int:
    """Print the run's summary (a sweep printed its own) and the report; the exit status."""
    from orchestrator.results.report import print_summary

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
    p.add_argument("config", nargs="?", help="experiment YAML, e.g. experiments/quick.yaml (with --resume: "
                   "the run's config file, if it moved)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run (or sweep) in RUN_DIR: the tasks it "
                   "recorded are kept, the rest run as they would have (docs/long-runs.md)")
    p.add_argument("--out", default="runs", help="folder for the run folders (default: runs)")
    p.add_argument("--locals", help="override: comma-separated numbers of local models")
    p.add_argument("--tasks", type=int, help="override: tasks per point")
    p.add_argument("--rounds", type=int, help="override: rounds per task")
    p.add_argument("--time-dilation", metavar="K", help="override emulation.time_dilation: a number, auto (the "
                   "smallest faithful K from trials before the run; a config's per_point kept) or host (this host's, "
                   "netai calibrate); a number or host is the whole run's K")
    p.add_argument("--max-time-dilation", metavar="CAP", type=float,
                   help="with --time-dilation auto: the largest K its trials try")
    p.add_argument("--recalibrate", action="store_true",
                   help="with time dilation auto: run the trials even if this host chose a K for the same workload")
    p.add_argument("--no-progress", action="store_true", help="no progress bars (log lines only)")
    p.add_argument("--no-figures", action="store_true",
                   help="results, CSVs and report without the plots (faster, e.g. in scripted runs)")
    add_dashboard_args(p)
    p.set_defaults(func=cmd_experiment)
