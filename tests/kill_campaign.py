"""The kill campaign (issue 48): `netai experiment` killed with SIGKILL at seeded moments, its results
database checked after every kill, the run resumed until it completes, and the result compared with
an uninterrupted run of the same config.

The moments are seeded (`plan_kills`) and bounded in number and in time: each is either a time after
the process starts (uniform up to the uninterrupted run's own wall time) or the moment the database
first holds some number of whole task records (polled read-only), so that kills land inside the
recording too and not only in the seconds of set-up. A *chain* starts a fresh run and kills it and
each of its resumes in turn, then lets the last resume finish; the campaign is a few chains.

After every kill (`check_whole`): ``PRAGMA integrity_check`` passes; every task marked whole has all
of its rows (its end state; a done task its schedule and one row per round); once the run is found
crashed (`durability.reap`) it holds no half-recorded task and is marked ``crashed``. After each
chain (`compare`): the task sets are the uninterrupted run's, no task reached an end twice
(`task_events`), and the mst/spff latency and bandwidth paired ratios lie in the uninterrupted run's
95 % confidence intervals.

The process is started in a session of its own and the whole session is killed, so that the
simulation's engine processes (its children) die with it and nothing is left running.
"""

from __future__ import annotations

import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.results import durability
from orchestrator.results.db import ResultsDB
from orchestrator.results.stats import paired_ratio
from orchestrator.results.summary import run_summary

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Kill:
    """One seeded moment: `after_s` seconds after the process starts, or once the database holds
    `after_tasks` whole task records (whichever the kill is planned by)."""

    after_s: float | None = None
    after_tasks: int | None = None


@dataclass
class KillResult:
    kill: Kill
    phase: str  # before the database / while running / after it finished (the process ended first)
    whole: int
    discarded: int
    problems: list[str] = field(default_factory=list)


def plan_kills(seed: int, n: int, *, wall_s: float, task_runs: int) -> list[Kill]:
    """`n` seeded moments, alternately a time (uniform in [0.5, wall_s]) and a count of whole task
    records (uniform in [0, task_runs - 1])."""
    rng = random.Random(seed)
    return [Kill(after_s=round(rng.uniform(0.5, wall_s), 3)) if i % 2 == 0
            else Kill(after_tasks=rng.randrange(0, max(1, task_runs))) for i in range(n)]


def _whole_tasks(db_path: Path) -> int:
    """Whole task records in the database now (read-only; 0 while it cannot be read)."""
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=0.2)
        try:
            return int(conn.execute("SELECT count(*) FROM tasks WHERE complete = 1").fetchone()[0])
        finally:
            conn.close()
    except sqlite3.Error:
        return 0


def run_killed(argv: Sequence[str], kill: Kill, find_db: Callable[[], Path | None], *, limit_s: float,
               env: Mapping[str, str], total: int) -> str:
    """Run `argv` and SIGKILL its session at `kill` (`find_db`: the run's database once it exists; a
    count of whole tasks is counted on top of those it had, up to `total` - 1); the phase it was
    killed in (``done``: it ended first)."""
    db_path = find_db()
    base = _whole_tasks(db_path) if db_path is not None else 0  # a resume's tasks so far: the count is on top
    target = None if kill.after_tasks is None else min(base + kill.after_tasks, max(total - 1, base))
    proc = subprocess.Popen(list(argv), cwd=ROOT, env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    t0 = time.monotonic()
    try:
        while proc.poll() is None and time.monotonic() - t0 < limit_s:
            if kill.after_s is not None and time.monotonic() - t0 >= kill.after_s:
                break
            db_path = find_db()
            if target is not None and db_path is not None and _whole_tasks(db_path) >= target and \
                    (target > base or _whole_tasks_seen_reopen(db_path)):
                break
            time.sleep(0.01)
        if proc.poll() is not None:
            return "done"
        phase = "running" if find_db() is not None else "before the database"
        os.killpg(proc.pid, signal.SIGKILL)
        return phase
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _whole_tasks_seen_reopen(db_path: Path) -> bool:
    """Whether the run in `db_path` is running again (a resume reopened it): a kill planned at a count
    of whole tasks it already has lands then, not before the resume started."""
    try:
        conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=0.2)
        try:
            return conn.execute("SELECT status FROM runs ORDER BY id DESC LIMIT 1").fetchone()[0] == "running"
        finally:
            conn.close()
    except (sqlite3.Error, TypeError):
        return False


def check_whole(db_path: Path) -> tuple[list[str], int, int]:
    """The problems a killed run's database shows (none expected), its whole task records and the
    half-recorded ones discarded when it is found crashed."""
    problems: list[str] = []
    conn = sqlite3.connect(db_path)
    try:
        ok = conn.execute("PRAGMA integrity_check").fetchone()[0]
        if ok != "ok":
            problems.append(f"integrity_check: {ok}")
        problems += _half_tasks(conn)
    finally:
        conn.close()
    with ResultsDB(db_path) as db:
        run_id = int(db.query("SELECT max(id) AS id FROM runs")[0]["id"])
        durability.reap(db.conn, run_id)
        run = db.run(run_id)
        left = db.query("SELECT count(*) AS n FROM tasks WHERE run_id = ? AND complete = 0", (run_id,))[0]["n"]
        whole = db.query("SELECT count(*) AS n FROM tasks WHERE run_id = ?", (run_id,))[0]["n"]
        discarded = db.query("SELECT count(*) AS n FROM task_events WHERE run_id = ? AND state = 'discarded'",
                             (run_id,))[0]["n"]
    if run["status"] == "running":
        problems.append("the killed run is still marked running")
    if left:
        problems.append(f"{left} half-recorded tasks left after the run was found crashed")
    return problems, int(whole), int(discarded)


def _half_tasks(conn: sqlite3.Connection) -> list[str]:
    """Tasks marked whole that lack rows: an end state, and for a done task its schedule and every round."""
    rows = conn.execute(
        "SELECT t.scheduler, t.task_id, t.state, t.rounds, (SELECT count(*) FROM rounds r WHERE r.run_id = t.run_id "
        "AND r.scheduler = t.scheduler AND r.task_id = t.task_id) AS got, (SELECT count(*) FROM schedules s "
        "WHERE s.run_id = t.run_id AND s.scheduler = t.scheduler AND s.task_id = t.task_id) AS sched "
        "FROM tasks t WHERE t.complete = 1").fetchall()
    out = []
    for sched, task_id, state, rounds, got, has_schedule in rows:
        if state not in ("done", "failed", "blocked"):
            out.append(f"{sched} task {task_id} marked whole in state {state}")
        elif state == "done" and (got != rounds or not has_schedule):
            out.append(f"{sched} task {task_id} done but {got} of {rounds} rounds, schedule {has_schedule}")
    return out


def task_set(db_path: Path) -> set[tuple[Any, ...]]:
    """The run's task runs as (scheduler, task id, locals, G, local sites, state)."""
    with ResultsDB(db_path) as db:
        return {tuple(r.values()) for r in db.query(
            "SELECT scheduler, task_id, n_locals, global_site, local_sites_json, state FROM tasks")}


def compare(resumed: Path, reference: Path, *, flexible: str = "mst", fixed: str = "spff") -> list[str]:
    """How the resumed run's database differs from the uninterrupted one's (none expected)."""
    problems = []
    if task_set(resumed) != task_set(reference):
        problems.append("task sets differ")
    with ResultsDB(resumed) as db:
        ends = db.query("SELECT scheduler, task_id, count(*) AS n FROM task_events WHERE state IN ('done', "
                        "'failed', 'blocked') GROUP BY scheduler, task_id HAVING n > 1")
        status = db.run(1)["status"]
        ours = run_summary(db, 1)
    if ends:
        problems.append(f"{len(ends)} task(s) reached an end twice: {ends[:3]}")
    if status != "completed":
        problems.append(f"the resumed run is {status}")
    with ResultsDB(reference) as db:
        ref = run_summary(db, 1)
    for n in sorted({t.n_locals for t in ref.tasks}):
        for figure in ("mean_latency_s", "reserved_mbps"):
            a = paired_ratio(ours.tasks, n_locals=n, numerator=flexible, denominator=fixed, figure=figure)
            b = paired_ratio(ref.tasks, n_locals=n, numerator=flexible, denominator=fixed, figure=figure)
            if a is None or b is None or not b.low - 1e-9 <= a.mean <= b.high + 1e-9:
                problems.append(f"{figure} {flexible}/{fixed} at {n} locals: {a and a.mean} outside "
                                f"[{b and b.low}, {b and b.high}]")
    return problems


def netai(*args: str) -> list[str]:
    """The command line of `netai` with `args` (this interpreter, the checkout's code)."""
    return [sys.executable, "-m", "orchestrator.cli", *args]


@dataclass
class Chain:
    """One fresh run killed again and again, then resumed to its end."""

    run_dir: Path | None
    kills: list[KillResult]
    problems: list[str]


def run_chain(config: Path, out: Path, kills: Sequence[Kill], *, extra: Sequence[str], limit_s: float,
              env: Mapping[str, str], total: int, check_after: Callable[[], list[str]] = list) -> Chain:
    """Start `config` in `out` and kill it at `kills[0]`, resume and kill it at `kills[1]`, ... then
    resume it to its end; the database checked after every kill, and `check_after` (e.g. what the
    killed runs left on the machine, which the next run must clean) once the chain is done."""
    run_dir: Path | None = None
    results: list[KillResult] = []

    def find_db() -> Path | None:
        found = sorted(out.glob("*/results.db")) if run_dir is None else [run_dir / "results.db"]
        return found[0] if found and found[0].exists() else None

    def command() -> list[str]:
        return netai("experiment", *(["--resume", str(run_dir)] if run_dir else [str(config), "--out", str(out)]),
                     *extra)

    for kill in kills:
        phase = run_killed(command(), kill, find_db, limit_s=limit_s, env=env, total=total)
        db_path = find_db()
        problems, whole, discarded = check_whole(db_path) if db_path is not None and _has_run(db_path) \
            else ([], 0, 0)
        if db_path is not None and _has_run(db_path):
            run_dir = db_path.parent
        elif db_path is not None:  # killed between creating the database and recording the run: start again
            _remove_tree(db_path.parent)
        results.append(KillResult(kill, phase, whole, discarded, problems))
    final = subprocess.run(command(), cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=limit_s * 4)
    if final.returncode != 0:
        return Chain(run_dir, results, [f"the last resume exited {final.returncode}: {final.stderr[-500:]}"])
    if run_dir is None:
        run_dir = sorted(out.glob("*/results.db"))[0].parent
    return Chain(run_dir, results, check_after())


def _has_run(db_path: Path) -> bool:
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        return conn.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path)


def campaign(config: Path, out: Path, *, seed: int, chains: int, kills_per_chain: int, extra: Sequence[str] = (),
             env: Mapping[str, str] | None = None, limit_s: float = 300.0,
             check_after: Callable[[], list[str]] = list) -> tuple[Path, list[Chain], list[str]]:
    """The uninterrupted run of `config`, then `chains` chains of `kills_per_chain` seeded kills each;
    (the uninterrupted run's folder, the chains, the problems: none expected)."""
    env = dict(os.environ if env is None else env)
    ref_out = out / "uninterrupted"
    t0 = time.monotonic()
    done = subprocess.run(netai("experiment", str(config), "--out", str(ref_out), *extra), cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=limit_s)
    wall_s = time.monotonic() - t0
    if done.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed: {done.stderr[-1000:]}")
    reference = sorted(ref_out.glob("*/results.db"))[0]
    task_runs = len(task_set(reference))
    problems = check_after()
    out_chains = []
    for c in range(chains):
        kills = plan_kills(seed * 1000 + c, kills_per_chain, wall_s=wall_s, task_runs=task_runs)
        chain = run_chain(config, out / f"chain-{c}", kills, extra=extra, limit_s=limit_s, env=env,
                          total=task_runs, check_after=check_after)
        for k in chain.kills:
            problems += [f"chain {c}, kill {k.kill}: {p}" for p in k.problems]
        problems += [f"chain {c}: {p}" for p in chain.problems]
        if chain.run_dir is not None and not chain.problems:
            problems += [f"chain {c}: {p}" for p in compare(chain.run_dir / "results.db", reference)]
        out_chains.append(chain)
    return reference.parent, out_chains, problems


def table(chains: Sequence[Chain]) -> list[str]:
    """One line per kill: the chain, the moment, the phase, the whole tasks and those discarded so far."""
    lines = ["chain  kill  moment                 phase                whole  discarded"]
    for c, chain in enumerate(chains):
        for i, k in enumerate(chain.kills):
            moment = f"{k.kill.after_s:.2f} s" if k.kill.after_s is not None else f"{k.kill.after_tasks} whole tasks"
            lines.append(f"{c:>5}  {i:>4}  {moment:<21}  {k.phase:<19}  {k.whole:>5}  {k.discarded:>9}")
    return lines


def processes_naming(text: str) -> list[int]:
    """The pids of the processes whose command line contains `text` (e.g. a test's folder)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and proc.name != str(os.getpid()):
            try:
                if text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def sim_leftovers(root: Path) -> list[str]:
    """What killed simulated runs under `root` left: engine files, or processes still running."""
    return [f"left {p}" for p in sorted(root.glob("**/netai-sim-*"))] + \
        [f"process {pid} still runs" for pid in processes_naming(str(root))]
