"""What keeps a results database whole across a crash: who owns a running run, which tasks are
recorded whole, and what a crash leaves behind (docs/long-runs.md).

A task's record is whole once the transaction that writes its end (its end state, rounds and
figures) has committed: that transaction also sets ``tasks.complete`` (`ResultsDB.seal_task`). A
task that has not got there (it was running when the run stopped) is *half recorded*: its rows are
discarded when the run ends or is found crashed, and one ``discarded`` event in `task_events` says
so. A run that is not running therefore holds whole tasks only.

A run is ``running`` while its process lives. Its owner, ``host pid boot-id start-ticks``, is
recorded when it starts; a run found ``running`` on this host whose process is gone (a kill -9, a
crash, a reboot: another boot id) is marked ``crashed`` (`reap`). Another host's run is left alone.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.procs import boot_id, proc_start_ticks
from orchestrator.results import queries

#: Tables whose rows belong to one task of a run (run_id, scheduler, task_id), but `task_events`,
#: which keeps every attempt (a discarded one ends with a ``discarded`` event).
TASK_TABLES = ("tasks", "schedules", "rounds", "network_state", "node_rounds", "round_selection", "hops",
               "link_rates", "overruns", "trainings", "moves")
#: The `task_events` state of an attempt whose record was discarded (it runs again on resume).
DISCARDED = "discarded"


def owner_stamp(pid: int | None = None) -> str:
    """This process as a run's owner: ``host pid boot-id start-ticks``."""
    pid = os.getpid() if pid is None else pid
    ticks = proc_start_ticks(pid)
    return f"{socket.gethostname()} {pid} {boot_id()} {'?' if ticks is None else ticks}"


def owner_alive(stamp: str) -> bool | None:
    """Whether the process `stamp` names still runs: None when it cannot be told (another host, or
    no owner recorded: a run from before owners were)."""
    parts = stamp.split()
    if len(parts) != 4 or parts[0] != socket.gethostname():
        return None
    _, pid, boot, ticks = parts
    if boot != boot_id():
        return False  # the machine rebooted since
    return str(proc_start_ticks(int(pid))) == ticks


def discard_incomplete(conn: sqlite3.Connection, run_id: int, why: str) -> list[tuple[str, int]]:
    """Delete every row of the run's half-recorded tasks (inside the caller's transaction) and add a
    ``discarded`` event for each, with `why`; the tasks discarded."""
    gone = queries.incomplete_tasks(conn, run_id)
    last = queries.last_event_s(conn, run_id)
    for scheduler, task_id in gone:
        for table in TASK_TABLES:  # names from the fixed tuple above
            conn.execute(f"DELETE FROM {table} WHERE run_id = ? AND scheduler = ? AND task_id = ?",
                         (run_id, scheduler, task_id))
        conn.execute("INSERT INTO task_events VALUES (?, ?, ?, ?, ?, ?)",
                     (run_id, scheduler, task_id, last, DISCARDED, why))
    return gone


def reap(conn: sqlite3.Connection, run_id: int) -> str | None:
    """Mark run `run_id` ``crashed`` if it is ``running`` and its process is gone (its half-recorded
    tasks discarded, in one transaction); the note it got, or None if it was left as it was."""
    row = queries.run_owner(conn, run_id)
    if row is None or row[0] != "running" or owner_alive(row[1]) is not False:
        return None
    conn.execute("BEGIN IMMEDIATE")
    try:
        gone = discard_incomplete(conn, run_id, "the run's process was gone before the task ended (crashed)")
        note = f"crashed: found running with its process ({row[1].split()[1]}) gone; " \
               f"{len(gone)} half-recorded task run(s) discarded"
        conn.execute("UPDATE runs SET status = 'crashed', finished_at = ?, note = ? WHERE id = ? AND status = 'running'",
                     (time.time(), note, run_id))
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return note


def reap_all(conn: sqlite3.Connection) -> dict[int, str]:
    """`reap` every run of the database: {run id: note} of those marked crashed."""
    notes = {run_id: reap(conn, run_id) for run_id in queries.running_run_ids(conn)}
    return {k: v for k, v in notes.items() if v is not None}


def migrate_statuses(conn: sqlite3.Connection) -> None:
    """Rebuild an older database's `runs` table, whose status check predates ``crashed`` (SQLite
    cannot alter a check: the documented twelve-step table rebuild, in one transaction)."""
    sql = queries.table_sql(conn, "runs")
    if sql is None or "'crashed'" in sql or "'failed')" not in sql:
        return  # no table, or a check that allows it already, or no check on the status at all
    new_sql = sql.replace("'failed')", "'failed', 'crashed')").replace("CREATE TABLE runs", "CREATE TABLE runs_new", 1)
    if "runs_new" not in new_sql or "'crashed'" not in new_sql:
        raise RuntimeError("results.db: cannot read the runs table's definition to add the crashed status")
    cols = ", ".join(sorted(queries.columns(conn, "runs")))
    conn.execute("PRAGMA foreign_keys=OFF")
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(new_sql)
        conn.execute(f"INSERT INTO runs_new({cols}) SELECT {cols} FROM runs")  # columns the table has
        conn.execute("DROP TABLE runs")
        conn.execute("ALTER TABLE runs_new RENAME TO runs")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    conn.execute("PRAGMA foreign_keys=ON")


def resume_lines(conn: sqlite3.Connection, run_id: int) -> list[str]:
    """The report's lines on a resumed run: how often, when, from what (none for a run never resumed)."""
    rows = queries.resumes(conn, run_id)
    if not rows:
        return []
    times = "; ".join(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(r['at']))} (it was {r['previous_status']}: "
                      f"{r['kept']} task runs kept, {r['discarded']} half-recorded discarded and run again)"
                      for r in rows)
    n = len(rows)
    return [f"Resumed {n} time{'' if n == 1 else 's'} (`netai experiment --resume`, docs/long-runs.md): {times}.", ""]


@contextlib.contextmanager
def written_whole(path: Path) -> Iterator[Path]:
    """A run folder's file (report, CSV, figure) written whole or not at all: the caller writes the path
    this yields (beside `path`, with its suffix, so that a figure keeps its format), which replaces `path`
    once the writing ended and is removed if it failed. A full disk leaves the earlier file or none,
    never half of one."""
    part = path.with_name(f"{path.stem}.part{path.suffix}")
    try:
        yield part
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise


def disk_full(exc: BaseException) -> bool:
    """Whether `exc` says the disk (or the database's size limit) is full: SQLite's SQLITE_FULL, or ENOSPC."""
    import errno

    if isinstance(exc, sqlite3.OperationalError):
        return getattr(exc, "sqlite_errorname", "") == "SQLITE_FULL" or "disk is full" in str(exc)
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def failure_note(exc: BaseException) -> str:
    """The note a run that `exc` ended gets: a full disk said so (with what to do), else the error."""
    if disk_full(exc):
        return f"the disk is full ({exc}): the run stopped with every task it recorded whole; free space, then " \
               "netai experiment --resume RUN_DIR"
    return f"{type(exc).__name__}: {exc}"


def finish_or_leave(db: Any, run_id: int, status: str, note: str, log: Any) -> None:
    """`db.finish_run`, or, when even that cannot be written (a full disk), a log line: the run is
    left running and is found crashed the next time it is looked at (`reap`)."""
    try:
        db.finish_run(run_id, status, note)
    except sqlite3.Error as e:
        log.error("could not mark run %d %s (%s): it will be found crashed and can be resumed", run_id, status, e)


def status_of(run: dict[str, Any]) -> str:
    """A run's status as a reader should show it: ``crashed`` for one still marked running whose process
    is gone (a read-only reader cannot mark it: `reap` does when the database is next opened to write)."""
    if run.get("status") == "running" and owner_alive(str(run.get("owner") or "")) is False:
        return "crashed"
    return str(run.get("status"))
