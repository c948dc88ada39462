"""A full disk while results are written (issue 48): a clear one-line error, the run marked (or found
crashed), and nothing corrupt. The disk is made full by SQLite's own size limit (``max_page_count``:
SQLITE_FULL, what a full file system gives), so no root and no mount are needed."""

from __future__ import annotations

import csv
import errno
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.cli import main
from orchestrator.experiment import simulated
from orchestrator.results import durability
from orchestrator.results.db import ResultsDB
from tests.unit.test_durability import _end, _running_task

RAW: dict[str, Any] = {"name": "full", "engine": "simulation", "topology": "triangle", "schedulers": ["spff", "mst"],
                       "locals": [2], "tasks_per_point": 3, "task": {"rounds": 2},
                       "simulation": {"rates": "emulated", "calibration": "a test's: the defaults"}}


def _fill_after(db: ResultsDB, pages: int) -> None:
    """Let the database grow by at most `pages` pages from now on."""
    n = db.query("PRAGMA page_count")[0]["page_count"]
    db.conn.execute(f"PRAGMA max_page_count = {int(n) + pages}")


class _FillingDB(ResultsDB):
    """A results database whose disk fills up once the run has started."""

    def start_run(self, *args: Any, **kw: Any) -> int:
        run_id = super().start_run(*args, **kw)
        _fill_after(self, 3)
        return run_id


def test_a_full_disk_at_a_tasks_end_leaves_it_unended_and_the_file_whole(tmp_path: Path) -> None:
    # Prepare: a running task, then a disk with no room for the end's rows
    db = ResultsDB(tmp_path / "results.db")
    run_id = db.start_run("r", {})
    rec = _running_task(db, run_id)
    _end(rec)
    rec.setup("spff", 1, big="x" * 200_000)  # type: ignore[arg-type]
    _fill_after(db, 1)

    # Execute
    with pytest.raises(sqlite3.OperationalError) as got:
        rec.seal("spff", 1)

    # Assert
    assert durability.disk_full(got.value)
    assert db.query("PRAGMA integrity_check")[0]["integrity_check"] == "ok"
    assert db.query("SELECT state, complete FROM tasks") == [{"state": "running", "complete": 0}]


def test_a_run_that_fills_the_disk_says_so_in_one_line_and_stays_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    # Prepare: a simulated run whose disk fills as its tasks are recorded
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(RAW))
    monkeypatch.setattr(simulated, "ResultsDB", _FillingDB)
    monkeypatch.setattr(simulated, "_model_sizes", lambda cfg, given: (200_000, None))

    # Execute
    code = main(["experiment", str(path), "--out", str(tmp_path / "runs"), "--no-figures", "--no-progress"])

    # Assert: one line; the database whole; the run marked failed (or found crashed); no half task
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and err.startswith("netai: error: the disk is full (database or disk is full)")
    (db_path,) = (tmp_path / "runs").glob("*/results.db")
    with ResultsDB(db_path) as db:
        durability.reap(db.conn, 1)
        assert db.query("PRAGMA integrity_check")[0]["integrity_check"] == "ok"
        run = db.run(1)
        half = db.query("SELECT count(*) AS n FROM tasks WHERE complete = 0")[0]["n"]
    assert run["status"] in ("failed", "crashed")
    assert half == 0


NO_SPACE = OSError(errno.ENOSPC, "No space left on device")


def test_a_results_file_is_whole_or_not_there(tmp_path: Path) -> None:
    # Prepare: an earlier report; a write that fills the disk halfway
    path = tmp_path / "report.md"
    path.write_text("the earlier report")

    # Execute
    with pytest.raises(OSError, match="No space left"), durability.written_whole(path) as part:
        part.write_text("half of the new")
        raise NO_SPACE

    # Assert: the earlier file as it was, nothing half written beside it
    assert path.read_text() == "the earlier report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_a_full_disk_while_the_report_is_written_says_so_and_notes_it_in_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    # Prepare: a simulated run whose disk fills while its tasks.csv is written (after some rows)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(RAW))
    monkeypatch.setattr(simulated, "_model_sizes", lambda cfg, given: (200_000, None))
    writerows = csv.DictWriter.writerows

    def fill_up(self: csv.DictWriter[str], rows: Any) -> None:
        rows = list(rows)
        if "task_id" in (self.fieldnames or []) and "round" not in (self.fieldnames or []):
            writerows(self, rows[:1])
            raise NO_SPACE
        writerows(self, rows)

    monkeypatch.setattr(csv.DictWriter, "writerows", fill_up)

    # Execute
    code = main(["experiment", str(path), "--out", str(tmp_path / "runs"), "--no-figures", "--no-progress"])

    # Assert: one line, exit 1; the run keeps its status and notes what was not written; no half file
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert len(err.splitlines()) == 1 and err.startswith("netai: error: the disk is full ([Errno 28]")
    (run_dir,) = (tmp_path / "runs").glob("*")
    with ResultsDB(run_dir / "results.db") as db:
        run = db.run(1)
        assert db.query("PRAGMA integrity_check")[0]["integrity_check"] == "ok"
    assert run["status"] == "completed" and "report, CSVs and figures were not written" in run["note"]
    assert not list(run_dir.glob("*.part.*")) and not (run_dir / "tasks.csv").exists()
    assert not (run_dir / "report.md").exists()

    # Execute: space freed, the run resumed
    monkeypatch.setattr(csv.DictWriter, "writerows", writerows)
    assert main(["experiment", "--resume", str(run_dir), "--no-figures"]) == 0

    # Assert: nothing run again, the report and CSVs written
    assert "figures, which were missing, written again" in capsys.readouterr().out
    assert (run_dir / "report.md").is_file() and len((run_dir / "tasks.csv").read_text().splitlines()) > 2
