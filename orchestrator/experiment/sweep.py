"""The sweep driver: a config with ``sweep`` runs once per entry, one after the other, each a whole
run of its own (`orchestrator.experiment.runner.run_experiment`, its own folder under the sweep's,
its own calibration when it asks for ``time_dilation: auto``); then the sweep's report compares them
(`orchestrator.results.regimes`). Every entry was validated with the config, before anything starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.resume import write_sweep_record
from orchestrator.experiment.runs import RunOutcome
from orchestrator.results.regimes import read_points, sweep_lines, write_sweep_report


def run_sweep(cfg: ExperimentConfig, *, run_one: Callable[..., RunOutcome], out_root: Path, progress: bool,
              dashboard_port: int | None, figures: bool = True, source: dict[str, Any] | None = None,
              resume: Path | None = None) -> RunOutcome:
    """Run every entry of `cfg`'s sweep with `run_one` (the runner's `run_experiment`); the sweep's
    report is written on every exit path. `source` goes into the sweep's ``sweep.json`` (what a
    resume checks); `resume` is a sweep's folder: its complete runs are kept, the others resumed
    (`orchestrator.experiment.resume`) and the entries not started yet run.

    The status is ``completed`` when every run completed, ``failed`` when one did not (the others still
    ran), ``interrupted`` on Ctrl-C (the runs done so far are in the report)."""
    from orchestrator.results.report import print_summary
    from orchestrator.runtime.compute import check_model

    for run in cfg.sweep:  # every run's model is built once: a broken one stops the sweep before anything starts
        check_model(run.task.model, run.task.model_args, run.task.dataset, run.task.dataset_args)
    sweep_dir = resume or out_root / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    if resume is None:
        sweep_dir.mkdir(parents=True, exist_ok=False)
        write_sweep_record(sweep_dir, cfg.name, source or {})
    else:
        from orchestrator.experiment.resume import remove_unstarted

        for gone in remove_unstarted(sweep_dir):
            print(f"netai: removed {gone.name}: its run stopped before it was recorded (it runs again)", flush=True)
    outcomes: list[RunOutcome] = []
    status = "interrupted"
    try:
        for i, run in enumerate(cfg.sweep, 1):
            print(f"netai: sweep run {i} of {len(cfg.sweep)}: {run.name} (model {run.task.model} "
                  f"{run.task.model_args or ''})", flush=True)
            outcome = _run_entry(run, run_one, sweep_dir, resume is not None, progress=progress,
                                 dashboard_port=dashboard_port, figures=figures)
            outcomes.append(outcome)
            if outcome.summary is not None:
                print_summary(outcome.summary, outcome.run_dir)
        status = "completed" if all(o.status == "completed" for o in outcomes) else "failed"
    finally:
        report = write_sweep_report(sweep_dir, [o.run_dir for o in outcomes] or sorted(sweep_dir.glob("*-*")),
                                    name=cfg.name)
    print("\n".join(["", f"sweep {cfg.name} {status}: {len(outcomes)} of {len(cfg.sweep)} runs; results in {sweep_dir}",
                     *sweep_lines(read_points([o.run_dir for o in outcomes]))]))
    return RunOutcome(run_id=0, run_dir=sweep_dir, status=status, report=report)


def _run_entry(run: ExperimentConfig, run_one: Callable[..., RunOutcome], sweep_dir: Path, resuming: bool,
               **options: Any) -> RunOutcome:
    """One entry of the sweep: run it, or on a resume continue its run (said and kept as it is when
    it is complete)."""
    from orchestrator.experiment.resume import entry_run_dir, find_run, is_complete, write_missing_results

    earlier = entry_run_dir(sweep_dir, run.name) if resuming else None
    if earlier is None:
        return run_one(run, out_root=sweep_dir, **options)
    found = find_run(earlier)
    if is_complete(found, run):
        again = write_missing_results(earlier, found.run_id, figures=options.get("figures", True))
        print(f"netai: {earlier.name} is complete ({found.status}): kept as it is"
              f"{'; its missing report written again' if again else ''}", flush=True)
        report = earlier / "report.md"
        return RunOutcome(run_id=found.run_id, run_dir=earlier, status=found.status,
                          report=report if report.exists() else None)
    return run_one(run, out_root=sweep_dir, resume=earlier, **options)
