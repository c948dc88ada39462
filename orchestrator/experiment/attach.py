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

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.emulation.network_port import ControllerNetwork
from orchestrator.emulation.running import RunningNetwork
from orchestrator.errors import ConfigError
from orchestrator.lifecycle.core import Lifecycle, RunClock
from orchestrator.lifecycle.recorder import DbRecorder, NullRecorder
from orchestrator.results import queries
from orchestrator.results.db import ResultsDB
from orchestrator.runtime.backends import NamespaceBackend
from orchestrator.runtime.compute_model import DEFAULT_COMPUTE, ComputeModel, for_training, resolve
from orchestrator.runtime.compute_port import TaskServers
from orchestrator.runtime.summaries import RoundResult, TaskResult
from orchestrator.runtime.task_runner import FLOptions
from orchestrator.runtime.timing import TRAIN_ALLOWANCE_S
from orchestrator.scheduling import Schedule, resolve_scheduler
from orchestrator.scheduling.tasks import Task, generate_tasks

#: How often the roles' events are read for rounds G has completed (s).
PROGRESS_PERIOD_S = 0.5


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
    train_allowance_s: float = TRAIN_ALLOWANCE_S
    #: How the task's modelled training cost is set (`orchestrator.runtime.compute_model`).
    compute: ComputeModel = DEFAULT_COMPUTE


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

    def close(self) -> None:
        self.db.close()


def run_attached(
    net: RunningNetwork,
    req: AttachRequest,
    *,
    say: Callable[[str], None] = lambda _m: None,
    on_round: Callable[[RoundResult], None] = lambda _r: None,
) -> AttachOutcome:
    """Run one task on the running network `net` through the lifecycle core (see the module docstring).

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
    pids = {site: (net.host_pid(site), h.ip, h.name) for site, h in hosts.items()}  # a host that is gone: now
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
            log_dir = req.log_root / f"{time.strftime('%Y%m%d-%H%M%S')}-attach-task{task.id}"
            core, network = _attached_core(net, model, req, pids, log_dir, recorder, say, on_round,
                                           install_id=task.id, scheduler=scheduler)
            core.arrive(label, task)
            live = core.admit(label, task, net.network_state(model))
        if not live.ended:
            sched = live.schedule
            enforced = network.last_install.get("reservation", {}).get("enforced")
            say(f"task {task.id}: G={task.global_site}, locals={', '.join(task.local_sites)}; {label}: "
                f"{len(sched.relay_sites)} relays, {len(sched.edges)} paths installed on {net.name} "
                f"(reservation {'enforced' if enforced else 'NOT enforced'}); logs {log_dir}")
        core.follow(live, poll_s=0.05)
        return AttachOutcome(task=task, schedule=live.schedule, result=live.result,
                             reservation=network.last_install.get("reservation", {}), log_dir=log_dir,
                             recorded_in=recorder.path if recorder else "")
    finally:
        if recorder:
            recorder.close()


def _report(rounds: list[RoundResult], on_round: Callable[[RoundResult], None]) -> None:
    for r in rounds:
        on_round(r)


def _attached_core(net: RunningNetwork, model: Any, req: AttachRequest, hosts: dict[str, tuple[int, str, str]],
                   log_dir: Path, recorder: LiveRecorder | None, say: Callable[[str], None],
                   on_round: Callable[[RoundResult], None], *, install_id: int,
                   scheduler: Any) -> tuple[Lifecycle, ControllerNetwork]:
    """The lifecycle core of one attached task: the running network's controller, site servers in the
    task's hosts only, and the network's results database (if it records one)."""
    assert net.state is not None  # host_pid needed it
    run_mark = net.state.run_id
    delay = bool(getattr(net.state, "delay_emulated", False))
    network = ControllerNetwork(net.client, net.plan, delay_emulated=delay, install_ids=iter((install_id,)),
                                measure_background=False)
    compute = TaskServers(hosts, lambda chosen, root: NamespaceBackend(chosen, log_root=root, run_id=run_mark),
                          log_dir, model=model, rate=network.rate, propagation=delay,
                          train_allowance_s=req.train_allowance_s, options=lambda _t: req.options,
                          training=(training := resolve(req.options, req.compute)).cost)
    for_training(scheduler, training, req.options.local_epochs)
    rounds_of = req.options.rounds
    compute.on_up = lambda n: say(f"{n} site servers up in the task's hosts; running {rounds_of} rounds")
    clock = RunClock(recorder.clock_zero) if recorder else RunClock()
    rec = DbRecorder(recorder.db, recorder.run_id) if recorder else NullRecorder()
    core = Lifecycle(network=network, compute=compute, recorder=rec, clock=clock, model=model,
                     schedulers=lambda _name: scheduler, whole_updates=req.options.compression == "none",
                     progress_period_s=PROGRESS_PERIOD_S,
                     on_rounds=lambda _live, rounds: _report(rounds, on_round))
    return core, network
