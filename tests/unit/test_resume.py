"""`netai experiment --resume RUN_DIR` (issue 48, `orchestrator.experiment.resume`): kept tasks not run
again and their reservations put back, a changed config refused in one line, a complete run left as it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.errors import ConfigError
from orchestrator.experiment.config import load_config
from orchestrator.experiment.resume import changes, expected_tasks, find_run, source_record
from orchestrator.experiment.simulated import run_simulated
from orchestrator.results import durability
from orchestrator.results.db import ResultsDB

RAW: dict[str, Any] = {"name": "resumable", "engine": "simulation", "topology": "triangle", "schedulers": ["spff", "mst"],
                       "locals": [2], "tasks_per_point": 3, "seed": 4, "task": {"rounds": 1},
                       "simulation": {"rates": "emulated", "calibration": "a test's: the defaults"}}
MODEL_BYTES = 200_000


def _dead_owner() -> str:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    stamp = durability.owner_stamp(proc.pid)
    proc.wait()
    return stamp


def _run(tmp_path: Path, raw: dict[str, Any] = RAW) -> tuple[Path, Path]:
    """A config file and a completed simulated run of it that records where it came from."""
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_config(path)
    outcome = run_simulated(cfg, out_root=tmp_path / "runs", model_bytes=MODEL_BYTES, figures=False,
                            source=source_record(path, {}, cfg))
    return path, outcome.run_dir


def _crash(run_dir: Path, last: int) -> list[tuple[str, int]]:
    """Make the run look killed with its `last` task runs half recorded; those task runs."""
    with ResultsDB(run_dir / "results.db") as db:
        rows = db.query("SELECT scheduler, task_id FROM tasks ORDER BY arrival_s DESC LIMIT ?", (last,))
        for r in rows:
            db.conn.execute("UPDATE tasks SET complete = 0, state = 'running' WHERE scheduler = ? AND task_id = ?",
                            (r["scheduler"], r["task_id"]))
            db.conn.execute("DELETE FROM task_events WHERE scheduler = ? AND task_id = ? AND state = 'done'",
                            (r["scheduler"], r["task_id"]))  # its end was never written
        db.conn.execute("UPDATE runs SET status = 'running', finished_at = NULL, owner = ?", (_dead_owner(),))
    return [(r["scheduler"], r["task_id"]) for r in rows]


def _rows(run_dir: Path, sql: str) -> list[dict[str, Any]]:
    with ResultsDB(run_dir / "results.db") as db:
        return db.query(sql)


def test_changes_name_each_setting_that_differs() -> None:
    old = {"task": {"rounds": 3, "model": "mlp"}, "locals": [2, 8]}
    new = {"task": {"rounds": 4, "model": "mlp"}, "locals": [2, 8], "seed": 2}

    assert changes(old, new) == ["seed: added (2)", "task.rounds: 3 -> 4"]
    assert changes(old, old) == []


def test_a_crashed_run_resumes_its_half_recorded_tasks_only(tmp_path: Path) -> None:
    # Prepare: a completed run, then made to look killed with its last 2 task runs half recorded
    path, run_dir = _run(tmp_path)
    whole = _rows(run_dir, "SELECT scheduler, task_id, arrival_s FROM tasks ORDER BY scheduler, task_id")
    states = _rows(run_dir, "SELECT scheduler, task_id, a, b, reserved_mbps FROM network_state "
                            "ORDER BY scheduler, task_id, a, b")
    half = _crash(run_dir, 2)

    # Execute
    outcome = run_simulated(load_config(path), out_root=tmp_path / "runs", model_bytes=MODEL_BYTES, figures=False,
                            resume=run_dir)

    # Assert: the kept tasks are untouched, the two half-recorded ones ran again on the same network state
    assert outcome.run_dir == run_dir and outcome.status == "completed"
    after = _rows(run_dir, "SELECT scheduler, task_id, arrival_s, complete FROM tasks ORDER BY scheduler, task_id")
    assert [(r["scheduler"], r["task_id"]) for r in after] == [(r["scheduler"], r["task_id"]) for r in whole]
    assert all(r["complete"] == 1 for r in after)
    kept = [(r["scheduler"], r["task_id"], r["arrival_s"]) for r in after if (r["scheduler"], r["task_id"]) not in half]
    assert kept == [(r["scheduler"], r["task_id"], r["arrival_s"]) for r in whole
                    if (r["scheduler"], r["task_id"]) not in half]
    assert _rows(run_dir, "SELECT scheduler, task_id, a, b, reserved_mbps FROM network_state "
                          "ORDER BY scheduler, task_id, a, b") == states  # the kept reservations were put back
    ends = _rows(run_dir, "SELECT scheduler, task_id, count(*) AS n FROM task_events WHERE state = 'done' "
                          "GROUP BY scheduler, task_id")
    assert {r["n"] for r in ends} == {1} and len(ends) == 6
    assert _rows(run_dir, "SELECT previous_status, kept, discarded FROM resumes") == [
        {"previous_status": "crashed", "kept": 4, "discarded": 2}]
    assert "Resumed 1 time" in (run_dir / "report.md").read_text()


def test_a_changed_config_is_refused_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a killed run whose config file was edited since
    path, run_dir = _run(tmp_path)
    _crash(run_dir, 1)
    path.write_text(yaml.safe_dump({**RAW, "task": {"rounds": 2}}))
    before = _rows(run_dir, "SELECT * FROM tasks")

    # Execute
    code = main(["experiment", "--resume", str(run_dir)])

    # Assert: exit 2, one line naming the setting; the run found crashed says so, nothing else changed
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "task.rounds: 1 -> 2" in err
    assert _rows(run_dir, "SELECT * FROM tasks") == [r for r in before if r["complete"]]
    assert _rows(run_dir, "SELECT count(*) AS n FROM resumes") == [{"n": 0}]
    assert _rows(run_dir, "SELECT status FROM runs") == [{"status": "crashed"}]


def test_a_complete_run_says_so_and_changes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare
    _path, run_dir = _run(tmp_path)
    before = (run_dir / "results.db").read_bytes(), _rows(run_dir, "SELECT * FROM runs")

    # Execute
    code = main(["experiment", "--resume", str(run_dir)])

    # Assert
    assert code == 0
    assert "is complete (completed): nothing to resume, nothing changed" in capsys.readouterr().out
    assert _rows(run_dir, "SELECT * FROM runs") == before[1]
    assert _rows(run_dir, "SELECT count(*) AS n FROM resumes") == [{"n": 0}]


def test_a_run_still_running_is_refused(tmp_path: Path) -> None:
    # Prepare: the run's owner is this (live) process
    _path, run_dir = _run(tmp_path)
    with ResultsDB(run_dir / "results.db") as db:
        db.conn.execute("UPDATE runs SET status = 'running', owner = ?", (durability.owner_stamp(),))

    # Execute / Assert
    with pytest.raises(ConfigError, match="still running"):
        find_run(run_dir)


def test_resume_needs_a_run_and_takes_no_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["experiment", "--resume", str(tmp_path)]) == 2
    assert "no run to resume here" in capsys.readouterr().err
    assert main(["experiment", "--resume", str(tmp_path), "--rounds", "3"]) == 2
    assert "no --locals, --tasks, --rounds" in capsys.readouterr().err


def test_an_online_run_is_refused(tmp_path: Path) -> None:
    from orchestrator.experiment.resume import Found, recorded_config

    cfg = {**RAW, "engine": "emulation", "mode": "online", "online": {"tasks": 2}}
    cfg.pop("simulation")
    found = Found(run_dir=tmp_path, run_id=1, status="crashed", engine="emulation", config=cfg, source={}, owner="")

    with pytest.raises(ConfigError, match="online run cannot be resumed"):
        recorded_config(found, None)


def test_the_expected_tasks_are_every_scheduler_on_every_seeded_task() -> None:
    from orchestrator.experiment.config import parse_config

    got = expected_tasks(parse_config(RAW))

    assert got == {(s, t) for s in ("spff", "mst") for t in (201, 202, 203)}


@pytest.mark.parametrize(("calibrated", "expected"), [(True, 8.0), (False, None)])
def test_a_resumed_emulated_run_keeps_the_k_its_plan_recorded(tmp_path: Path, calibrated: bool,
                                                              expected: float | None) -> None:
    from orchestrator.experiment.config import parse_config
    from orchestrator.experiment.resume import recorded_dilation
    from topologies.plan import EmulationPlan

    # Prepare: a `time_dilation: auto` run whose calibration chose K = 8 (or stopped before it did)
    cfg = parse_config({"name": "k", "topology": "triangle", "locals": [2], "emulation": {"time_dilation": "auto"}})
    model = load_triangle()
    plan = EmulationPlan.from_model(model).dilated(8.0 if calibrated else 1.0)
    with ResultsDB(tmp_path / "results.db") as db:
        run_id = db.start_run("k", cfg.to_dict())
        db.record_topology(run_id, model.name, model.to_dict(), plan.to_dict())
        if calibrated:
            db.update_environment(run_id, time_dilation_calibration={"k": 8.0})

    # Execute
    got = recorded_dilation(cfg, tmp_path)

    # Assert: K fixed at the recorded one (no calibration again), or still auto (calibrate again)
    if expected is None:
        assert got.emulation.time_dilation_auto
    else:
        assert not got.emulation.time_dilation_auto and got.emulation.time_dilation == expected


def load_triangle() -> Any:
    from topologies.loaders import load

    return load("triangle")


def test_a_sweep_folder_without_its_record_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a sweep's folder holding a run folder, its sweep.json lost
    _path, run_dir = _run(tmp_path)
    sweep_dir = run_dir.parent

    # Execute
    code = main(["experiment", "--resume", str(sweep_dir)])

    # Assert: one line naming the run folder and what to do, exit 2
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"holds run folders ({run_dir.name})" in err and "no sweep.json" in err
    assert f"--resume {sweep_dir}/RUN_DIR" in err


@pytest.mark.parametrize("text", ["", '{"name": "half', "[]"])
def test_an_unreadable_sweep_record_is_refused_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str) -> None:
    # Prepare: a sweep.json cut short (written by an earlier version when its disk filled) or not an object
    (tmp_path / "sweep.json").write_text(text)

    # Execute
    code = main(["experiment", "--resume", str(tmp_path)])

    # Assert
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "its sweep.json cannot be read" in err and "resume its runs one by one" in err


def test_the_sweep_record_is_whole_or_not_there(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    from orchestrator.experiment.resume import read_sweep_record, write_sweep_record

    # Execute: written, then a write that fails as a full disk makes it fail
    write_sweep_record(tmp_path, "s", {"path": "/x.yaml"})
    full = OSError(errno.ENOSPC, "No space left on device")

    def fsync(_fd: int) -> None:
        raise full

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(OSError, match="No space left"):
        write_sweep_record(tmp_path, "s", {"path": "/y.yaml"})

    # Assert: the first record is there, whole, and nothing half written beside it
    assert read_sweep_record(tmp_path) == {"name": "s", "source": {"path": "/x.yaml"}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.json"]
