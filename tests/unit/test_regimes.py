"""A sweep of model sizes (``sweep`` in a config; experiments/regimes.yaml) and its report: every
entry validated whole before anything starts; the regimes figure plots each scheduler's latency
ratio against spff against the model's size and marks where mst starts to pay (`pays_from`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import load_config, parse_config
from orchestrator.results.db import ResultsDB
from orchestrator.results.regimes import pays_from, read_points, write_sweep_report
from orchestrator.results.stats import PairedRatio
from orchestrator.scheduling.tasks import Task

ROOT = Path(__file__).resolve().parents[2]


def test_regimes_yaml_sweeps_the_model_size_at_8_locals() -> None:
    cfg = load_config(ROOT / "experiments" / "regimes.yaml")
    assert [r.name for r in cfg.sweep] == [f"regimes-{i}" for i in range(1, 6)]
    assert [r.task.model_args["hidden"] for r in cfg.sweep] == [64, 200, 800, 1600, 3200]
    assert all(r.locals == (8,) and r.schedulers == ("spff", "mst", "steiner") for r in cfg.sweep)
    assert all(r.emulation.time_dilation_auto for r in cfg.sweep)  # every size at a K its trials find faithful
    assert all(r.task.rounds == cfg.task.rounds and r.topology == cfg.topology for r in cfg.sweep)
    again = parse_config(cfg.to_dict())  # the saved config holds the sweep as written
    assert again.sweep == cfg.sweep


@pytest.mark.parametrize(("sweep", "message"), [
    ([], "sweep must be a non-empty list of mappings"),
    ([{"task": {"model_args": {"hidden": 8}}}, "x"], "sweep must be a non-empty list of mappings"),
    ([{"name": "y"}], r"sweep\[1\]: unknown key 'name'"),
    ([{"task": {"rounds": 0}}], r"sweep\[1\]: task.rounds"),
    ([{"task": {"rounds": 2}}, {"emulation": {"time_dilation": "fast"}}], r"sweep\[2\]: emulation.time_dilation"),
])
def test_a_bad_sweep_entry_is_rejected_naming_it(sweep: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config({"name": "x", "sweep": sweep})


def _ratio(mean: float, low: float, high: float) -> PairedRatio:
    return PairedRatio(mean=mean, low=low, high=high, tasks=3, rounds=12)


def test_mst_pays_from_the_smallest_size_whose_interval_stays_below_one() -> None:
    points = [(20_000, _ratio(1.1, 1.0, 1.2)), (200_000, _ratio(0.9, 0.8, 0.99)), (2_000_000, _ratio(0.95, 0.9, 1.01)),
              (10_000_000, _ratio(0.7, 0.6, 0.8)), (40_000_000, _ratio(0.6, 0.55, 0.65)), (5, None)]
    assert pays_from(points) == 10_000_000  # 200 KB paid, 2 MB did not: it pays from 10 MB on
    assert pays_from(points[:2]) == 200_000
    assert pays_from(points[:3]) is None and pays_from([]) is None


def _run(folder: Path, model_bytes: int, latency: dict[str, float], timing: str = "modeled") -> Path:
    """A sweep run's folder with one database: 3 tasks of 8 locals, each scheduler at `latency` (x task)."""
    db = ResultsDB(folder / "results.db")
    run_id = db.start_run(folder.name, {}, {"mode": "sequential", "compute_timing": timing, "time_dilation": 4.0,
                                             "run_wall_s": 90.0})
    locals_ = tuple(f"L{i}" for i in range(8))
    for task_id in (1, 2, 3):
        for sched, s in latency.items():
            db.record_task(run_id, sched, Task(task_id, "G", locals_, rounds=1, model_bytes=model_bytes))
            db.record_round(run_id, sched, task_id, 1, latency_s=s * (1 + task_id / 10), broadcast_s=s / 3,
                            train_s=s / 3, upload_s=s / 3, accuracy=0.5, lower_bound_s=s / 2)
            db.set_task_state(run_id, sched, task_id, "done")
    db.finish_run(run_id, "completed")
    db.close()
    return folder


def test_the_sweep_report_tables_the_ratios_and_draws_the_regimes(tmp_path: Path) -> None:
    runs = [_run(tmp_path / "r-1-x", 19_240, {"spff": 0.010, "mst": 0.012}),
            _run(tmp_path / "r-2-x", 2_800_000, {"spff": 1.0, "mst": 0.6})]

    report = write_sweep_report(tmp_path, runs, name="r").read_text()

    points = read_points(runs)
    assert [(p.model_bytes, p.n_locals, p.time_dilation) for p in points] == [(19_240, 8, 4.0), (2_800_000, 8, 4.0)]
    small, large = (p.ratios["mst"] for p in points)
    assert small is not None and small.mean == pytest.approx(1.2) and small.tasks == 3
    assert large is not None and large.mean == pytest.approx(0.6) and large.high < 1
    assert "| r-1-x | 19240 | 8 | 4 | 90 | mst | 1.200 |" in report
    assert "mst starts to pay from 2800000 bytes" in report
    assert "Not faithful (mst or spff)" not in report  # no hop, overrun or link rate recorded: nothing violated
    assert (tmp_path / "regimes.png").stat().st_size > 0 and "![regimes](regimes.svg)" in report
    assert (tmp_path / "report.html").is_file()
    one = write_sweep_report(tmp_path / "one", runs[:1], name="r").read_text()
    assert "`regimes` not drawn: the runs do not differ in model size" in one
    measured = _run(tmp_path / "r-3-x", 40_000_000, {"spff": 10.0, "mst": 5.0}, timing="measured")
    caveat = write_sweep_report(tmp_path / "three", [*runs, measured], name="r").read_text()
    assert "Not faithful (mst or spff): r-3-x; these ratios are the instrument's too" in caveat
    assert "- r-3-x mst: training: measured on this host" in caveat
