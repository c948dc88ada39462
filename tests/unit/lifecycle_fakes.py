"""Fakes of the lifecycle core's ports (`orchestrator.lifecycle.ports`): the one module every core
test imports, as Faucet tests its flow logic against a fake flow table.

- `FakeNetwork`: keeps what is installed and removed (by install id, in call order), answers each
  install's carried bytes from a script that may change between reads (counter settling), can fail
  an install or a remove, and returns a scripted background (None: the controller restarts).
- `FakeCompute` and `FakeExecution`: a task's roles, played check by check from an `ExecScript`:
  one round per check, with the agents' timing events (`workers.rounds`) that the real summary
  functions (`orchestrator.runtime.summaries.summarize`, `rounds_so_far`, `node_rounds`) read;
  a role may fail, time out, or be lost with its site server (and the server come back).
- `FakeRecorder`: every call kept in memory.
- `FakeClock`: a manual clock; the roles stamp their events on a clock `ROLE_CLOCK_ZERO` ahead, so a
  time the core forgets to pass through `Clock.of` shows.
- `Schedulers`: the real schedulers by name (`orchestrator.scheduling`), so that schedules are real.

Nothing here opens a socket, starts a process or sleeps.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.lifecycle.core import Lifecycle, LiveTask
from orchestrator.runtime.summaries import (
    RoundResult,
    TaskResult,
    node_rounds,
    rounds_so_far,
    summarize,
    tcp_bytes,
)
from orchestrator.scheduling import NetworkState, Schedule, Scheduler
from orchestrator.scheduling.mst import MST
from orchestrator.scheduling.spff import SPFF
from orchestrator.scheduling.tasks import Task
from topologies.generators import ring
from topologies.model import NetworkModel

#: The roles' clock (CLOCK_MONOTONIC in an emulation) reads this much more than the run's clock.
ROLE_CLOCK_ZERO = 1000.0
#: Timing of one round from its start (run-clock seconds; see `FakeExecution.play_round`).
RECEIVED_AFTER_S = 0.1
#: Every sender has written the first chunk of each broadcast copy (``forward_first``) this long after the start.
FORWARD_AFTER_S = 0.02
TRAIN_START_AFTER_S = 0.15
TRAIN_S = 0.2
#: Each further local (in the schedule's order) trains this much longer than the one before.
TRAIN_STEP_S = 0.05
UPDATE_SENT_AFTER_S = 0.65
AGGREGATED_AFTER_S = 0.8
COMPLETE_AFTER_S = 0.9
DONE_AFTER_S = 0.95
#: From `start` to every role ready, and to G connected; a check takes `CHECK_S`.
READY_AFTER_S = 0.2
CONNECTED_AFTER_S = 0.3
START_S = 0.5
CHECK_S = 1.0
CHUNK_BYTES = 65536
#: What each role's "tcp" event says at the end: TCP data bytes sent and retransmitted.
TCP_SENT = 10_000
TCP_RETRANS = 120


class FakeClock:
    """The run's clock, moved by hand (and by the fake roles as they work)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def of(self, t: float) -> float:
        return t - ROLE_CLOCK_ZERO

    def advance(self, dt: float) -> None:
        self.t += dt

    def role_t(self, run_t: float) -> float:
        """A run-clock time as the roles stamp it."""
        return run_t + ROLE_CLOCK_ZERO


# -- network -----------------------------------------------------------------------------------------
class FakeNetwork:
    """`NetworkPort` as a fake flow table: install id -> the schedule installed under it."""

    def __init__(self, model: NetworkModel, *, rate_mbps: float = 100.0, delay_emulated: bool = True,
                 counter_settle_s: float = 0.0, enforced: bool = True, default_bytes: int = 4096) -> None:
        self.model = model
        self.delay_emulated = delay_emulated
        self.counter_settle_s = counter_settle_s
        self.payload_share = 1.0
        self.link_burst_bytes = lambda a, b: 0
        self.enforced = enforced
        self.default_bytes = default_bytes
        #: Per directed link rate (Mbit/s), else `rate_mbps`: the bounds' rates.
        self.rates: dict[tuple[str, str], float] = {}
        self.rate_mbps = rate_mbps
        self.rate: Callable[[str, str], float] = lambda u, v: self.rates.get((u, v), self.rate_mbps)
        self.installed: dict[int, Schedule] = {}
        self.installs: list[int] = []
        self.removed: list[int] = []
        #: Every call in order: ("install" | "remove" | "bytes", install id, value) or ("background",
        #: the task id it was asked for or None, value).
        self.calls: list[tuple[str, int | None, Any]] = []
        #: Install id -> the successive reads of its byte counters (the last one repeats); None: that
        #: read fails (the controller restarts).
        self.bytes_script: dict[int, list[int | None]] = {}
        self.install_error: Exception | None = None
        self.remove_error: Exception | None = None
        #: Successive background replies (then `background_now`); None: not measurable now.
        self.backgrounds: list[dict[tuple[str, str], float] | None] = []
        self.background_now: dict[tuple[str, str], float] | None = {}
        self._ids = itertools.count(101)  # apart from task ids, so that a mix-up shows

    def new_install_id(self) -> int:
        return next(self._ids)

    def install(self, wire: Schedule) -> bool:
        self.calls.append(("install", wire.task_id, None))
        if self.install_error is not None:
            raise self.install_error
        self.installed[wire.task_id] = wire
        self.installs.append(wire.task_id)
        return self.enforced

    def remove(self, install_id: int) -> None:
        self.calls.append(("remove", install_id, None))
        if self.remove_error is not None:
            raise self.remove_error
        self.installed.pop(install_id, None)
        self.removed.append(install_id)

    def task_bytes(self, install_id: int) -> int:
        if install_id not in self.installed:
            self.calls.append(("bytes", install_id, None))
            raise KeyError(f"no flows of install {install_id}")
        script = self.bytes_script.get(install_id)
        got = self.default_bytes if not script else script.pop(0) if len(script) > 1 else script[0]
        self.calls.append(("bytes", install_id, got))
        if got is None:
            raise ConnectionError("the controller is restarting")
        return got

    def background(self, state: NetworkState, task_id: int | None = None) -> dict[tuple[str, str], float] | None:
        got = self.backgrounds.pop(0) if self.backgrounds else self.background_now
        self.calls.append(("background", task_id, got))
        return None if got is None else dict(got)

    def reads(self, install_id: int) -> list[int | None]:
        """The byte counts read for `install_id`, in order (None: the read raised)."""
        return [v for what, i, v in self.calls if what == "bytes" and i == install_id]


# -- compute -----------------------------------------------------------------------------------------
@dataclass
class ExecScript:
    """What one execution (one install of a task) does, check by check (checks count from 1).

    Every check plays one round, unless the check fails or times out, or G has completed every round.
    """

    #: Check -> the error message of a role that failed (RuntimeError) / the budget (TimeoutError).
    fail_at: dict[int, str] = field(default_factory=dict)
    timeout_at: dict[int, str] = field(default_factory=dict)
    #: Check -> (site, why): the role at the site (not G) is lost with its server from that check.
    lose: dict[int, tuple[str, str]] = field(default_factory=dict)
    #: Check -> site whose server is back (after the check's losses).
    back: dict[int, str] = field(default_factory=dict)
    #: Round -> a local G leaves out of it (``child_timeout``; it does not train that round).
    straggle: dict[int, str] = field(default_factory=dict)
    #: The check at which every role reports done although G has not completed every round.
    finish_early_at: int | None = None
    #: Checks after G's last round before every role reports done (the roles wind down).
    linger: int = 0


class FakeExecution:
    """`Execution` played from an `ExecScript` (see the module docstring)."""

    def __init__(self, compute: FakeCompute, wire: Schedule, *, task: Task, schedule: Schedule, log_dir: Path,
                 first_round: int, init_model: Path | None, script: ExecScript) -> None:
        self.compute = compute
        self.clock = compute.clock
        self.wire = wire
        self.task = task
        self.schedule = schedule
        self.log_dir = log_dir
        self.first_round = first_round
        self.init_model = init_model
        self.script = script
        self.lost_roles: dict[str, str] = {}
        self.checks = 0
        self.stops = 0
        self.started_t: float | None = None
        self.next_round = first_round
        self.lingered = 0
        self._events: dict[str, list[dict[str, Any]]] = {n: [] for n in schedule.overlay_nodes}
        #: The status replies each check was given (`ComputePort.poll`'s).
        self.statuses_seen: list[Mapping[str, Any]] = []

    # -- the roles' timeline (role clock) ----------------------------------------------------------
    def _log(self, site: str, event: str, run_t: float, **fields: Any) -> None:
        self._events[site].append({"event": event, "t": self.clock.role_t(run_t), **fields})

    def start(self) -> None:
        assert self.started_t is None, "an execution is started once"
        s = self.started_t = self.clock.now()
        for n in self.schedule.overlay_nodes:
            extra = {"model_bytes": self.task.model_bytes, "chunk_bytes": CHUNK_BYTES} if n == self.g else {}
            self._log(n, "ready", s + READY_AFTER_S, **extra)
        self._log(self.g, "connected", s + CONNECTED_AFTER_S)
        self.clock.advance(START_S)

    @property
    def g(self) -> str:
        return self.schedule.global_site

    def play_round(self) -> None:
        """One round from now on the run's clock: every role still there logs its events."""
        r, t = self.next_round, self.clock.now()
        nbytes = self.task.model_bytes
        self._log(self.g, "round_start", t, round=r)
        left_out = self.script.straggle.get(r)
        if left_out is not None:
            self._log(self.g, "child_timeout", t + AGGREGATED_AFTER_S, round=r, child=left_out)
        for e in self.schedule.edges_of("broadcast"):
            if e.src not in self.lost_roles and e.dst not in self.lost_roles:
                self._log(e.src, "forward_first", t + FORWARD_AFTER_S, round=r, peer=e.dst)
        for i, site in enumerate(self.schedule.local_sites):
            if site in self.lost_roles:
                continue
            self._log(site, "global_received", t + RECEIVED_AFTER_S, round=r, nbytes=nbytes)
            if site != left_out:
                self._log(site, "train_start", t + TRAIN_START_AFTER_S, round=r)
                self._log(site, "train_end", t + TRAIN_START_AFTER_S + TRAIN_S + TRAIN_STEP_S * i, round=r)
                self._log(site, "update_sent", t + UPDATE_SENT_AFTER_S, round=r, nbytes=nbytes // 2)
        for site in self.schedule.relay_sites:
            if site not in self.lost_roles:
                self._log(site, "global_received", t + RECEIVED_AFTER_S / 2, round=r, nbytes=nbytes)
                self._log(site, "update_sent", t + UPDATE_SENT_AFTER_S, round=r, nbytes=nbytes // 2)
        self._log(self.g, "aggregated", t + AGGREGATED_AFTER_S, round=r)
        self._log(self.g, "round_complete", t + COMPLETE_AFTER_S, round=r, accuracy=0.5 + 0.01 * r, loss=1.0 / r,
                  num_examples=100)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.checkpoint_file.write_text(f"round {r}\n")
        self.next_round += 1

    # -- Execution ---------------------------------------------------------------------------------
    def check(self, statuses: Any) -> bool:
        assert self.started_t is not None, "checked before start"
        assert not self.stops, "checked after stop"
        self.statuses_seen.append(statuses)
        self.checks += 1
        c, script = self.checks, self.script
        if c in script.lose:
            site, why = script.lose[c]
            self.lost_roles[site] = why
            self.compute.lost[site] = why
        if c in script.back:
            self.compute.lost.pop(script.back[c], None)
        if c in script.fail_at:
            raise RuntimeError(f"task {self.wire.task_id}: roles failed: {script.fail_at[c]}")
        if c in script.timeout_at:
            raise TimeoutError(f"task {self.wire.task_id}: {script.timeout_at[c]}")
        t = self.clock.now()
        if self.next_round > self.task.rounds:
            self.lingered += 1
        else:
            self.play_round()
        self.clock.advance(CHECK_S)
        if (self.next_round > self.task.rounds and self.lingered >= script.linger) or c == script.finish_early_at:
            for n in self.schedule.overlay_nodes:  # each role's outbound connection, as it closes
                self._log(n, "tcp", t + DONE_AFTER_S, connections=1, sent_bytes=TCP_SENT, retrans_bytes=TCP_RETRANS)
            self._log(self.g, "done", t + DONE_AFTER_S)
            return True
        return False

    def stop(self) -> None:
        self.stops += 1

    def events(self) -> dict[str, list[dict[str, Any]]]:
        return {n: list(evs) for n, evs in self._events.items()}

    def rounds_completed(self, events: Any = None) -> int:
        evs = (self.events() if events is None else events).get(self.g, [])
        return max((int(e["round"]) for e in evs if e.get("event") == "round_complete"),
                   default=self.first_round - 1)

    @property
    def checkpoint_file(self) -> Path:
        return self.log_dir / "global.ckpt"

    def rounds_so_far(self, events: Any) -> list[RoundResult]:
        return rounds_so_far(self.schedule, events, first=self.first_round)

    def node_rows(self, events: Any, clock_of: Any) -> list[dict[str, Any]]:
        return node_rounds(self.schedule, events, clock_of)

    def result(self, events: Any = None) -> TaskResult:
        events = self.events() if events is None else events
        g = events.get(self.g, [])
        ready = [float(e["t"]) for evs in events.values() for e in evs if e["event"] == "ready"]
        connected = next(float(e["t"]) for e in g if e["event"] == "connected")
        first = [float(e["t"]) for e in g if e["event"] == "round_start" and e["round"] == self.first_round]
        done = [float(e["t"]) for e in g if e["event"] == "done"]
        assert self.started_t is not None
        return TaskResult(
            task_id=self.wire.task_id, backend="fake", scheduler=self.schedule.scheduler,
            rounds=tuple(summarize(self.schedule, events, rounds=self.task.rounds, first_round=self.first_round)),
            model_bytes=self.task.model_bytes, log_dir=str(self.log_dir),
            agents_ready_s=max(ready) - self.clock.role_t(self.started_t), connect_s=connected - max(ready),
            chunk_bytes=CHUNK_BYTES, connections_lost=len(self.lost_roles), started_t=self.clock.role_t(self.started_t),
            first_broadcast_t=first[0] if first else 0.0, finished_t=done[-1] if done else 0.0,
            sent_bytes=tcp_bytes(events)[0], retrans_bytes=tcp_bytes(events)[1])


class FakeCompute:
    """`ComputePort` whose launches are `FakeExecution`s, each playing the next script of its task."""

    def __init__(self, clock: FakeClock, root: Path, *, default: ExecScript | None = None) -> None:
        self.clock = clock
        self.root = root
        self.default = default or ExecScript()
        #: Task id -> the scripts of its successive launches (then `default`).
        self.scripts: dict[int, list[ExecScript]] = {}
        self.lost: dict[str, str] = {}
        self.launches: list[FakeExecution] = []
        self.launch_error: Exception | None = None
        #: Raised by the poll after `poll_error_after` polls (e.g. KeyboardInterrupt).
        self.poll_error: BaseException | None = None
        self.poll_error_after = 0
        self.polls: list[Sequence[str] | None] = []

    def task_dir(self, name: str) -> Path:
        return self.root / name

    def launch(self, wire: Schedule, *, task: Task, schedule: Schedule, log_dir: Path, first_round: int,
               init_model: Path | None) -> FakeExecution:
        if self.launch_error is not None:
            raise self.launch_error
        queue = self.scripts.get(task.id, [])
        script = queue.pop(0) if queue else self.default
        run = FakeExecution(self, wire, task=task, schedule=schedule, log_dir=log_dir, first_round=first_round,
                            init_model=init_model, script=script)
        self.launches.append(run)
        return run

    def poll(self, sites: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        self.polls.append(sites)
        if self.poll_error is not None and len(self.polls) > self.poll_error_after:
            raise self.poll_error
        return {s: {"roles": {}} for s in sites or ()}


# -- recorder ----------------------------------------------------------------------------------------
#: What `ResultsDB.record_move` accepts.
MOVE_FIELDS = frozenset({"at_s", "reason", "old_schedule_json", "new_schedule_json", "resumed_round",
                         "last_round_end_s", "next_round_start_s", "interruption_s", "old_bound_s", "new_bound_s",
                         "old_reserved_mbps", "new_reserved_mbps"})


@dataclass(frozen=True)
class StateRecord:
    label: str
    task_id: int
    state: str
    reason: str
    at_s: float


@dataclass(frozen=True)
class RoundRecord:
    label: str
    task_id: int
    result: RoundResult
    bound: Any
    reference_s: float
    policy: str


class FakeRecorder:
    """`Recorder` that keeps every call (the latest record of a round or a move wins, as in the database)."""

    def __init__(self) -> None:
        self.arrivals: dict[tuple[str, int], float] = {}
        self.states: list[StateRecord] = []
        self.task_times: dict[tuple[str, int], dict[str, float | None]] = {}
        #: (label, task id, the background it saw, the tasks holding reservations then).
        self.network_states: list[tuple[str, int, dict[tuple[str, str], float], set[int]]] = []
        self.schedules: list[tuple[str, Schedule, float]] = []
        self.round_calls: list[list[RoundRecord]] = []
        self.round_records: dict[tuple[str, int, int], RoundRecord] = {}
        self.node_records: dict[tuple[str, int, int, str], dict[str, Any]] = {}
        self.setups: dict[tuple[str, int], dict[str, float | int | bool]] = {}
        self.moves: dict[tuple[str, int, int], dict[str, Any]] = {}
        self.carried: list[tuple[str, int, int]] = []
        self.tcp: dict[tuple[str, int], tuple[int | None, int | None]] = {}
        self.hops: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.overruns: dict[tuple[str, int], list[dict[str, Any]]] = {}
        self.link_rates: dict[tuple[str, int], list[dict[str, Any]]] = {}
        #: Tasks whose end is held back, and those sealed (their record whole), in order.
        self.held: set[tuple[str, int]] = set()
        self.sealed: list[tuple[str, int]] = []

    def task(self, label: str, task: Task, *, arrival_s: float) -> None:
        self.arrivals[(label, task.id)] = arrival_s

    def hold(self, label: str, task_id: int) -> None:
        self.held.add((label, task_id))

    def seal(self, label: str, task_id: int) -> None:
        self.held.discard((label, task_id))
        self.sealed.append((label, task_id))

    def state(self, label: str, task_id: int, state: str, reason: str = "", *, at_s: float) -> None:
        self.states.append(StateRecord(label, task_id, state, reason, at_s))

    def times(self, label: str, task_id: int, **times: float | None) -> None:
        self.task_times.setdefault((label, task_id), {}).update(times)

    def network_state(self, label: str, task_id: int, state: NetworkState) -> None:
        self.network_states.append((label, task_id, dict(state.background_mbps), set(state.schedules)))

    def schedule(self, label: str, schedule: Schedule, lower_bound_s: float) -> None:
        self.schedules.append((label, schedule, lower_bound_s))

    def rounds(self, label: str, schedule: Schedule, rounds: Sequence[Any], bounds: Sequence[Any],
               reference_s: Sequence[float], *, policy: str, node_rows: list[dict[str, Any]]) -> None:
        call = [RoundRecord(label, schedule.task_id, r, b, ref, policy)
                for r, b, ref in zip(rounds, bounds, reference_s, strict=True)]
        self.round_calls.append(call)
        for rec in call:
            self.round_records[(label, schedule.task_id, rec.result.round)] = rec
        for row in node_rows:
            self.node_records[(label, schedule.task_id, row["round"], row["site"])] = row

    def setup(self, label: str, task_id: int, **figures: float | int | bool) -> None:
        self.setups.setdefault((label, task_id), {}).update(figures)

    def move(self, label: str, task_id: int, move: int, **fields: Any) -> None:
        bad = set(fields) - MOVE_FIELDS
        if bad:
            raise ValueError(f"unknown move fields {sorted(bad)}")
        self.moves.setdefault((label, task_id, move), {}).update(fields)

    def carried_bytes(self, label: str, task_id: int, carried: int) -> None:
        self.carried.append((label, task_id, carried))

    def tcp_bytes(self, label: str, task_id: int, sent: int | None, retrans: int | None) -> None:
        self.tcp[(label, task_id)] = (sent, retrans)

    def fidelity(self, label: str, task_id: int, *, hops: list[dict[str, Any]],
                 overruns: list[dict[str, Any]], link_rates: list[dict[str, Any]],
                 trainings: list[dict[str, Any]]) -> None:
        self.hops[(label, task_id)] = hops
        self.overruns[(label, task_id)] = overruns
        self.link_rates[(label, task_id)] = link_rates

    # -- reading -----------------------------------------------------------------------------------
    def states_of(self, label: str, task_id: int) -> list[str]:
        return [s.state for s in self.states if (s.label, s.task_id) == (label, task_id)]

    def reasons_of(self, label: str, task_id: int) -> list[str]:
        return [s.reason for s in self.states if (s.label, s.task_id) == (label, task_id)]

    def rounds_of(self, label: str, task_id: int) -> dict[int, RoundRecord]:
        return {k[2]: v for k, v in sorted(self.round_records.items()) if k[:2] == (label, task_id)}


# -- schedulers and the whole rig --------------------------------------------------------------------
class Schedulers:
    """The core's scheduler registry: real schedulers by name."""

    def __init__(self, **by_name: Scheduler) -> None:
        self.by_name: dict[str, Scheduler] = by_name or {"spff": SPFF(), "mst": MST()}
        self.asked: list[str] = []

    def __call__(self, name: str) -> Scheduler:
        self.asked.append(name)
        return self.by_name[name]


def small_ring(*, wavelengths: int = 8, wavelength_mbps: float = 10_000.0) -> NetworkModel:
    """``r1 - r2 - r3 - r4 - r1``, 100 km a link, every site with compute."""
    return ring(4, wavelengths=wavelengths, wavelength_mbps=wavelength_mbps)


@dataclass
class Rig:
    """A core on fakes of its ports, and the fakes."""

    core: Lifecycle
    network: FakeNetwork
    compute: FakeCompute
    recorder: FakeRecorder
    clock: FakeClock
    model: NetworkModel
    schedulers: Schedulers

    def task(self, task_id: int, local_sites: Sequence[str], *, global_site: str = "r1", rounds: int = 3,
             demand_mbps: float = 1000.0, model_bytes: int = 1_000_000) -> Task:
        return Task(id=task_id, global_site=global_site, local_sites=tuple(local_sites), rounds=rounds,
                    demand_mbps=demand_mbps, model_bytes=model_bytes)

    def start(self, label: str, task: Task, state: NetworkState) -> LiveTask:
        """Arrival and admission (the drivers' first two calls)."""
        self.core.arrive(label, task)
        return self.core.admit(label, task, state)

    def run(self, live: LiveTask, *, max_checks: int = 50) -> LiveTask:
        """Check `live` until it ends (as `_run_sequential` does), at most `max_checks` times."""
        for _ in range(max_checks):
            if self.core.check(live, self.compute.poll(live.schedule.overlay_nodes)):
                return live
        raise AssertionError(f"task {live.task.id} did not end in {max_checks} checks")


def make_rig(root: Path, *, model: NetworkModel | None = None, release_on_end: bool = False, faults: bool = False,
             counter_settle_s: float = 0.0, rate_mbps: float = 100.0, delay_emulated: bool = True,
             on_rounds: Callable[[LiveTask, list[Any]], None] | None = None, dilation: float = 1.0) -> Rig:
    """A core on fresh fakes over `model` (default `small_ring`); rounds recorded at every check."""
    model = model or small_ring()
    clock = FakeClock()
    network = FakeNetwork(model, rate_mbps=rate_mbps, delay_emulated=delay_emulated,
                          counter_settle_s=counter_settle_s)
    compute = FakeCompute(clock, root)
    recorder = FakeRecorder()
    schedulers = Schedulers()
    core = Lifecycle(network=network, compute=compute, recorder=recorder, clock=clock, model=model,
                     schedulers=schedulers, release_on_end=release_on_end, faults=faults, progress_period_s=0.0,
                     on_rounds=on_rounds, dilation=dilation)
    return Rig(core, network, compute, recorder, clock, model, schedulers)
