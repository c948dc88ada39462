"""The kill campaign (issue 48): `netai experiment` killed with SIGKILL at seeded moments, its results
database checked after every kill, the run resumed until it completes, and the result compared with
an uninterrupted run of the same config.

The moments are seeded (`next_kill`) and bounded in number and in time: each is a time in the
start-up, a time while the run is live, or the moment the database first holds some more whole task
records (polled read-only), so that kills land inside the recording too and not only in the seconds
of set-up. The last two are a seeded share of what is left of the run when its process starts (its
task records not yet whole, or as much of the uninterrupted run's live time), so that a resume's kill
lands before the resume completes as often as a fresh run's does (`Moment.place`). A *chain* starts
a fresh run and kills it and each of its resumes in turn, then lets the last resume finish; the
campaign is a few chains.

After every kill (`check_whole`): ``PRAGMA integrity_check`` passes; every task marked whole has all
of its rows (its end state; a done task its schedule and one row per round); once the run is found
crashed (`durability.reap`) it holds no half-recorded task and is marked ``crashed``. After each
chain (`compare`): the task sets are the uninterrupted run's, no task reached an end twice
(`task_events`), and the mst/spff latency and bandwidth paired ratios lie in the uninterrupted run's
95 % confidence intervals.

Those ratios are the config's only where the fidelity verdict says so (`host_flagged`): a run the host
distorted (a round's upload held up by the host's moment, trainings past their modelled time) has
figures that are the host's, flagged by the testbed itself, and two runs of the same tasks then differ
by more than the interval is wide. So the uninterrupted run is one whose verdict is faithful at every
point (measured again, up to `REFERENCE_TRIES` times), a resumed run the verdict flags has its exact
checks but not its ratios, and most of the resumed runs must be faithful and compared.

The process is started in a session of its own and the whole session is killed, so that the
simulation's engine processes (its children) die with it and nothing is left running.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.emulation.cpu_use import cmdline
from orchestrator.results import durability
from orchestrator.results.db import ResultsDB
from orchestrator.results.stats import paired_ratio
from orchestrator.results.summary import run_summary

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Kill:
    """One seeded moment as placed on a run (`Moment.place`): `after_s` seconds after the run is live
    (its database says ``running``: a fresh run recorded, or a resume reopened it), or after
    `after_tasks` more whole task records, or, with `at_start`, `after_s` seconds after the process
    starts (its start-up, before the run is live)."""

    after_s: float | None = None
    after_tasks: int | None = None
    at_start: bool = False

    def __str__(self) -> str:
        if self.after_tasks is not None:
            return f"+{self.after_tasks} whole tasks"
        return f"{self.after_s:.2f} s {'from start' if self.at_start else 'live'}"


@dataclass
class KillResult:
    kill: Kill
    phase: str  # start-up (before the run was live) / running
    whole: int
    discarded: int
    problems: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Timing:
    """An uninterrupted run's seconds from its start to live and from live to its end, and its task runs."""

    start_s: float
    live_s: float
    task_runs: int


@dataclass(frozen=True)
class Moment:
    """A seeded moment before it is placed on a run: `kind` ``start`` (a time in the start-up), ``live``
    (a time while live) or ``tasks`` (a count of more whole task records), and `u`, uniform in [0, 1)."""

    kind: str
    u: float

    def place(self, timing: Timing, whole: int) -> Kill:
        """The kill for a process whose run already holds `whole` whole task records: a share `u` of
        the uninterrupted run's start-up, or of what is left of the run (its task records not yet
        whole, or the uninterrupted run's live time in proportion to them)."""
        if self.kind == "start":
            return Kill(after_s=round(0.1 + self.u * max(0.1, timing.start_s - 0.1), 3), at_start=True)
        left = max(0, timing.task_runs - whole)
        if self.kind == "tasks":
            return Kill(after_tasks=int(self.u * left))
        return Kill(after_s=round(self.u * timing.live_s * left / max(1, timing.task_runs), 3))


def next_kill(rng: random.Random, i: int) -> Moment:
    """The `i`-th seeded moment: in turn a time while live, a count of whole tasks, a time while
    live, a count, and a time in the start-up."""
    kind = i % 5
    return Moment("tasks" if kind in (1, 3) else "start" if kind == 4 else "live", rng.random())


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


def run_killed(argv: Sequence[str], moment: Moment, timing: Timing, find_db: Callable[[], Path | None], *,
               limit_s: float, env: Mapping[str, str]) -> tuple[str, Kill]:
    """Run `argv` and SIGKILL its session at `moment`, placed on what is left of its run (`find_db`: the
    run's database once it exists); the phase it was killed in (``start-up``, ``running``), or ``done``
    when it ended first, and the kill as placed."""
    db_path = find_db()
    base = _whole_tasks(db_path) if db_path is not None else 0  # a resume's whole tasks: the count is on top
    kill = moment.place(timing, base)
    proc = subprocess.Popen(list(argv), cwd=ROOT, env=dict(env), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    t0, live_at = time.monotonic(), None
    try:
        while proc.poll() is None and time.monotonic() - t0 < limit_s:
            now = time.monotonic()
            db_path = find_db()
            if live_at is None and db_path is not None and _is_live(db_path):
                live_at = now
            if _due(kill, now - t0, live_at and now - live_at, db_path, base):
                break
            time.sleep(0.01)
        if proc.poll() is not None:
            return "done", kill
        os.killpg(proc.pid, signal.SIGKILL)
        return "running" if live_at is not None else "start-up", kill
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _due(kill: Kill, since_start: float, since_live: float | None, db_path: Path | None, base: int) -> bool:
    if kill.at_start:
        return since_start >= (kill.after_s or 0.0)
    if since_live is None or db_path is None:
        return False
    if kill.after_tasks is not None:
        return _whole_tasks(db_path) >= base + kill.after_tasks
    return since_live >= (kill.after_s or 0.0)


def _is_live(db_path: Path) -> bool:
    """Whether the run in `db_path` is running: recorded by a fresh run, or reopened by a resume (a killed
    run is found crashed before the next process starts)."""
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


#: The environment's entries that say at which K the run's tasks ran: a resume must keep them.
DILATION_KEYS = ("time_dilation", "time_dilation_per_point")


def compare(resumed: Path, reference: Path, *, flexible: str = "mst", fixed: str = "spff",
            figures: Sequence[str] = ("mean_latency_s", "reserved_mbps")) -> list[str]:
    """How the resumed run's database differs from the uninterrupted one's (none expected): the task
    sets, no task ended twice, the run completed, its time dilation (`DILATION_KEYS` of the
    environment) the uninterrupted run's, and each of `figures`' flexible / fixed ratio inside the uninterrupted
    run's 95 % interval."""
    problems = []
    if task_set(resumed) != task_set(reference):
        problems.append("task sets differ")
    with ResultsDB(resumed) as db:
        ends = db.query("SELECT scheduler, task_id, count(*) AS n FROM task_events WHERE state IN ('done', "
                        "'failed', 'blocked') GROUP BY scheduler, task_id HAVING n > 1")
        row = db.run(1)
        status, env = row["status"], row["environment"]
        ours = run_summary(db, 1)
    if ends:
        problems.append(f"{len(ends)} task(s) reached an end twice: {ends[:3]}")
    if status != "completed":
        problems.append(f"the resumed run is {status}")
    with ResultsDB(reference) as db:
        ref, ref_env = run_summary(db, 1), db.run(1)["environment"]
    problems += [f"{key}: {env.get(key)!r} resumed, {ref_env.get(key)!r} uninterrupted" for key in DILATION_KEYS
                 if env.get(key) != ref_env.get(key)]
    for n, figure, b, (a,) in paired_points(ref, [ours], flexible=flexible, fixed=fixed, figures=figures):
        if a is None or b is None or not b.low - 1e-9 <= a.mean <= b.high + 1e-9:
            problems.append(f"{figure} {flexible}/{fixed} at {n} locals: {a and a.mean} outside "
                            f"[{b and b.low}, {b and b.high}]")
    return problems


def paired_points(ref: Any, runs: Sequence[Any], *, flexible: str, fixed: str, figures: Sequence[str]
                  ) -> Iterator[tuple[int, str, Any, list[Any]]]:
    """For each number of locals of `ref` (a `run_summary`) and each of `figures`: (locals, figure, the
    flexible / fixed paired ratio of `ref`, that of each of `runs`), a ratio None where it has none."""
    def pair(summary: Any, n: int, figure: str) -> Any:
        return paired_ratio(summary.tasks, n_locals=n, numerator=flexible, denominator=fixed, figure=figure)

    for n in sorted({t.n_locals for t in ref.tasks}):
        for figure in figures:
            yield n, figure, pair(ref, n, figure), [pair(r, n, figure) for r in runs]


def host_flagged(db_path: Path) -> list[str]:
    """The points of the run in `db_path` whose fidelity verdict is not faithful, each with its reasons
    (`orchestrator.results.fidelity`): their figures are the host's moment's, not the config's."""
    with ResultsDB(db_path) as db:
        summary = run_summary(db, 1)
    return [f"{v.scheduler} at {v.n_locals} locals: {'; '.join(v.reasons)}" for v in summary.unfaithful]


def judge(resumed: Path, reference: Path, *, figures: Sequence[str] = ("mean_latency_s", "reserved_mbps")
          ) -> tuple[list[str], list[str]]:
    """`compare` the resumed run with the uninterrupted one, its ratios only where its verdict calls it
    faithful: (the problems, the points the verdict flagged)."""
    flagged = host_flagged(resumed)
    return compare(resumed, reference, figures=() if flagged else figures), flagged


def netai(*args: str) -> list[str]:
    """The command line of `netai` with `args` (this interpreter, the checkout's code)."""
    return [sys.executable, "-m", "orchestrator.cli", *args]


@dataclass
class Chain:
    """One fresh run killed again and again, then resumed to its end; `flagged`: the points its resumed
    run's verdict does not call faithful (`host_flagged`; its ratios were then not compared)."""

    run_dir: Path | None
    kills: list[KillResult]
    problems: list[str]
    flagged: list[str] = field(default_factory=list)


@dataclass
class Campaign:
    """What `campaign` found: the uninterrupted run's folder, the chains, the problems (none expected)
    and notes (uninterrupted runs measured again because their verdict flagged them)."""

    reference: Path
    chains: list[Chain]
    problems: list[str]
    notes: list[str]


def run_chain(config: Path, out: Path, moments: Iterator[Moment], timing: Timing, *, kills: int,
              extra: Sequence[str], limit_s: float, env: Mapping[str, str]) -> Chain:
    """Start `config` in `out`, kill it at the next moment, resume it and kill it at the next, ...: up
    to `kills` kills (a moment the process outlives ends the chain: the run completed), then resume
    it to its end; the database checked after every kill."""
    run_dir: Path | None = None
    results: list[KillResult] = []

    def find_db() -> Path | None:
        found = sorted(out.glob("*/results.db")) if run_dir is None else [run_dir / "results.db"]
        return found[0] if found and found[0].exists() else None

    def command() -> list[str]:
        return netai("experiment", *(["--resume", str(run_dir)] if run_dir else [str(config), "--out", str(out)]),
                     *extra)

    while len(results) < kills:
        phase, kill = run_killed(command(), next(moments), timing, find_db, limit_s=limit_s, env=env)
        db_path = find_db()
        if db_path is not None and _has_run(db_path):
            run_dir = db_path.parent
        elif db_path is not None:  # killed between creating the database and recording the run: start again
            _remove_tree(db_path.parent)
        if phase == "done":
            break
        problems, whole, discarded = check_whole(db_path) if run_dir is not None and db_path is not None \
            else ([], 0, 0)
        results.append(KillResult(kill, phase, whole, discarded, problems))
    final = subprocess.run(command(), cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=limit_s * 4)
    if final.returncode != 0:
        return Chain(run_dir, results, [f"the last run exited {final.returncode}: {final.stderr[-500:]}"])
    if run_dir is None:
        run_dir = sorted(out.glob("*/results.db"))[0].parent
    return Chain(run_dir, results, [])


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


def measure(config: Path, out: Path, *, extra: Sequence[str], env: Mapping[str, str], limit_s: float) -> tuple[Path, Timing]:
    """The uninterrupted run of `config` in `out`: its database and its `Timing`."""
    proc = subprocess.Popen(netai("experiment", str(config), "--out", str(out), *extra), cwd=ROOT, env=dict(env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0, live_at = time.monotonic(), None
    while proc.poll() is None and time.monotonic() - t0 < limit_s:
        found = sorted(out.glob("*/results.db"))
        if live_at is None and found and _is_live(found[0]):
            live_at = time.monotonic()
        time.sleep(0.01)
    end = time.monotonic()
    _, err = proc.communicate(timeout=limit_s)
    if proc.returncode != 0:
        raise RuntimeError(f"the uninterrupted run failed: {err[-1000:]}")
    reference = sorted(out.glob("*/results.db"))[0]
    start_s = (live_at or end) - t0
    return reference, Timing(start_s=start_s, live_s=end - (live_at or end), task_runs=len(task_set(reference)))


#: How many uninterrupted runs the campaign measures at most to find one whose verdict is faithful.
REFERENCE_TRIES = 3


def reference_run(config: Path, out: Path, *, extra: Sequence[str], env: Mapping[str, str], limit_s: float
                  ) -> tuple[Path, Timing, list[str], list[str]]:
    """The uninterrupted run the chains are compared with: the first of up to `REFERENCE_TRIES` whose
    verdict is faithful at every point. Returns (its database, its `Timing`, notes on the runs measured
    again, problems: none unless no run was faithful)."""
    notes: list[str] = []
    for i in range(REFERENCE_TRIES):
        reference, timing = measure(config, out / ("uninterrupted" if i == 0 else f"uninterrupted-{i + 1}"),
                                    extra=extra, env=env, limit_s=limit_s)
        flagged = host_flagged(reference)
        if not flagged:
            return reference, timing, notes, []
        notes.append(f"uninterrupted run {i + 1} not faithful, measured again: {'; '.join(flagged)}")
    return reference, timing, notes, [f"no faithful uninterrupted run in {REFERENCE_TRIES}"]


def campaign(config: Path, out: Path, *, seed: int, kills: int, per_chain: int, extra: Sequence[str] = (),
             env: Mapping[str, str] | None = None, limit_s: float = 300.0,
             check_after: Callable[[], list[str]] = list,
             figures: Sequence[str] = ("mean_latency_s", "reserved_mbps")) -> Campaign:
    """A warm-up run and the uninterrupted run of `config` (`reference_run`), then chains of up to
    `per_chain` seeded kills until `kills` kills have landed (a chain whose run completes before its
    next moment ends early); each chain's run is compared with the uninterrupted one (`judge`), and
    `check_after` (e.g. what the killed runs left on the machine) is checked after it. Most completed
    chains' resumed runs must be faithful, so that their ratios were compared."""
    env = dict(os.environ if env is None else env)
    # a first run fills the caches every later run finds filled (the model's counts: two seconds of a
    # simulated run that takes one), so that the moments are placed on a run as long as the chains' are
    measure(config, out / "warm-up", extra=extra, env=env, limit_s=limit_s)
    reference, timing, notes, problems = reference_run(config, out, extra=extra, env=env, limit_s=limit_s)
    rng = random.Random(seed)
    moments = (next_kill(rng, i) for i in itertools.count())
    problems, chains = problems + check_after(), list[Chain]()
    landed = 0
    while landed < kills and len(chains) < 4 * kills:
        c = len(chains)
        want = min(per_chain, kills - landed)
        chain = run_chain(config, out / f"chain-{c}", moments, timing, kills=want, extra=extra, limit_s=limit_s,
                          env=env)
        for k in chain.kills:
            problems += [f"chain {c}, kill {k.kill}: {p}" for p in k.problems]
        problems += [f"chain {c}: {p}" for p in chain.problems + check_after()]
        if chain.run_dir is not None and not chain.problems:
            differs, chain.flagged = judge(chain.run_dir / "results.db", reference, figures=figures)
            problems += [f"chain {c}: {p}" for p in differs]
            notes += [f"chain {c}: resumed run not faithful, its ratios not compared: {f}" for f in chain.flagged]
        chains.append(chain)
        landed += len(chain.kills)
    completed = [c for c in chains if c.run_dir is not None and not c.problems]
    compared = [c for c in completed if not c.flagged]
    if 2 * len(compared) <= len(completed):
        problems.append(f"only {len(compared)} of {len(completed)} resumed runs faithful and compared")
    return Campaign(reference.parent, chains, problems, notes)


def table(chains: Sequence[Chain]) -> list[str]:
    """One line per kill: the chain, the moment, the phase, the whole tasks and those discarded so far."""
    lines = ["chain  kill  moment                 phase       whole  discarded"]
    for c, chain in enumerate(chains):
        for i, k in enumerate(chain.kills):
            lines.append(f"{c:>5}  {i:>4}  {k.kill!s:<21}  {k.phase:<10}  {k.whole:>5}  {k.discarded:>9}")
    return lines


def ratios(reference: Path, chains: Sequence[Chain], *, flexible: str = "mst", fixed: str = "spff",
           figures: Sequence[str] = ("mean_latency_s", "reserved_mbps")) -> list[str]:
    """One line per figure and number of locals: the uninterrupted run's flexible / fixed paired ratio
    [95 % CI], and each completed chain's mean, as `judge` checks them (marked where it did not)."""
    with ResultsDB(reference / "results.db") as db:
        ref = run_summary(db, 1)
    ours, marks = [], []
    for chain in chains:
        if chain.run_dir is not None and not chain.problems:
            with ResultsDB(chain.run_dir / "results.db") as db:
                ours.append(run_summary(db, 1))
            marks.append(" (not faithful, not compared)" if chain.flagged else "")
    lines = []
    for n, figure, b, got in paired_points(ref, ours, flexible=flexible, fixed=fixed, figures=figures):
        means = " ".join(f"{a.mean:.3f}{m}" if a is not None else "-" for a, m in zip(got, marks, strict=True))
        interval = f"{b.mean:.3f} [{b.low:.3f}, {b.high:.3f}]" if b is not None else "-"
        lines.append(f"{figure} {flexible}/{fixed} at {n} locals: uninterrupted {interval}, resumed {means}")
    return lines


def processes_naming(text: str) -> dict[int, str]:
    """{pid: command line} of the processes whose command line contains `text` (e.g. a test's folder)."""
    named = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and proc.name != str(os.getpid()) and text in (line := cmdline(int(proc.name))):
            named[int(proc.name)] = line
    return named


def lingering(text: str, before: set[int], *, grace_s: float = 5.0) -> list[str]:
    """The processes whose command line contains `text`, not in `before`, still running `grace_s`
    after the call (a server gives up within a second of its socket's removal), each as
    ``pid: command line``."""
    deadline = time.monotonic() + grace_s
    while (named := {p: c for p, c in processes_naming(text).items() if p not in before}) \
            and time.monotonic() < deadline:
        time.sleep(0.2)  # poll interval while they exit
    return [f"{pid}: {line}" for pid, line in sorted(named.items())]


def sim_leftovers(root: Path) -> list[str]:
    """What killed simulated runs under `root` left: engine files, or processes still running."""
    return [f"left {p}" for p in sorted(root.glob("**/netai-sim-*"))] + \
        [f"process {pid} still runs" for pid in processes_naming(str(root))]
