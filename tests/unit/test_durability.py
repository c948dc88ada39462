"""Results that stay whole (issue 48): a task's end in one transaction, a run found crashed, half-recorded
tasks discarded, an older database's runs table migrated (`orchestrator.results.durability`)."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lifecycle.recorder import DbRecorder
from orchestrator.results import durability
from orchestrator.results.db import ResultsDB
from orchestrator.scheduling.tasks import Task

TASK = Task(id=1, global_site="a", local_sites=("b", "c"), rounds=2, model="mlp", demand_mbps=10.0, model_bytes=1000)


def _dead_owner() -> str:
    """An owner stamp of this host whose process has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    stamp = durability.owner_stamp(proc.pid)
    proc.wait()
    return stamp


def _running_task(db: ResultsDB, run_id: int, task: Task = TASK) -> DbRecorder:
    """A task that arrived and runs, recorded as the lifecycle records it."""
    rec = DbRecorder(db, run_id)
    rec.task("spff", task, arrival_s=0.0)
    rec.state("spff", task.id, "scheduled", at_s=0.1)
    rec.state("spff", task.id, "running", at_s=0.2)
    return rec


def _end(rec: DbRecorder, task_id: int = 1) -> None:
    """The writes of a task's end, held as the core holds them."""
    rec.hold("spff", task_id)
    rec.times("spff", task_id, finished_s=3.0)
    rec.setup("spff", task_id, chunk_bytes=1024)
    rec.state("spff", task_id, "done", at_s=3.0)


def _count(db: ResultsDB, sql: str, *args: Any) -> int:
    return int(next(iter(db.query(sql, args)[0].values())))


def test_a_held_end_is_written_only_when_sealed(tmp_path: Path) -> None:
    # Prepare
    db = ResultsDB(tmp_path / "results.db")
    run_id = db.start_run("r", {})
    rec = _running_task(db, run_id)

    # Execute
    _end(rec)
    before = db.query("SELECT state, complete, finished_s FROM tasks")[0]
    rec.seal("spff", 1)
    after = db.query("SELECT state, complete, finished_s, setup_json FROM tasks")[0]

    # Assert
    assert before == {"state": "running", "complete": 0, "finished_s": None}
    assert after == {"state": "done", "complete": 1, "finished_s": 3.0, "setup_json": '{"chunk_bytes": 1024}'}


def test_a_seal_that_fails_midway_leaves_nothing_of_the_end(tmp_path: Path) -> None:
    # Prepare: the end's last write fails (a full disk, a bug)
    db = ResultsDB(tmp_path / "results.db")
    run_id = db.start_run("r", {})
    rec = _running_task(db, run_id)
    _end(rec)
    rec._held[("spff", 1)].append(lambda: (_ for _ in ()).throw(sqlite3.OperationalError("disk I/O error")))

    # Execute
    with pytest.raises(sqlite3.OperationalError):
        rec.seal("spff", 1)

    # Assert: the task is as it was before its end
    assert db.query("SELECT state, complete, finished_s FROM tasks")[0] == {"state": "running", "complete": 0,
                                                                            "finished_s": None}
    assert _count(db, "SELECT count(*) FROM task_events WHERE state = 'done'") == 0


def test_a_killed_writer_leaves_a_whole_database(tmp_path: Path) -> None:
    # Prepare: a child process that seals task 1, then holds task 2's end open in a transaction
    path = tmp_path / "results.db"
    code = f"""
import os, signal, sys
sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
from tests.unit.test_durability import _running_task, _end, TASK
from dataclasses import replace
from orchestrator.results.db import ResultsDB
db = ResultsDB({str(path)!r})
run_id = db.start_run("r", {{}})
rec = _running_task(db, run_id)
_end(rec)
rec.seal("spff", 1)
rec2 = _running_task(db, run_id, replace(TASK, id=2))
_end(rec2, 2)
with db.transaction():
    for write in rec2._held.pop(("spff", 2)):
        write()
    os.kill(os.getpid(), signal.SIGKILL)
"""
    # Execute
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)

    # Assert: killed inside task 2's end; the file is whole, task 1 whole, task 2 not ended
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    rows = [dict(zip(("task_id", "state", "complete"), r, strict=True))
            for r in raw.execute("SELECT task_id, state, complete FROM tasks ORDER BY task_id")]
    raw.close()
    with ResultsDB(path) as db:  # opening it finds the run crashed
        note = db.crashed.get(1)
        run = db.run(1)
        left = db.query("SELECT task_id FROM tasks")
        events = db.query("SELECT task_id, state FROM task_events WHERE state = 'discarded'")
    assert rows == [{"task_id": 1, "state": "done", "complete": 1}, {"task_id": 2, "state": "running", "complete": 0}]
    assert note is not None and run["status"] == "crashed" and "1 half-recorded" in run["note"]
    assert left == [{"task_id": 1}]
    assert events == [{"task_id": 2, "state": "discarded"}]


def test_a_run_whose_process_is_alive_or_elsewhere_is_not_crashed(tmp_path: Path) -> None:
    # Prepare: one run of this process, one of another host
    db = ResultsDB(tmp_path / "results.db")
    mine = db.start_run("mine", {})
    theirs = db.start_run("theirs", {})
    db.conn.execute("UPDATE runs SET owner = ? WHERE id = ?", (f"elsewhere-{socket.gethostname()} 1 x 1", theirs))

    # Execute
    notes = durability.reap_all(db.conn)

    # Assert
    assert notes == {}
    assert durability.owner_alive(durability.owner_stamp()) is True
    assert durability.owner_alive(_dead_owner()) is False
    assert durability.owner_alive("") is None
    assert {db.run(mine)["status"], db.run(theirs)["status"]} == {"running"}


def test_a_dead_owners_run_is_marked_crashed_once(tmp_path: Path) -> None:
    # Prepare
    db = ResultsDB(tmp_path / "results.db")
    run_id = db.start_run("r", {})
    _running_task(db, run_id)
    db.conn.execute("UPDATE runs SET owner = ? WHERE id = ?", (_dead_owner(), run_id))

    # Execute
    first, second = durability.reap_all(db.conn), durability.reap_all(db.conn)

    # Assert
    assert list(first) == [run_id] and second == {}
    assert db.run(run_id)["status"] == "crashed"
    assert _count(db, "SELECT count(*) FROM tasks") == 0


def test_finishing_a_run_discards_the_task_that_was_running(tmp_path: Path) -> None:
    # Prepare: a sealed task and one interrupted while it ran
    db = ResultsDB(tmp_path / "results.db")
    run_id = db.start_run("r", {})
    rec = _running_task(db, run_id)
    _end(rec)
    rec.seal("spff", 1)
    from dataclasses import replace

    _running_task(db, run_id, replace(TASK, id=2))

    # Execute
    db.finish_run(run_id, "interrupted", "Ctrl-C")

    # Assert
    assert db.query("SELECT task_id FROM tasks") == [{"task_id": 1}]
    assert db.query("SELECT task_id, state FROM task_events WHERE state = 'discarded'") == [
        {"task_id": 2, "state": "discarded"}]


def test_reopening_a_run_records_the_resume(tmp_path: Path) -> None:
    # Prepare: a run found crashed with one half-recorded task
    db = ResultsDB(tmp_path / "results.db")
    run_id = db.start_run("r", {})
    _running_task(db, run_id)
    db.conn.execute("UPDATE runs SET owner = ? WHERE id = ?", (_dead_owner(), run_id))

    # Execute
    row = db.reopen_run(run_id)

    # Assert
    assert (row["previous_status"], row["kept"], row["discarded"]) == ("crashed", 0, 1)
    run = db.run(run_id)
    assert run["status"] == "running" and durability.owner_alive(run["owner"]) is True
    assert durability.resume_lines(db.conn, run_id)[0].startswith("Resumed 1 time (")


def test_an_older_runs_table_gets_the_crashed_status(tmp_path: Path) -> None:
    # Prepare: the runs table as schema 2 wrote it, with a run in it
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, config_json TEXT NOT "
                 "NULL, environment_json TEXT NOT NULL DEFAULT '{}', status TEXT NOT NULL CHECK (status IN ('running', "
                 "'completed', 'interrupted', 'failed')), started_at REAL NOT NULL, finished_at REAL, note TEXT NOT "
                 "NULL DEFAULT '')")
    conn.execute("CREATE TABLE tasks (run_id INTEGER NOT NULL REFERENCES runs(id), scheduler TEXT NOT NULL, "
                 "task_id INTEGER NOT NULL, n_locals INTEGER NOT NULL, global_site TEXT NOT NULL, local_sites_json "
                 "TEXT NOT NULL, model TEXT NOT NULL, rounds INTEGER NOT NULL, demand_mbps REAL NOT NULL, model_bytes "
                 "INTEGER NOT NULL, state TEXT NOT NULL, reason TEXT NOT NULL DEFAULT '', PRIMARY KEY (run_id, "
                 "scheduler, task_id))")
    conn.execute("INSERT INTO runs(name, config_json, status, started_at) VALUES ('old', '{}', 'running', 0)")
    conn.execute("INSERT INTO tasks VALUES (1, 'spff', 1, 2, 'a', '[]', 'mlp', 1, 1, 1, 'done', '')")
    conn.commit()
    conn.close()

    # Execute
    with ResultsDB(path) as db:
        db.conn.execute("UPDATE runs SET status = 'crashed' WHERE id = 1")
        run = db.run(1)
        task = db.query("SELECT complete FROM tasks")[0]
        check = db.query("PRAGMA foreign_key_check")

    # Assert: the run kept, the old task whole, the new status allowed
    assert (run["name"], run["status"]) == ("old", "crashed")
    assert task == {"complete": 1}
    assert check == []


def test_the_database_syncs_every_commit(tmp_path: Path) -> None:
    with ResultsDB(tmp_path / "results.db") as db:
        assert db.query("PRAGMA journal_mode")[0]["journal_mode"] == "wal"
        assert db.query("PRAGMA synchronous")[0]["synchronous"] == 2  # FULL


def test_owner_stamps_name_this_process() -> None:
    host, pid, _boot, ticks = durability.owner_stamp().split()
    assert (host, int(pid)) == (socket.gethostname(), os.getpid())
    assert ticks.isdigit()


def test_opening_a_database_marks_its_crashed_runs(tmp_path: Path) -> None:
    # Prepare: a run killed with a task running
    path = tmp_path / "results.db"
    with ResultsDB(path) as db:
        run_id = db.start_run("r", {})
        _running_task(db, run_id)
        db.conn.execute("UPDATE runs SET owner = ? WHERE id = ?", (_dead_owner(), run_id))

    # Execute
    with ResultsDB(path) as db:
        crashed, run = db.crashed, db.run(run_id)

    # Assert
    assert list(crashed) == [run_id] and run["status"] == "crashed"


def test_a_reader_shows_a_dead_owners_running_run_as_crashed() -> None:
    assert durability.status_of({"status": "running", "owner": _dead_owner()}) == "crashed"
    assert durability.status_of({"status": "running", "owner": durability.owner_stamp()}) == "running"
    assert durability.status_of({"status": "completed", "owner": _dead_owner()}) == "completed"
