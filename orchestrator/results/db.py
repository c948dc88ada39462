"""The results database's writer: an embedded SQLite store (WAL) of runs, topology, tasks, schedules,
rounds, network state and link statistics (the tables: `orchestrator.results.schema`).

A task's end (its end state, rounds and figures) commits as one transaction, which also marks its
record whole (`seal_task`; the lifecycle's recorder holds the task's writes from its end until
then). A run that ends, or is found crashed, discards the rows of its tasks that never got there
(`orchestrator.results.durability`), so a run that is not running holds whole tasks only; the run's
status says whether it completed, was interrupted, failed or crashed.

Durability: WAL with ``synchronous=FULL``. WAL alone keeps the file whole when the process is killed
at any moment (a transaction is in the database or not at all); FULL also syncs the log at every
commit, so a task the run said was recorded is still there after a power loss or a reboot. The
commits are few (one per task's end, one per sample of the link recorder), so the syncs cost little. Nothing here runs the
experiment (the drivers call these methods) and nothing here reads what a run recorded: every
read is a function of `orchestrator.results.queries`.
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from orchestrator.results import durability, queries
from orchestrator.results.schema import (
    ADDED_COLUMNS,
    ENGINES,
    RUN_STATUSES,
    SCHEMA,
    SCHEMA_VERSION,
    TASK_STATES,
)
from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.tasks import Task


class ResultsDB:
    """A connection to one experiment database file (created on first use)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.conn = sqlite3.connect(str(self.path), isolation_level=None, timeout=30)
        self.conn.row_factory = sqlite3.Row
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=FULL")
        self.conn.execute("PRAGMA foreign_keys=ON")
        durability.migrate_statuses(self.conn)
        if "ts" in queries.columns(self.conn, "link_stats"):  # schema 1's link_stats, never written: replaced by schema 2's
            self.conn.execute("DROP TABLE link_stats")
        self.conn.executescript(SCHEMA)
        for table, added in ADDED_COLUMNS.items():
            have = queries.columns(self.conn, table)
            for name, kind in added:
                if name not in have:  # names and types from the schema's fixed list, not from data
                    self.conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
                    if (table, name) == ("tasks", "complete"):  # tasks of runs from before it: whole as they are
                        self.conn.execute("UPDATE tasks SET complete = 1")
        self.conn.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
        )
        #: Runs this open found running with their process gone, marked crashed ({run id: note}).
        self.crashed = durability.reap_all(self.conn)

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> ResultsDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One transaction; inside another (`transaction`), part of it."""
        if self.conn.in_transaction:
            yield self.conn
            return
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            yield self.conn
        except BaseException:
            if self.conn.in_transaction:  # SQLite already rolled it back on some errors (SQLITE_FULL)
                self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    @contextmanager
    def transaction(self) -> Iterator[ResultsDB]:
        """Every write of the block in one transaction (committed whole, or not at all)."""
        with self._tx():
            yield self

    # -- runs ------------------------------------------------------------------------------------
    def start_run(self, name: str, config: dict[str, Any], environment: dict[str, Any] | None = None,
                  *, engine: str = "emulation", source: dict[str, Any] | None = None) -> int:
        """A new run owned by this process; `engine` says whether it is emulated or simulated
        (``simulation``); `source` is what a resume checks (`orchestrator.experiment.resume`)."""
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
        cur = self.conn.execute(
            "INSERT INTO runs(name, config_json, environment_json, status, started_at, engine, owner, source_json)"
            " VALUES (?, ?, ?, 'running', ?, ?, ?, ?)",
            (name, json.dumps(config, sort_keys=True), json.dumps(environment or {}, sort_keys=True), time.time(),
             engine, durability.owner_stamp(), json.dumps(source or {}, sort_keys=True)),
        )
        assert cur.lastrowid is not None
        return int(cur.lastrowid)

    def set_environment(self, run_id: int, environment: dict[str, Any]) -> None:
        self.conn.execute(
            "UPDATE runs SET environment_json = ? WHERE id = ?", (json.dumps(environment, sort_keys=True), run_id)
        )

    def update_environment(self, run_id: int, **items: Any) -> None:
        """Add or replace some entries of the run's environment record."""
        env = self.run(run_id)["environment"]
        env.update(items)
        self.set_environment(run_id, env)

    def finish_run(self, run_id: int, status: str, note: str = "") -> None:
        """End the run as `status`; its half-recorded tasks (those that were running) are discarded
        in the same transaction (`durability.discard_incomplete`)."""
        if status not in RUN_STATUSES or status in ("running", "crashed"):
            raise ValueError(f"a run finishes as completed, interrupted or failed, not {status!r}")
        with self._tx() as c:
            durability.discard_incomplete(c, run_id, f"the run ended ({status}) before the task did")
            c.execute("UPDATE runs SET status = ?, finished_at = ?, note = ? WHERE id = ?",
                      (status, time.time(), note, run_id))

    def add_note(self, run_id: int, text: str) -> None:
        """Add `text` to the run's note (after what it says already)."""
        with self._tx() as c:
            c.execute("UPDATE runs SET note = CASE WHEN note = '' THEN ? ELSE note || '; ' || ? END WHERE id = ?",
                      (text, text, run_id))

    def reopen_run(self, run_id: int) -> dict[str, Any]:
        """Continue run `run_id` in this process (`netai experiment --resume`): a run found crashed is
        marked so first; the run is ``running`` again, owned by this process, and the resume is
        recorded (the ``resumes`` table). Returns the resume's row."""
        durability.reap(self.conn, run_id)
        run = self.run(run_id)
        with self._tx() as c:
            durability.discard_incomplete(c, run_id, "half recorded when the run was resumed")
            earlier = sum(r["discarded"] for r in queries.resumes(c, run_id))
            row = {"run_id": run_id, "at": time.time(), "previous_status": run["status"],
                   "kept": queries.task_count(c, run_id),  # discarded since the last start: found crashed or now
                   "discarded": queries.discarded_count(c, run_id) - earlier}
            c.execute("INSERT INTO resumes VALUES (:run_id, :at, :previous_status, :kept, :discarded)", row)
            c.execute("UPDATE runs SET status = 'running', finished_at = NULL, owner = ? WHERE id = ?",
                      (durability.owner_stamp(), run_id))
        return row

    def seal_task(self, run_id: int, scheduler: str, task_id: int) -> None:
        """Mark the task's record whole: call inside the transaction that writes its end (`transaction`)."""
        self.conn.execute("UPDATE tasks SET complete = 1 WHERE run_id = ? AND scheduler = ? AND task_id = ?",
                          (run_id, scheduler, task_id))

    def run(self, run_id: int) -> dict[str, Any]:
        """The run's row, its config and environment decoded (`queries.run_record`).

        Raises
        ------
        KeyError
            No run `run_id` in this database.
        """
        run = queries.run_record(self.conn, run_id)
        if run is None:
            raise KeyError(f"no run {run_id}")
        return run

    def record_topology(self, run_id: int, name: str, model: dict[str, Any], plan: dict[str, Any]) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO topology(run_id, name, model_json, plan_json) VALUES (?, ?, ?, ?)",
            (run_id, name, json.dumps(model), json.dumps(plan)),
        )

    # -- tasks and schedules ---------------------------------------------------------------------
    def record_task(self, run_id: int, scheduler: str, task: Task, state: str = "pending", *,
                    complete: bool = True) -> None:
        """The task's row. `complete` False: its end is still to come (the lifecycle's tasks; the
        transaction that writes its end marks it whole, `seal_task`), and it is discarded if the run
        ends or crashes first."""
        self._check_state(state)
        self.conn.execute(
            "INSERT OR REPLACE INTO tasks(run_id, scheduler, task_id, n_locals, global_site, local_sites_json,"
            " model, rounds, demand_mbps, model_bytes, state, complete) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, scheduler, task.id, len(task.local_sites), task.global_site, json.dumps(list(task.local_sites)),
             task.model, task.rounds, task.demand_mbps, task.model_bytes, state, int(complete)),
        )

    def set_task_state(self, run_id: int, scheduler: str, task_id: int, state: str, reason: str = "",
                       *, at_s: float | None = None) -> None:
        """Set a task's state; with `at_s` (the run's clock) the change is also kept in `task_events`."""
        self._check_state(state)
        with self._tx() as c:
            c.execute("UPDATE tasks SET state = ?, reason = ? WHERE run_id = ? AND scheduler = ? AND task_id = ?",
                      (state, reason, run_id, scheduler, task_id))
            if at_s is not None:
                c.execute("INSERT INTO task_events VALUES (?, ?, ?, ?, ?, ?)",
                          (run_id, scheduler, task_id, float(at_s), state, reason))

    def set_task_times(self, run_id: int, scheduler: str, task_id: int, **times: float | None) -> None:
        """Set some of a task's times (arrival_s, admitted_s, first_broadcast_s, finished_s,
        start_overhead_s), in seconds on the run's clock."""
        allowed = {"arrival_s", "admitted_s", "first_broadcast_s", "finished_s", "start_overhead_s"}
        bad = set(times) - allowed
        if bad:
            raise ValueError(f"unknown task times {sorted(bad)}")
        if not times:
            return
        cols = ", ".join(f"{k} = ?" for k in times)  # column names from the fixed set above, values bound
        self.conn.execute(f"UPDATE tasks SET {cols} WHERE run_id = ? AND scheduler = ? AND task_id = ?",
                          (*times.values(), run_id, scheduler, task_id))

    def record_sample(self, run_id: int, scheduler: str, t_s: float, *, running: int, reserved_mbps: float,
                      carried_mbps: float | None, memory_used_bytes: int | None,
                      sites: dict[str, tuple[float, int, int]]) -> None:
        """One sample of the online mode: tasks running, reserved and carried bandwidth (model units,
        summed over links), the machine's memory in use, and per site (cpu_s, pss_bytes, roles)."""
        with self._tx() as c:
            c.execute("INSERT INTO samples VALUES (?, ?, ?, ?, ?, ?, ?)",
                      (run_id, scheduler, t_s, running, reserved_mbps, carried_mbps, memory_used_bytes))
            c.executemany("INSERT INTO site_samples VALUES (?, ?, ?, ?, ?, ?, ?)",
                          [(run_id, scheduler, t_s, site, cpu, pss, roles) for site, (cpu, pss, roles) in sites.items()])

    def set_carried_bytes(self, run_id: int, scheduler: str, task_id: int, carried_bytes: int) -> None:
        self.conn.execute(
            "UPDATE tasks SET carried_bytes = ? WHERE run_id = ? AND scheduler = ? AND task_id = ?",
            (int(carried_bytes), run_id, scheduler, task_id),
        )

    def add_carried_bytes(self, run_id: int, scheduler: str, task_id: int, carried_bytes: int) -> None:
        """Add the bytes one of a task's installations carried (a moved task had several)."""
        self.conn.execute(
            "UPDATE tasks SET carried_bytes = COALESCE(carried_bytes, 0) + ? WHERE run_id = ? AND scheduler = ? "
            "AND task_id = ?", (int(carried_bytes), run_id, scheduler, task_id),
        )

    def set_tcp_bytes(self, run_id: int, scheduler: str, task_id: int, sent: int | None,
                      retrans: int | None) -> None:
        """The task's TCP data bytes sent and retransmitted (None: not measured, NULL)."""
        self.conn.execute(
            "UPDATE tasks SET sent_bytes = ?, retrans_bytes = ? WHERE run_id = ? AND scheduler = ? AND task_id = ?",
            (None if sent is None else int(sent), None if retrans is None else int(retrans), run_id, scheduler,
             task_id))

    def record_fault(self, run_id: int, scheduler: str, *, at_s: float, action: str, target: str, ok: bool,
                     detail: str = "", took_s: float | None = None) -> None:
        """One injected event (`orchestrator.experiment.faults`), on the run's clock."""
        self.conn.execute(
            "INSERT INTO faults(run_id, scheduler, at_s, action, target, ok, detail, took_s) VALUES (?,?,?,?,?,?,?,?)",
            (run_id, scheduler, at_s, action, target, int(ok), detail, took_s))

    def record_move(self, run_id: int, scheduler: str, task_id: int, move: int, **fields: Any) -> None:
        """Insert or complete one move of a task (`TaskManager.move`): the fields given are set."""
        self.conn.execute("INSERT OR IGNORE INTO moves(run_id, scheduler, task_id, move, at_s, reason, "
                          "old_schedule_json, resumed_round) VALUES (?, ?, ?, ?, 0, '', '', 0)",
                          (run_id, scheduler, task_id, move))
        allowed = {"at_s", "reason", "old_schedule_json", "new_schedule_json", "resumed_round", "last_round_end_s",
                   "next_round_start_s", "interruption_s", "old_bound_s", "new_bound_s", "old_reserved_mbps",
                   "new_reserved_mbps"}
        bad = set(fields) - allowed
        if bad:
            raise ValueError(f"unknown move fields {sorted(bad)}")
        if fields:
            sets = ", ".join(f"{k} = ?" for k in fields)
            self.conn.execute(f"UPDATE moves SET {sets} WHERE run_id = ? AND scheduler = ? AND task_id = ? "
                              "AND move = ?", (*fields.values(), run_id, scheduler, task_id, move))

    def record_schedule(self, run_id: int, schedule: Schedule, lower_bound_s: float | None,
                        scheduler: str | None = None) -> None:
        """The task's schedule under the label `scheduler` (default the schedule's own scheduler
        name); a moved task's is replaced by its latest (the ``moves`` table keeps every one)."""
        self.conn.execute(
            "INSERT OR REPLACE INTO schedules(run_id, scheduler, task_id, schedule_json, reserved_mbps, lower_bound_s)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, scheduler or schedule.scheduler, schedule.task_id, json.dumps(schedule.to_dict()),
             schedule.reserved_mbps_total, lower_bound_s),
        )

    def record_network_state(self, run_id: int, scheduler: str, task_id: int, state: NetworkState) -> None:
        """Snapshot what the scheduler saw before placing `task_id` (per directed link)."""
        rows = []
        for link in state.model.iter_links():
            for a, b in ((link.a, link.b), (link.b, link.a)):
                rows.append((run_id, scheduler, task_id, a, b, link.capacity_mbps, state.ai_mbps(a, b),
                             state.background_mbps.get((a, b), 0.0), state.residual_mbps(a, b)))
        with self._tx() as c:
            c.executemany("INSERT INTO network_state VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", rows)

    # -- measurements ----------------------------------------------------------------------------
    def record_round(
        self,
        run_id: int,
        scheduler: str,
        task_id: int,
        round_: int,
        *,
        latency_s: float,
        broadcast_s: float,
        train_s: float,
        upload_s: float,
        accuracy: float | None,
        lower_bound_s: float | None,
        stragglers: int = 0,
        broadcast_all_s: float | None = None,
        upload_tail_s: float | None = None,
        broadcast_bound_s: float | None = None,
        upload_bound_s: float | None = None,
        reference_s: float | None = None,
    ) -> None:
        self.conn.execute(
            "INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, scheduler, task_id, round_, latency_s, broadcast_s, train_s, upload_s, accuracy,
             lower_bound_s, stragglers, broadcast_all_s, upload_tail_s, broadcast_bound_s, upload_bound_s,
             reference_s),
        )

    def record_round_selection(self, run_id: int, scheduler: str, task_id: int, round_: int, *, policy: str,
                               selected: Sequence[str], upload_bytes: int) -> None:
        """Which locals trained in a round (``selected``; [] with no selection) and its UPDATE bytes."""
        self.conn.execute("INSERT OR REPLACE INTO round_selection VALUES (?, ?, ?, ?, ?, ?, ?)",
                          (run_id, scheduler, task_id, round_, policy, json.dumps(list(selected)), int(upload_bytes)))

    def set_task_setup(self, run_id: int, scheduler: str, task_id: int, **figures: float | int | bool) -> None:
        """Figures of a task outside its rounds: agent start-up, connection set-up, chunk size, ..."""
        with self._tx() as c:
            c.execute("UPDATE tasks SET setup_json = ? WHERE run_id = ? AND scheduler = ? AND task_id = ?",
                      (json.dumps(figures), run_id, scheduler, task_id))

    def record_link_stats(self, run_id: int, t_s: float, links: list[dict[str, Any]]) -> None:
        """One sample of every directed link's load (keys as the `link_stats` columns: a, b, tx_bytes,
        rate_mbps, ai_mbps, background_mbps, capacity_mbps, up)."""
        with self._tx() as c:
            c.executemany(
                "INSERT INTO link_stats VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, float(t_s), ln["a"], ln["b"], int(ln["tx_bytes"]), float(ln["rate_mbps"]),
                  float(ln.get("ai_mbps", 0.0)), float(ln.get("background_mbps", 0.0)),
                  float(ln.get("capacity_mbps", 0.0)), int(bool(ln.get("up", True)))) for ln in links])

    def record_node_rounds(self, run_id: int, scheduler: str, task_id: int, rows: list[dict[str, Any]]) -> None:
        """Per round and node of a task (keys as the `node_rounds` columns: round, site, role,
        received_s, train_start_s, train_end_s, sent_s; times on the run's clock or None)."""
        with self._tx() as c:
            c.executemany(
                "INSERT OR REPLACE INTO node_rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(run_id, scheduler, task_id, int(r["round"]), r["site"], r["role"], r.get("received_s"),
                  r.get("train_start_s"), r.get("train_end_s"), r.get("sent_s")) for r in rows])

    def record_fidelity(self, run_id: int, scheduler: str, task_id: int, *, hops: list[dict[str, Any]],
                        overruns: list[dict[str, Any]], link_rates: Sequence[dict[str, Any]] = (),
                        trainings: Sequence[dict[str, Any]] = ()) -> None:
        """A task's broadcast hops (`orchestrator.lifecycle.fidelity.hop_rows`), its training overruns
        and its modelled trainings (round, site, real_s, modelled_s; `training_rows`), and its saturated
        links' rates (`link_rate_rows`)."""
        with self._tx() as c:
            c.executemany("INSERT OR REPLACE INTO link_rates VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          [(run_id, scheduler, task_id, int(r["round"]), r["a"], r["b"], int(r["bytes"]),
                            float(r["expected_s"]), float(r["measured_s"])) for r in link_rates])
            c.executemany("INSERT OR REPLACE INTO hops VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          [(run_id, scheduler, task_id, int(h["round"]), h["parent"], h["child"], h["hop_s"],
                            h["chunk_s"], h["floor_s"], h["overhead_s"]) for h in hops])
            for table, rows in (("overruns", overruns), ("trainings", trainings)):
                c.executemany(f"INSERT OR REPLACE INTO {table} VALUES (?, ?, ?, ?, ?, ?, ?)",
                              [(run_id, scheduler, task_id, int(o["round"]), o["site"], float(o["real_s"]),
                                float(o["modelled_s"])) for o in rows])

    def record_host_sample(self, run_id: int, t_s: float, cpu_busy: float) -> None:
        self.conn.execute("INSERT INTO host_samples VALUES (?, ?, ?)", (run_id, t_s, cpu_busy))

    def record_background(self, run_id: int, src: str, dst: str, offered_mbps: float,
                          achieved_mbps: float | None) -> None:
        self.conn.execute("INSERT INTO background VALUES (?, ?, ?, ?, ?)",
                          (run_id, src, dst, offered_mbps, achieved_mbps))

    def record_background_view(self, run_id: int, task_id: int | None, t_s: float, m: Any) -> None:
        """A `BackgroundMeasurement` handed to the schedulers (see the ``background_views`` table)."""
        cv = None if math.isnan(m.cv) else m.cv
        self.conn.execute("INSERT INTO background_views VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                          (run_id, task_id, t_s, m.window_s, m.pieces, m.total_mbps, cv, int(m.settled), m.waited_s))

    def background_view_mark(self) -> int:
        """Where the ``background_views`` rows recorded so far end (for `background_view_wait_s`)."""
        return int(self.conn.execute("SELECT COALESCE(MAX(rowid), 0) FROM background_views").fetchone()[0])

    def background_view_wait_s(self, run_id: int, after: int = 0) -> float:
        """Wall seconds the schedulers' background measurements of `run_id` took, those recorded
        after the mark `after` (`background_view_mark`: not a crashed attempt's before a resume)."""
        row = self.conn.execute("SELECT COALESCE(SUM(waited_s), 0) FROM background_views WHERE run_id = ? "
                                "AND rowid > ?", (run_id, after)).fetchone()
        return float(row[0])

    # -- ad hoc reads -----------------------------------------------------------------------------
    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """Rows of an ad hoc statement, for tests and benchmarks that check what a run recorded.
        The project's own code reads through `orchestrator.results.queries` only."""
        return [dict(r) for r in self.conn.execute(sql, params).fetchall()]

    @staticmethod
    def _check_state(state: str) -> None:
        if state not in TASK_STATES:
            raise ValueError(f"unknown task state {state!r}; one of {', '.join(TASK_STATES)}")
