"""The results database's schema: its tables (SQLite DDL) and the values some of their columns take.

Shared by the writer (`orchestrator.results.db`), which creates the tables, and the readers
(`orchestrator.results.queries`), which name them. Nothing here opens a database.
"""

from __future__ import annotations

SCHEMA_VERSION = 2
#: Columns added to a table after its creation, with their type: `ResultsDB` adds those an older
#: database lacks (NULL in its rows: not measured then; a database from before runs had an engine
#: held emulated runs only).
ADDED_COLUMNS = {"runs": (("engine", "TEXT NOT NULL DEFAULT 'emulation'"), ("owner", "TEXT NOT NULL DEFAULT ''"),
                          ("source_json", "TEXT NOT NULL DEFAULT '{}'")),
                 "tasks": (("sent_bytes", "INTEGER"), ("retrans_bytes", "INTEGER"),
                           ("complete", "INTEGER NOT NULL DEFAULT 0"))}
#: ``crashed``: the run was found ``running`` with its process gone (killed, a crash, a reboot;
#: `orchestrator.results.durability`).
RUN_STATUSES = ("running", "completed", "interrupted", "failed", "crashed")
#: States a task ends in: its record is whole once one of them is committed (`tasks.complete`).
END_STATES = ("done", "blocked", "failed")
ENGINES = ("emulation", "simulation")
TASK_STATES = ("pending", "scheduled", "running", "done", "blocked", "failed")
#: How a `faults` row's detail starts for an event the trace ended before (recorded, never applied).
NOT_APPLIED = "not applied"

SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    config_json TEXT NOT NULL,
    environment_json TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'interrupted', 'failed', 'crashed')),
    started_at REAL NOT NULL,
    finished_at REAL,
    note TEXT NOT NULL DEFAULT '',
    -- emulation (Mininet, real workers) or simulation (the flow-level model, orchestrator/simulation)
    engine TEXT NOT NULL DEFAULT 'emulation',
    -- the process running it, 'host pid boot-id start-ticks' (a running run whose process is gone crashed)
    owner TEXT NOT NULL DEFAULT '',
    -- what `netai experiment --resume` checks: the config file, the overrides and the config as started
    source_json TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS topology (
    run_id INTEGER PRIMARY KEY REFERENCES runs(id),
    name TEXT NOT NULL,
    model_json TEXT NOT NULL,
    plan_json TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS tasks (
    run_id INTEGER NOT NULL REFERENCES runs(id),
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    n_locals INTEGER NOT NULL,
    global_site TEXT NOT NULL,
    local_sites_json TEXT NOT NULL,
    model TEXT NOT NULL,
    rounds INTEGER NOT NULL,
    demand_mbps REAL NOT NULL,
    model_bytes INTEGER NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'scheduled', 'running', 'done', 'blocked', 'failed')),
    reason TEXT NOT NULL DEFAULT '',
    carried_bytes INTEGER,
    setup_json TEXT NOT NULL DEFAULT '{}',
    -- seconds since the run's clock started (the emulation and the site servers up)
    arrival_s REAL,
    admitted_s REAL,
    first_broadcast_s REAL,
    finished_s REAL,
    -- admission (placed on the live state) to G's first broadcast byte: flows, roles, connections
    start_overhead_s REAL,
    -- the kernel's TCP data bytes its agents' connections sent (retransmissions included) and
    -- retransmitted (tcp_info); NULL: not measured (the simulation has no TCP: always NULL)
    sent_bytes INTEGER,
    retrans_bytes INTEGER,
    -- 1 once the task's record is whole: set in the one transaction that writes its end (its end state,
    -- rounds, figures); 0 while it runs. A run that is not running holds complete tasks only.
    complete INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, scheduler, task_id)
);
CREATE TABLE IF NOT EXISTS schedules (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    schedule_json TEXT NOT NULL,
    reserved_mbps REAL NOT NULL,
    lower_bound_s REAL,
    PRIMARY KEY (run_id, scheduler, task_id)
);
CREATE TABLE IF NOT EXISTS rounds (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    latency_s REAL NOT NULL,
    broadcast_s REAL NOT NULL,
    train_s REAL NOT NULL,
    upload_s REAL NOT NULL,
    accuracy REAL,
    lower_bound_s REAL,
    stragglers INTEGER NOT NULL DEFAULT 0,
    broadcast_all_s REAL,
    upload_tail_s REAL,
    broadcast_bound_s REAL,
    upload_bound_s REAL,
    reference_s REAL,
    PRIMARY KEY (run_id, scheduler, task_id, round)
);
CREATE TABLE IF NOT EXISTS network_state (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    a TEXT NOT NULL,
    b TEXT NOT NULL,
    capacity_mbps REAL NOT NULL,
    reserved_mbps REAL NOT NULL,
    background_mbps REAL NOT NULL,
    residual_mbps REAL NOT NULL
);
-- Load of each directed emulated link a -> b, sampled about once a second while the network runs
-- (t_s on the run's clock). rate_mbps is what the port sent (all classes); ai_mbps what task
-- entries forwarded out of it, background_mbps what background entries did; capacity_mbps is the
-- link's emulated (shaped) rate. Rates are in emulated Mbit/s.
CREATE TABLE IF NOT EXISTS link_stats (
    run_id INTEGER NOT NULL,
    t_s REAL NOT NULL,
    a TEXT NOT NULL,
    b TEXT NOT NULL,
    tx_bytes INTEGER NOT NULL,
    rate_mbps REAL NOT NULL,
    ai_mbps REAL NOT NULL DEFAULT 0,
    background_mbps REAL NOT NULL DEFAULT 0,
    capacity_mbps REAL NOT NULL DEFAULT 0,
    up INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS link_stats_t ON link_stats(run_id, t_s);
-- Every state change of a task, on the run's clock (the tasks table keeps only the last one).
CREATE TABLE IF NOT EXISTS task_events (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    t_s REAL NOT NULL,
    state TEXT NOT NULL,
    reason TEXT NOT NULL DEFAULT ''
);
-- What each node of a task did in each round, on the run's clock: when the global model reached
-- it (received_s; G: the round's start), when it trained (train_start_s, train_end_s; G: none),
-- when its (aggregated) update left it (sent_s; G: when the new global model was aggregated).
-- role: global, local, relay (a site that only forwards or aggregates).
CREATE TABLE IF NOT EXISTS node_rounds (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    site TEXT NOT NULL,
    role TEXT NOT NULL,
    received_s REAL,
    train_start_s REAL,
    train_end_s REAL,
    sent_s REAL,
    PRIMARY KEY (run_id, scheduler, task_id, round, site)
);
CREATE TABLE IF NOT EXISTS samples (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    t_s REAL NOT NULL,
    running INTEGER NOT NULL,
    reserved_mbps REAL NOT NULL,
    carried_mbps REAL,
    memory_used_bytes INTEGER
);
CREATE TABLE IF NOT EXISTS site_samples (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    t_s REAL NOT NULL,
    site TEXT NOT NULL,
    cpu_s REAL NOT NULL,
    pss_bytes INTEGER NOT NULL,
    roles INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS background (
    run_id INTEGER NOT NULL,
    src TEXT NOT NULL,
    dst TEXT NOT NULL,
    offered_mbps REAL NOT NULL,
    achieved_mbps REAL
);
-- The background the schedulers were told (orchestrator/emulation/background_view.py), per measurement:
-- task_id the task it was measured for, every scheduler of which got it (NULL: arrivals or re-scheduling
-- looks); total_mbps summed over directed links (model Mbit/s); cv its coefficient of variation over the
-- window's pieces (NULL: nothing moved); settled whether it settled before the timeout.
CREATE TABLE IF NOT EXISTS background_views (
    run_id INTEGER NOT NULL, task_id INTEGER, t_s REAL NOT NULL, window_s REAL NOT NULL,
    pieces INTEGER NOT NULL, total_mbps REAL NOT NULL, cv REAL, settled INTEGER NOT NULL,
    waited_s REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS faults (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    at_s REAL NOT NULL,
    action TEXT NOT NULL,
    target TEXT NOT NULL,
    ok INTEGER NOT NULL,
    detail TEXT NOT NULL DEFAULT '',
    took_s REAL
);
CREATE TABLE IF NOT EXISTS moves (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    move INTEGER NOT NULL,
    at_s REAL NOT NULL,
    reason TEXT NOT NULL,
    old_schedule_json TEXT NOT NULL,
    new_schedule_json TEXT,
    resumed_round INTEGER NOT NULL,
    last_round_end_s REAL,
    next_round_start_s REAL,
    interruption_s REAL,
    old_bound_s REAL,
    new_bound_s REAL,
    old_reserved_mbps REAL,
    new_reserved_mbps REAL,
    PRIMARY KEY (run_id, scheduler, task_id, move)
);
-- Local-model selection (docs/selection.md): per round of a task, the policy, the locals G chose
-- (JSON list; [] when the task selects none, i.e. all trained) and the bytes of every UPDATE frame.
CREATE TABLE IF NOT EXISTS round_selection (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    policy TEXT NOT NULL,
    selected_json TEXT NOT NULL,
    upload_bytes INTEGER NOT NULL,
    PRIMARY KEY (run_id, scheduler, task_id, round)
);
-- Fidelity (docs/fidelity.md, "Fidelity"): per round of a task, each broadcast hop's time, the
-- emulated network's floor for it and the rest (the instrument's overhead), seconds.
CREATE TABLE IF NOT EXISTS hops (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    parent TEXT NOT NULL,
    child TEXT NOT NULL,
    hop_s REAL NOT NULL,
    chunk_s REAL NOT NULL,
    floor_s REAL NOT NULL,
    overhead_s REAL NOT NULL,
    PRIMARY KEY (run_id, scheduler, task_id, round, child)
);
-- Per round of a task, each directed link its broadcast saturated: the bytes its copies put on it, their
-- time at the link's configured rate (expected_s) and the time the link was busy with them (measured_s).
CREATE TABLE IF NOT EXISTS link_rates (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    a TEXT NOT NULL,
    b TEXT NOT NULL,
    bytes INTEGER NOT NULL,
    expected_s REAL NOT NULL,
    measured_s REAL NOT NULL,
    PRIMARY KEY (run_id, scheduler, task_id, round, a, b)
);
-- Node-rounds whose real training ran past the emulated site's modelled time (workers.compute).
CREATE TABLE IF NOT EXISTS overruns (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    site TEXT NOT NULL,
    real_s REAL NOT NULL,
    modelled_s REAL NOT NULL,
    PRIMARY KEY (run_id, scheduler, task_id, round, site)
);
-- Every modelled node-round training: the host's real training time against the emulated site's
-- modelled time (both undilated). real_s / modelled_s near 1 is a margin too thin to trust.
CREATE TABLE IF NOT EXISTS trainings (
    run_id INTEGER NOT NULL,
    scheduler TEXT NOT NULL,
    task_id INTEGER NOT NULL,
    round INTEGER NOT NULL,
    site TEXT NOT NULL,
    real_s REAL NOT NULL,
    modelled_s REAL NOT NULL,
    PRIMARY KEY (run_id, scheduler, task_id, round, site)
);
-- The host's CPU while the run lasts (the share of both cores busy, from /proc/stat), on the run's clock.
-- Every time a run was continued (`netai experiment --resume`): when, the status it had, the tasks it kept
-- and the ones it found half recorded (discarded: they run again).
CREATE TABLE IF NOT EXISTS resumes (
    run_id INTEGER NOT NULL,
    at REAL NOT NULL,
    previous_status TEXT NOT NULL,
    kept INTEGER NOT NULL,
    discarded INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS host_samples (
    run_id INTEGER NOT NULL,
    t_s REAL NOT NULL,
    cpu_busy REAL NOT NULL
);
"""
