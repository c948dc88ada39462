"""Every read of a results database: the only module of the project with an SQL SELECT.

The report, the figures, the CSV writers, the dashboard, attach and the running network read what a
run recorded through these functions, so that a change of the schema (`orchestrator.results.schema`)
meets every reader here. Each function takes an open connection whose rows are `sqlite3.Row`
(`ResultsDB.conn`, or `connect_read_only` for a reader that must not write) and returns plain dicts
or values; none writes.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

#: Tables with a ``t_s`` column on the run's clock whose span `time_span` reads.
TIMED_TABLES = ("link_stats", "task_events")


def _rows(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(sql, params).fetchall()]


def connect_read_only(path: Path) -> sqlite3.Connection:
    """A read-only connection to `path` (rows as `sqlite3.Row`); a finished run whose WAL files
    cannot be made (a read-only folder, another user) is opened as immutable.

    Raises
    ------
    FileNotFoundError
        `path` is not a file.
    """
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such results database")
    uri = f"{path.resolve().as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:
        conn = sqlite3.connect(uri + "&immutable=1", uri=True, check_same_thread=False)
    conn.row_factory = sqlite3.Row
    return conn


# -- the database and its runs ---------------------------------------------------------------------
def table_names(conn: sqlite3.Connection) -> set[str]:
    """The tables the database holds (an older database may lack some)."""
    return {r["name"] for r in _rows(conn, "SELECT name FROM sqlite_master WHERE type='table'")}


def columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """The column names of `table` (empty when it does not exist)."""
    return {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}  # a table name cannot be bound


def last_run_id(conn: sqlite3.Connection) -> int | None:
    """The id of the database's latest run; None when it holds none."""
    row = conn.execute("SELECT max(id) AS id FROM runs").fetchone()
    return None if row is None or row["id"] is None else int(row["id"])


def run_record(conn: sqlite3.Connection, run_id: int) -> dict[str, Any] | None:
    """The run's row with ``config`` and ``environment`` decoded from their JSON; None if absent."""
    rows = _rows(conn, "SELECT * FROM runs WHERE id = ?", (run_id,))
    if not rows:
        return None
    d = rows[0]
    d["config"] = json.loads(d.pop("config_json") or "{}")
    d["environment"] = json.loads(d.pop("environment_json") or "{}")
    return d


def topology(conn: sqlite3.Connection, run_id: int) -> dict[str, Any] | None:
    """The run's topology row (model_json, plan_json); None if none was recorded."""
    rows = _rows(conn, "SELECT * FROM topology WHERE run_id = ?", (run_id,))
    return rows[0] if rows else None


def time_span(conn: sqlite3.Connection, table: str, run_id: int) -> tuple[float | None, float | None]:
    """The first and last ``t_s`` of the run's rows in `table` (one of `TIMED_TABLES`)."""
    if table not in TIMED_TABLES:
        raise ValueError(f"no run clock in table {table!r}; one of {', '.join(TIMED_TABLES)}")
    row = conn.execute(f"SELECT min(t_s) AS lo, max(t_s) AS hi FROM {table} WHERE run_id = ?", (run_id,)).fetchone()
    return row["lo"], row["hi"]


# -- tasks -----------------------------------------------------------------------------------------
def task_ids(conn: sqlite3.Connection, run_id: int) -> set[int]:
    """Every task id the run records (whatever its scheduler and state)."""
    return {int(r["task_id"]) for r in _rows(conn, "SELECT DISTINCT task_id FROM tasks WHERE run_id = ?", (run_id,))}


def schedulers(conn: sqlite3.Connection, run_id: int) -> list[str]:
    """The run's scheduler labels (as its tasks record them), sorted."""
    return [r["scheduler"] for r in _rows(
        conn, "SELECT DISTINCT scheduler FROM tasks WHERE run_id = ? ORDER BY scheduler", (run_id,))]


def tasks_with_schedules(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every task of the run with its times, setup figures, TCP bytes and reserved bandwidth (None when
    it was never scheduled), by scheduler, number of locals and task id. A database opened read-only
    from before the TCP columns gives None for them."""
    have = columns(conn, "tasks")
    tcp = ", ".join(f"t.{c}" if c in have else f"NULL AS {c}" for c in ("sent_bytes", "retrans_bytes"))
    return _rows(
        conn,
        "SELECT t.scheduler, t.task_id, t.n_locals, t.state, t.reason, t.carried_bytes, t.model_bytes, t.setup_json, "
        f"t.arrival_s, t.admitted_s, t.first_broadcast_s, t.finished_s, t.start_overhead_s, {tcp}, s.reserved_mbps "
        "FROM tasks t LEFT JOIN schedules s USING (run_id, scheduler, task_id) WHERE t.run_id = ? "
        "ORDER BY t.scheduler, t.n_locals, t.task_id", (run_id,))


def task_infos(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Per task: scheduler, task_id, n_locals, global_site, rounds, demand_mbps."""
    return _rows(conn, "SELECT scheduler, task_id, n_locals, global_site, rounds, demand_mbps FROM tasks "
                 "WHERE run_id = ?", (run_id,))


def task_states(conn: sqlite3.Connection, run_id: int, scheduler: str) -> list[str]:
    """The state of each of the scheduler's tasks."""
    return [r["state"] for r in _rows(conn, "SELECT state FROM tasks WHERE run_id = ? AND scheduler = ?",
                                      (run_id, scheduler))]


def failed_tasks(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """scheduler, task_id and reason of every failed task."""
    return _rows(conn, "SELECT scheduler, task_id, reason FROM tasks WHERE run_id = ? AND state = 'failed'",
                 (run_id,))


def admitted_s(conn: sqlite3.Connection, run_id: int, scheduler: str, task_id: int) -> float | None:
    """When the task was admitted, on the run's clock (None: not recorded)."""
    rows = _rows(conn, "SELECT admitted_s FROM tasks WHERE run_id = ? AND scheduler = ? AND task_id = ?",
                 (run_id, scheduler, task_id))
    return rows[0]["admitted_s"] if rows else None


def task_events(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every state change (scheduler, task_id, t_s, state), by scheduler and time."""
    return _rows(conn, "SELECT scheduler, task_id, t_s, state FROM task_events WHERE run_id = ? "
                 "ORDER BY scheduler, t_s", (run_id,))


def last_task_events(conn: sqlite3.Connection, run_id: int, t: float) -> list[dict[str, Any]]:
    """Per task, its last state change at or before `t` (scheduler, task_id, state, reason, t_s)."""
    return _rows(
        conn,
        "SELECT e.scheduler, e.task_id, e.state, e.reason, e.t_s FROM task_events e JOIN ("
        " SELECT scheduler, task_id, max(rowid) AS rid FROM task_events WHERE run_id = ? AND t_s <= ?"
        " GROUP BY scheduler, task_id) m ON e.rowid = m.rid", (run_id, t))


def schedule(conn: sqlite3.Connection, run_id: int, scheduler: str, task_id: int) -> dict[str, Any] | None:
    """The task's schedule (schedule_json, reserved_mbps); None before it is scheduled."""
    rows = _rows(conn, "SELECT schedule_json, reserved_mbps FROM schedules WHERE run_id = ? AND scheduler = ? "
                 "AND task_id = ?", (run_id, scheduler, task_id))
    return rows[0] if rows else None


#: Per task id, per scheduler in the order they were recorded: the background load per directed
#: link (model Mbit/s) the scheduler was given.
SchedulerViews = dict[int, dict[str, dict[tuple[str, str], float]]]


def scheduler_views(conn: sqlite3.Connection, run_id: int) -> SchedulerViews:
    """What each scheduler of each task was given of the background (the ``network_state`` snapshots)."""
    views: SchedulerViews = {}
    for r in _rows(conn, "SELECT scheduler, task_id, a, b, background_mbps FROM network_state WHERE run_id = ? "
                   "ORDER BY rowid", (run_id,)):
        by = views.setdefault(int(r["task_id"]), {}).setdefault(r["scheduler"], {})
        by[(r["a"], r["b"])] = float(r["background_mbps"])
    return views


def decisions(conn: sqlite3.Connection, run_id: int) -> dict[tuple[str, int], str]:
    """What each scheduler decided for each task, by (scheduler, task id): its schedule's JSON, or
    "not scheduled (<state>)" for a task that has none (blocked)."""
    return {(r["scheduler"], int(r["task_id"])): r["schedule_json"] or f"not scheduled ({r['state']})"
            for r in _rows(conn, "SELECT t.scheduler, t.task_id, t.state, s.schedule_json FROM tasks t LEFT JOIN "
                           "schedules s USING (run_id, scheduler, task_id) WHERE t.run_id = ?", (run_id,))}


# -- rounds ----------------------------------------------------------------------------------------
def rounds(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every round of the run, by scheduler, task and round."""
    return _rows(conn, "SELECT * FROM rounds WHERE run_id = ? ORDER BY scheduler, task_id, round", (run_id,))


def round_latencies(conn: sqlite3.Connection, run_id: int, scheduler: str | None = None) -> list[dict[str, Any]]:
    """(scheduler, latency_s) of every round, by scheduler and latency; of one scheduler if given."""
    if scheduler is None:
        return _rows(conn, "SELECT scheduler, latency_s FROM rounds WHERE run_id = ? ORDER BY scheduler, latency_s",
                     (run_id,))
    return _rows(conn, "SELECT scheduler, latency_s FROM rounds WHERE run_id = ? AND scheduler = ?",
                 (run_id, scheduler))


def round_figures(conn: sqlite3.Connection, run_id: int, scheduler: str, task_id: int,
                  round_: int) -> dict[str, Any] | None:
    """latency_s, broadcast_s, train_s, upload_s and accuracy of one round; None if not recorded."""
    rows = _rows(conn, "SELECT latency_s, broadcast_s, train_s, upload_s, accuracy FROM rounds WHERE run_id = ? "
                 "AND scheduler = ? AND task_id = ? AND round = ?", (run_id, scheduler, task_id, round_))
    return rows[0] if rows else None


def task_latencies(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Per scheduled task that completed a round and was not blocked: scheduler, task_id, n_locals,
    reserved_mbps, and its mean round latency without stragglers (clean_s) and over all (all_s)."""
    return _rows(
        conn,
        "SELECT s.scheduler, s.task_id, t.n_locals, s.reserved_mbps, "
        "AVG(CASE WHEN r.stragglers = 0 THEN r.latency_s END) AS clean_s, AVG(r.latency_s) AS all_s "
        "FROM schedules s JOIN tasks t USING (run_id, scheduler, task_id) "
        "JOIN rounds r USING (run_id, scheduler, task_id) WHERE s.run_id = ? AND t.state != 'blocked' "
        "GROUP BY s.scheduler, s.task_id ORDER BY s.scheduler, s.task_id", (run_id,))


def round_selections(conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every recorded round with its selection, of every run in the database: run_id, scheduler,
    task_id, round, policy, selected (list, decoded), upload_bytes, latency_s, accuracy."""
    rows = _rows(
        conn,
        "SELECT s.run_id, s.scheduler, s.task_id, s.round, s.policy, s.selected_json, s.upload_bytes, "
        "r.latency_s, r.accuracy FROM round_selection s JOIN rounds r USING (run_id, scheduler, task_id, round) "
        "ORDER BY s.run_id, s.scheduler, s.task_id, s.round")
    for r in rows:
        r["selected"] = json.loads(r.pop("selected_json"))
    return rows


# -- per node --------------------------------------------------------------------------------------
def timeline_candidates(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Tasks with `node_rounds` rows: scheduler, task_id, n_locals, state, arrival_s."""
    return _rows(
        conn,
        "SELECT t.scheduler, t.task_id, t.n_locals, t.state, t.arrival_s FROM tasks t WHERE t.run_id = ? "
        "AND EXISTS (SELECT 1 FROM node_rounds n WHERE n.run_id = t.run_id AND n.scheduler = t.scheduler "
        "AND n.task_id = t.task_id)", (run_id,))


def node_rounds(conn: sqlite3.Connection, run_id: int, scheduler: str, task_id: int) -> list[dict[str, Any]]:
    """Every `node_rounds` row of a task, by round and site."""
    return _rows(conn, "SELECT * FROM node_rounds WHERE run_id = ? AND scheduler = ? AND task_id = ? "
                 "ORDER BY round, site", (run_id, scheduler, task_id))


def global_rounds_done(conn: sqlite3.Connection, run_id: int, scheduler: str, task_id: int,
                       t: float) -> list[dict[str, Any]]:
    """(round, sent_s) of each round G aggregated by `t`, in round order."""
    return _rows(conn, "SELECT round, sent_s FROM node_rounds WHERE run_id = ? AND scheduler = ? AND task_id = ?"
                 " AND role = 'global' AND sent_s IS NOT NULL AND sent_s <= ? ORDER BY round",
                 (run_id, scheduler, task_id, t))


# -- links and samples -----------------------------------------------------------------------------
def link_stats(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every link load sample (t_s, a, b, rate_mbps, ai_mbps, background_mbps, capacity_mbps, up) in time order."""
    return _rows(conn, "SELECT t_s, a, b, rate_mbps, ai_mbps, background_mbps, capacity_mbps, up FROM link_stats "
                 "WHERE run_id = ? ORDER BY t_s", (run_id,))


def link_loads_at(conn: sqlite3.Connection, run_id: int, t: float) -> list[dict[str, Any]]:
    """Every directed link's last load sample at or before `t`."""
    return _rows(
        conn,
        "SELECT a, b, rate_mbps, ai_mbps, background_mbps, capacity_mbps, up, t_s FROM link_stats "
        "WHERE run_id = ? AND t_s = (SELECT max(t_s) FROM link_stats WHERE run_id = ? AND t_s <= ?)",
        (run_id, run_id, t))


def samples(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every sample of the online mode, by scheduler and time."""
    return _rows(conn, "SELECT * FROM samples WHERE run_id = ? ORDER BY scheduler, t_s", (run_id,))


def site_cpu_s(conn: sqlite3.Connection, run_id: int, scheduler: str) -> dict[str, float]:
    """CPU seconds each site's server used over the scheduler's samples (last minus first), by site."""
    rows = _rows(conn, "SELECT site, MAX(cpu_s) - MIN(cpu_s) AS cpu FROM site_samples WHERE run_id = ? "
                 "AND scheduler = ? GROUP BY site ORDER BY site", (run_id, scheduler))
    return {r["site"]: r["cpu"] for r in rows}


# -- faults and moves ------------------------------------------------------------------------------
def has_faults_or_moves(conn: sqlite3.Connection, run_id: int) -> bool:
    """Whether the run recorded an injected event or a move."""
    return bool(_rows(conn, "SELECT 1 FROM faults WHERE run_id = ? UNION SELECT 1 FROM moves WHERE run_id = ?",
                      (run_id, run_id)))


def faults(conn: sqlite3.Connection, run_id: int, scheduler: str | None = None) -> list[dict[str, Any]]:
    """The run's injected events by scheduler and time; of one scheduler (unordered) if given."""
    if scheduler is None:
        return _rows(conn, "SELECT * FROM faults WHERE run_id = ? ORDER BY scheduler, at_s", (run_id,))
    return _rows(conn, "SELECT * FROM faults WHERE run_id = ? AND scheduler = ?", (run_id, scheduler))


def moves(conn: sqlite3.Connection, run_id: int, scheduler: str | None = None) -> list[dict[str, Any]]:
    """The run's moves by scheduler, task and move; of one scheduler (unordered) if given."""
    if scheduler is None:
        return _rows(conn, "SELECT * FROM moves WHERE run_id = ? ORDER BY scheduler, task_id, move", (run_id,))
    return _rows(conn, "SELECT * FROM moves WHERE run_id = ? AND scheduler = ?", (run_id, scheduler))


# -- fidelity (orchestrator.results.fidelity) ----------------------------------------------------------
def point_hops(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every broadcast hop of the run's tasks, with the task's scheduler and number of locals."""
    return _rows(conn, "SELECT h.scheduler, t.n_locals, h.hop_s, h.chunk_s, h.floor_s, h.overhead_s FROM hops h "
                       "JOIN tasks t ON t.run_id = h.run_id AND t.scheduler = h.scheduler AND t.task_id = h.task_id "
                       "WHERE h.run_id = ?", (run_id,))


def point_hop_chains(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every broadcast hop of the run's tasks with its parent and its round's latency (`hop_chains`)."""
    return _rows(conn, "SELECT h.scheduler, t.n_locals, h.task_id, h.round, h.parent, h.child, h.overhead_s, r.latency_s "
                       "FROM hops h JOIN tasks t ON t.run_id = h.run_id AND t.scheduler = h.scheduler AND t.task_id = "
                       "h.task_id JOIN rounds r ON r.run_id = h.run_id AND r.scheduler = h.scheduler AND r.task_id = "
                       "h.task_id AND r.round = h.round WHERE h.run_id = ?", (run_id,))


def point_overruns(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every training overrun of the run's tasks, with the task's scheduler and number of locals."""
    return _rows(conn, "SELECT o.scheduler, t.n_locals, o.real_s, o.modelled_s FROM overruns o "
                       "JOIN tasks t ON t.run_id = o.run_id AND t.scheduler = o.scheduler AND t.task_id = o.task_id "
                       "WHERE o.run_id = ?", (run_id,))


def point_overrun_delays(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Per point, its done tasks' rounds' summed latency (``latency_s``) and the most their overruns can
    have added to it (``delay_s``): per round its largest overrun (trainings run side by side), summed.
    Only done tasks: their overruns are recorded with their result, a failed task's are not."""
    return _rows(conn, "SELECT r.scheduler, t.n_locals, SUM(r.latency_s) AS latency_s, SUM(COALESCE(o.late, 0)) "
                       "AS delay_s FROM rounds r JOIN tasks t ON t.run_id = r.run_id AND t.scheduler = r.scheduler "
                       "AND t.task_id = r.task_id LEFT JOIN (SELECT scheduler, task_id, round, MAX(real_s - modelled_s) "
                       "AS late FROM overruns WHERE run_id = ? GROUP BY scheduler, task_id, round) o ON o.scheduler = "
                       "r.scheduler AND o.task_id = r.task_id AND o.round = r.round WHERE r.run_id = ? AND t.state = 'done' "
                       "GROUP BY r.scheduler, t.n_locals", (run_id, run_id))


def point_link_rates(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every saturated link-round of the run's tasks (expected over measured time: ``rate_share``),
    with the task's scheduler and number of locals."""
    return _rows(conn, "SELECT l.scheduler, t.n_locals, l.expected_s / l.measured_s AS rate_share FROM link_rates l "
                       "JOIN tasks t ON t.run_id = l.run_id AND t.scheduler = l.scheduler AND t.task_id = l.task_id "
                       "WHERE l.run_id = ?", (run_id,))


def point_bound_ratios(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every round of the run's tasks with a lower bound: its latency over the bound (``ratio``), with
    the task's scheduler and number of locals."""
    return _rows(conn, "SELECT r.scheduler, t.n_locals, r.latency_s / r.lower_bound_s AS ratio FROM rounds r "
                       "JOIN tasks t ON t.run_id = r.run_id AND t.scheduler = r.scheduler AND t.task_id = r.task_id "
                       "WHERE r.run_id = ? AND r.lower_bound_s > 0", (run_id,))


def point_training_use(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Per point, the largest share of its modelled time a node-round's real training used (``use``)."""
    return _rows(conn, "SELECT r.scheduler, t.n_locals, MAX(r.real_s / r.modelled_s) AS use FROM trainings r "
                       "JOIN tasks t ON t.run_id = r.run_id AND t.scheduler = r.scheduler AND t.task_id = r.task_id "
                       "WHERE r.run_id = ? AND r.modelled_s > 0 GROUP BY r.scheduler, t.n_locals", (run_id,))


def point_trainings(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Per point, how many node-rounds trained (a local's training in a round that it logged)."""
    return _rows(conn, "SELECT n.scheduler, t.n_locals, COUNT(*) AS trained FROM node_rounds n "
                       "JOIN tasks t ON t.run_id = n.run_id AND t.scheduler = n.scheduler AND t.task_id = n.task_id "
                       "WHERE n.run_id = ? AND n.train_end_s IS NOT NULL GROUP BY n.scheduler, t.n_locals",
                 (run_id,))


def host_busy(conn: sqlite3.Connection, run_id: int) -> list[float]:
    """The host's CPU busy share, sample by sample, over the run."""
    return [float(r["cpu_busy"]) for r in _rows(conn, "SELECT cpu_busy FROM host_samples WHERE run_id = ? "
                                                      "ORDER BY t_s", (run_id,))]


def last_completed_run(conn: sqlite3.Connection, engine: str) -> int | None:
    """The newest completed run of `engine` (``emulation`` or ``simulation``), or None."""
    rows = _rows(conn, "SELECT id FROM runs WHERE engine = ? AND status = 'completed' ORDER BY id DESC LIMIT 1",
                 (engine,))
    return int(rows[0]["id"]) if rows else None


def trainings_at(conn: sqlite3.Connection, run_id: int, n_locals: int) -> int:
    """How many node-rounds trained in the run's tasks of `n_locals` locals."""
    return int(_rows(conn, "SELECT COUNT(*) AS n FROM node_rounds nr JOIN tasks t USING (run_id, scheduler, task_id) "
                           "WHERE nr.run_id = ? AND t.n_locals = ? AND nr.train_start_s IS NOT NULL",
                     (run_id, n_locals))[0]["n"])


def overrun_ratios(conn: sqlite3.Connection, run_id: int, n_locals: int) -> list[float]:
    """Real over modelled training time of every overrun in the run's tasks of `n_locals` locals."""
    return [float(r["r"]) for r in _rows(
        conn, "SELECT o.real_s / o.modelled_s AS r FROM overruns o JOIN tasks t USING (run_id, scheduler, task_id) "
              "WHERE o.run_id = ? AND t.n_locals = ? AND o.modelled_s > 0", (run_id, n_locals))]


def training_spans(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every node-round's training: its task and round, start, real seconds (its overrun's, else
    None: it held until the modelled end) and modelled seconds (None when it held: not recorded)."""
    return _rows(conn, "SELECT nr.scheduler, nr.task_id, nr.round, nr.site, nr.train_start_s AS start, "
                       "nr.train_end_s AS end_s, o.real_s AS real_s, o.modelled_s AS modelled_s FROM node_rounds nr "
                       "LEFT JOIN overruns o USING (run_id, scheduler, task_id, round, site) "
                       "WHERE nr.run_id = ? AND nr.train_start_s IS NOT NULL AND nr.train_end_s IS NOT NULL",
                 (run_id,))


def point_parts(conn: sqlite3.Connection, run_id: int) -> dict[tuple[str, int], dict[str, float]]:
    """Per (scheduler, locals), the mean over the done tasks' rounds of each part of the round's
    critical path (`summaries.summarize`: broadcast to the local whose training ended last, its
    training, the upload after it), and of the trainings' own spans over every local."""
    out: dict[tuple[str, int], dict[str, float]] = {}
    for r in _rows(conn, "SELECT r.scheduler, t.n_locals, AVG(r.broadcast_s) AS broadcast_s, AVG(r.train_s) AS "
                         "train_s, AVG(r.upload_s) AS upload_s FROM rounds r JOIN tasks t USING (run_id, scheduler, "
                         "task_id) WHERE r.run_id = ? AND t.state = 'done' GROUP BY r.scheduler, t.n_locals", (run_id,)):
        out[(str(r["scheduler"]), int(r["n_locals"]))] = {k: float(r[k]) for k in ("broadcast_s", "train_s", "upload_s")}
    for r in _rows(conn, "SELECT n.scheduler, t.n_locals, AVG(n.train_end_s - n.train_start_s) AS s FROM node_rounds n "
                         "JOIN tasks t USING (run_id, scheduler, task_id) WHERE n.run_id = ? AND t.state = 'done' "
                         "AND n.train_start_s IS NOT NULL AND n.train_end_s IS NOT NULL "
                         "GROUP BY n.scheduler, t.n_locals", (run_id,)):
        out.setdefault((str(r["scheduler"]), int(r["n_locals"])), {})["training_span_s"] = float(r["s"])
    return out


# -- durability: whole tasks, owners, resumes (orchestrator.results.durability) --------------------------
def table_sql(conn: sqlite3.Connection, table: str) -> str | None:
    """The CREATE statement `table` was made with; None when it does not exist."""
    row = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", (table,)).fetchone()
    return None if row is None else str(row[0])


def run_owner(conn: sqlite3.Connection, run_id: int) -> tuple[str, str] | None:
    """The run's (status, owner stamp); None if there is no such run."""
    row = conn.execute("SELECT status, owner FROM runs WHERE id = ?", (run_id,)).fetchone()
    return None if row is None else (str(row[0]), str(row[1] or ""))


def running_run_ids(conn: sqlite3.Connection) -> list[int]:
    """The ids of the runs whose status is ``running``."""
    return [int(r[0]) for r in conn.execute("SELECT id FROM runs WHERE status = 'running' ORDER BY id").fetchall()]


def incomplete_tasks(conn: sqlite3.Connection, run_id: int) -> list[tuple[str, int]]:
    """The run's tasks whose record is not whole (scheduler, task id), by task id."""
    rows = conn.execute("SELECT scheduler, task_id FROM tasks WHERE run_id = ? AND complete = 0 "
                        "ORDER BY task_id, scheduler", (run_id,)).fetchall()
    return [(str(r[0]), int(r[1])) for r in rows]


def recorded_tasks(conn: sqlite3.Connection, run_id: int) -> dict[tuple[str, int], dict[str, Any]]:
    """The run's whole task records by (scheduler, task id): their state and schedule (JSON, or None
    for a task that never got one)."""
    rows = conn.execute(
        "SELECT t.scheduler, t.task_id, t.state, s.schedule_json FROM tasks t LEFT JOIN schedules s ON "
        "s.run_id = t.run_id AND s.scheduler = t.scheduler AND s.task_id = t.task_id "
        "WHERE t.run_id = ? AND t.complete = 1", (run_id,)).fetchall()
    return {(str(r[0]), int(r[1])): {"state": str(r[2]), "schedule": None if r[3] is None else json.loads(r[3])}
            for r in rows}


def last_event_s(conn: sqlite3.Connection, run_id: int) -> float:
    """The run's latest task event on its clock (0 with none)."""
    row = conn.execute("SELECT max(t_s) FROM task_events WHERE run_id = ?", (run_id,)).fetchone()
    return float(row[0] or 0.0)


def task_count(conn: sqlite3.Connection, run_id: int) -> int:
    """How many task records (scheduler, task) the run holds."""
    return int(conn.execute("SELECT count(*) FROM tasks WHERE run_id = ?", (run_id,)).fetchone()[0])


def resumes(conn: sqlite3.Connection, run_id: int) -> list[dict[str, Any]]:
    """Every resume of the run, in order (at: Unix time; previous_status, kept, discarded)."""
    if not columns(conn, "resumes"):
        return []
    rows = conn.execute("SELECT at, previous_status, kept, discarded FROM resumes WHERE run_id = ? ORDER BY at",
                        (run_id,)).fetchall()
    return [{"at": float(r[0]), "previous_status": str(r[1]), "kept": int(r[2]), "discarded": int(r[3])}
            for r in rows]


def task_ends(conn: sqlite3.Connection, run_id: int) -> dict[tuple[str, int], int]:
    """How many times each task of the run reached an end state (done, blocked, failed) in
    `task_events`: more than once means it ran again after it had ended."""
    rows = conn.execute("SELECT scheduler, task_id, count(*) FROM task_events WHERE run_id = ? AND state IN "
                        "('done', 'blocked', 'failed') GROUP BY scheduler, task_id", (run_id,)).fetchall()
    return {(str(r[0]), int(r[1])): int(r[2]) for r in rows}


def discarded_count(conn: sqlite3.Connection, run_id: int) -> int:
    """How many half-recorded task runs the run discarded (``discarded`` events in `task_events`)."""
    return int(conn.execute("SELECT count(*) FROM task_events WHERE run_id = ? AND state = 'discarded'",
                            (run_id,)).fetchone()[0])
