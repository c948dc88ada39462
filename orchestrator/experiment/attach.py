"""One FL task on a network another process runs (``netai task run --attach`` on ``netai net up``).

`run_attached` takes a `RunningNetwork` (`orchestrator.emulation.running`) and:

1. schedules the task on the running topology and on what the installed tasks reserve there, under a
   task id no installed (or recorded) task has, and installs its paths through the controller, both
   under the network's install lock, so that attaching processes side by side never share an id;
2. starts one site server per overlay node in that node's Mininet host, entering the host's network
   namespace by its pid (`orchestrator.runtime.backends.NamespaceBackend`), and runs the task's roles
   there (`TaskExecution`, timeouts derived from the schedule), reporting each round as G completes it;
3. on every exit path stops the roles and the servers and removes the task's paths.

When the network records into a results database (``netai net up`` writes the path, run id and clock
into its run state), the task goes there too, on the network's run clock, as the experiment runner
records its tasks: its states and times, schedule and network state, rounds (as they end) with their
bounds, what each node did per round, set-up figures and carried bytes (`LiveRecorder`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.emulation.controller_client import ControllerClient
from orchestrator.emulation.running import RunningNetwork
from orchestrator.emulation.task_paths import task_paths
from orchestrator.errors import ConfigError
from orchestrator.experiment.task_manager import record_rounds
from orchestrator.results import queries
from orchestrator.results.db import ResultsDB
from orchestrator.runtime.backends import NamespaceBackend
from orchestrator.runtime.compute import ComputeManager
from orchestrator.runtime.task_runner import (
    FLOptions,
    RoundResult,
    TaskExecution,
    TaskResult,
    rounds_so_far,
)
from orchestrator.runtime.timing import TaskTiming, task_timing
from orchestrator.scheduling import NetworkState, Schedule, resolve_scheduler
from orchestrator.scheduling.cost import RoundFigures, emulated_rate, round_figures
from orchestrator.scheduling.tasks import Task, generate_tasks

#: How often the roles' events are read for rounds G has completed (s).
PROGRESS_PERIOD_S = 0.5
#: Open vSwitch refreshes flow counters about once a second: two reads this far apart that agree are final.
COUNTER_SETTLE_S = 1.2
COUNTER_READS = 5


@dataclass(frozen=True, kw_only=True)
class AttachRequest:
    """What to run: a seeded task of `locals` local models, scheduled by `scheduler` (a name,
    ``module:Class`` or ``path/file.py:Class``; the task is recorded under its label)."""

    scheduler: str
    locals: int
    seed: int
    options: FLOptions
    model_bytes: int
    log_root: Path
    task_id: int | None = None
    topology: str | None = None
    train_allowance_s: float = 30.0


@dataclass(frozen=True)
class AttachOutcome:
    task: Task
    schedule: Schedule
    result: TaskResult
    reservation: dict[str, Any]
    log_dir: Path
    recorded_in: str


class LiveRecorder:
    """Writes an attached task into the running network's results database, on its run clock."""

    def __init__(self, db: ResultsDB, run_id: int, clock_zero: float) -> None:
        self.db = db
        self.run_id = run_id
        self.clock_zero = clock_zero
        self.path = str(db.path)

    @classmethod
    def open(cls, net: RunningNetwork) -> LiveRecorder | None:
        """The recorder of `net`'s results database, or None when it records none."""
        state = net.state
        db_path = getattr(state, "db_path", "") if state is not None else ""
        if not db_path or not Path(db_path).is_file():
            return None
        run_id = int(getattr(state, "db_run_id", 0) or 0)
        db = ResultsDB(db_path)
        if not run_id:
            last = queries.last_run_id(db.conn)
            if last is None:
                db.close()
                return None
            run_id = last
        return cls(db, run_id, float(getattr(state, "clock_zero", 0.0) or 0.0) or time.monotonic())

    def of(self, monotonic_t: float) -> float:
        return monotonic_t - self.clock_zero

    def now(self) -> float:
        return self.of(time.monotonic())

    def task_ids(self) -> set[int]:
        return queries.task_ids(self.db.conn, self.run_id)

    def arrive(self, scheduler: str, task: Task) -> None:
        at = self.now()
        self.db.record_task(self.run_id, scheduler, task, state="pending")
        self.db.set_task_times(self.run_id, scheduler, task.id, arrival_s=at)
        self.db.set_task_state(self.run_id, scheduler, task.id, "pending", at_s=at)

    def state(self, scheduler: str, task_id: int, state: str, reason: str = "", **times: float | None) -> float:
        at = self.now()
        if times:
            self.db.set_task_times(self.run_id, scheduler, task_id, **times)
        self.db.set_task_state(self.run_id, scheduler, task_id, state, reason, at_s=at)
        return at

    def rounds(self, schedule: Schedule, figures: RoundFigures, rounds: list[RoundResult],
               events: dict[str, list[dict[str, Any]]]) -> None:
        record_rounds(self.db, self.run_id, schedule.scheduler, schedule, figures, rounds, events, self.of)

    def close(self) -> None:
        self.db.close()


def settled_bytes(client: ControllerClient, task_id: int) -> int | None:
    """The task's carried bytes once two counter reads `COUNTER_SETTLE_S` apart agree (None if unreadable)."""
    last = None
    for _ in range(COUNTER_READS):
        try:
            got = int(client.task_bytes(task_id))
        except Exception:  # noqa: BLE001 -- its flows are gone or the controller is busy: no figure
            return last
        if got == last:
            return got
        last = got
        time.sleep(COUNTER_SETTLE_S)  # OVS refreshes counters about once a second; bounded by COUNTER_READS
    return last


def _bytes_now(client: ControllerClient, task_id: int) -> int | None:
    try:
        return int(client.task_bytes(task_id))
    except Exception:  # noqa: BLE001 -- its flows are gone or the controller is unreachable: no figure
        return None


def run_attached(
    net: RunningNetwork,
    req: AttachRequest,
    *,
    say: Callable[[str], None] = lambda _m: None,
    on_round: Callable[[RoundResult], None] = lambda _r: None,
) -> AttachOutcome:
    """Run one task on the running network `net` (see the module docstring).

    Raises
    ------
    ConfigError
        Bad input, a topology that is not the running one, a task the scheduler blocks, a host that
        is gone (nothing was installed then).
    RuntimeError, TimeoutError
        A role or a site server failed, or the task ran out of time (its paths were removed).
    """
    scheduler = resolve_scheduler(req.scheduler).build()  # a spec; recorded under its label
    label = scheduler.name
    model = net.model(req.topology)
    hosts = {h.site: h for h in net.plan.hosts}
    pids = {site: net.host_pid(site) for site in hosts}  # a host that is gone: before anything is recorded
    delay = bool(getattr(net.state, "delay_emulated", False))
    rate = emulated_rate(net.plan)
    recorder = LiveRecorder.open(net)
    try:
        with net.install_lock():
            installed = {int(t["task_id"]) for t in net.installed()}
            if req.task_id is not None and req.task_id in installed:
                raise ConfigError(f"task {req.task_id} is already installed on {net.name}: "
                                  "give another --task-id or leave it out")
            task_id = req.task_id or net.free_task_id(recorder.task_ids() if recorder else ())
            (task,) = generate_tasks(model, count=1, locals_per_task=req.locals, seed=req.seed, first_id=task_id,
                                     model_name=req.options.model, rounds=req.options.rounds,
                                     model_bytes=req.model_bytes)
            state: NetworkState = net.network_state(model)
            if recorder:
                recorder.arrive(label, task)
                recorder.db.record_network_state(recorder.run_id, label, task.id, state)
            schedule = scheduler.schedule(state, task)
            if schedule.blocked:
                if recorder:
                    recorder.state(label, task.id, "blocked", schedule.reason)
                raise ConfigError(f"{label} cannot place task {task.id} on {net.name}: {schedule.reason}")
            figures = round_figures(model, schedule, task.model_bytes, rate=rate, propagation=delay,
                                    whole_updates=req.options.compression == "none")
            if recorder:
                recorder.db.record_schedule(recorder.run_id, schedule, figures.lower_bound.lower_s)
                admitted = recorder.state(label, task.id, "scheduled")
                recorder.db.set_task_times(recorder.run_id, label, task.id, admitted_s=admitted)
            try:
                summary = net.client.install_task(task_paths(schedule, bw_scale=net.plan.bw_scale))
            except Exception as e:
                if recorder:
                    recorder.state(label, task.id, "failed", f"install: {e}".splitlines()[0],
                                   finished_s=recorder.now())
                raise
        log_dir = req.log_root / f"{time.strftime('%Y%m%d-%H%M%S')}-attach-task{task.id}"
        say(f"task {task.id}: G={task.global_site}, locals={', '.join(task.local_sites)}; {label}: "
            f"{len(schedule.relay_sites)} relays, {len(schedule.edges)} paths installed on {net.name} "
            f"(reservation {'enforced' if summary.get('reservation', {}).get('enforced') else 'NOT enforced'}); "
            f"logs {log_dir}")
        completed = False
        try:
            timing = task_timing(model, schedule, task.model_bytes, rate=rate, propagation=delay,
                                 train_allowance_s=req.train_allowance_s)
            result = _run_roles(net, schedule, figures, timing, req.options,
                                {n: (pids[n], hosts[n].ip, hosts[n].name) for n in schedule.overlay_nodes},
                                log_dir, recorder, say, on_round)
            completed = True
        finally:
            # Carried bytes are final once the counters settle (a second or two); after a failure or
            # Ctrl-C the paths go at once, with the bytes counted so far.
            carried = None
            if recorder:
                carried = settled_bytes(net.client, task.id) if completed else _bytes_now(net.client, task.id)
            with contextlib.suppress(Exception):  # already gone (the network stopped): nothing to remove
                net.client.remove_task(task.id)
            if recorder and carried is not None:
                recorder.db.set_carried_bytes(recorder.run_id, label, task.id, carried)
        return AttachOutcome(task=task, schedule=schedule, result=result, reservation=summary.get("reservation", {}),
                             log_dir=log_dir, recorded_in=recorder.path if recorder else "")
    finally:
        if recorder:
            recorder.close()


def _run_roles(net: RunningNetwork, schedule: Schedule, figures: RoundFigures, timing: TaskTiming,
               options: FLOptions, hosts: dict[str, tuple[int, str, str]], log_dir: Path,
               recorder: LiveRecorder | None, say: Callable[[str], None],
               on_round: Callable[[RoundResult], None]) -> TaskResult:
    """Site servers in the task's hosts, its roles on them, rounds reported as G completes them."""
    assert net.state is not None  # host_pid needed it
    scheduler, task_id = schedule.scheduler, schedule.task_id
    reported = 0
    try:
        backend = NamespaceBackend(hosts, log_root=log_dir, run_id=net.state.run_id)
        with ComputeManager(backend, schedule.overlay_nodes) as manager:
            say(f"{len(manager.servers)} site servers up in the task's hosts; running {options.rounds} rounds")
            execution = TaskExecution(schedule, manager=manager, options=options,
                                      log_dir=manager.task_dir("agents"), timing=timing)
            try:
                execution.start()
                if recorder:
                    recorder.state(scheduler, task_id, "running")
                next_read = time.monotonic() + PROGRESS_PERIOD_S
                while not execution.check(manager.poll(schedule.overlay_nodes)):
                    if time.monotonic() >= next_read:
                        next_read = time.monotonic() + PROGRESS_PERIOD_S
                        reported = _report_rounds(execution, schedule, figures, reported, recorder, on_round)
                    time.sleep(0.05)  # poll interval of the roles' states, bounded by the task's budget
            finally:
                execution.stop()
            events = execution.events()
            result = execution.result(events)
    except BaseException as e:
        if recorder:
            reason = f"{type(e).__name__}: {e}".splitlines()[0]
            recorder.state(scheduler, task_id, "failed", reason, finished_s=recorder.now())
        raise
    for r in result.rounds[reported:]:
        on_round(r)
    if recorder:
        first = recorder.of(result.first_broadcast_t) if result.first_broadcast_t else None
        admitted_s = queries.admitted_s(recorder.db.conn, recorder.run_id, scheduler, task_id)
        recorder.rounds(schedule, figures, list(result.rounds), events)
        recorder.db.set_task_setup(recorder.run_id, scheduler, task_id, agents_ready_s=result.agents_ready_s,
                                   connect_s=result.connect_s, chunk_bytes=result.chunk_bytes,
                                   connections_lost=result.connections_lost)
        finished = recorder.of(result.finished_t) if result.finished_t else recorder.now()
        recorder.state(scheduler, task_id, "done", first_broadcast_s=first, finished_s=finished,
                       start_overhead_s=None if first is None or admitted_s is None else first - admitted_s)
    return result


def _report_rounds(execution: TaskExecution, schedule: Schedule, figures: RoundFigures, reported: int,
                   recorder: LiveRecorder | None, on_round: Callable[[RoundResult], None]) -> int:
    """Report (and record) the rounds G completed since `reported`; returns how many are reported now."""
    events = execution.events()
    rounds = rounds_so_far(schedule, events)  # none yet, or a torn events line: next time
    if len(rounds) <= reported:
        return reported
    for r in rounds[reported:]:
        on_round(r)
    if recorder:
        recorder.rounds(schedule, figures, rounds, events)
    return len(rounds)
