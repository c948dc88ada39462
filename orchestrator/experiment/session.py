"""One emulation of an emulated run and the tasks it runs there: the network and the site servers
brought up at one plan (one K), or a trial's left up for it (`Hosting`), the environment recorded,
the background started, the tasks run (the sequential loop, or the online mode), the counters
settled and recorded, and what the session brought up torn down.

A run at one K is one session (`orchestrator.experiment.runner`); a run with a K per point is one
session per point, in the same results database (`orchestrator.experiment.point_runs`), each
session's run clock going on from where the last one stopped (``clock_start_s``), so that no two
records of the run share a time. This module runs a session; it opens and closes no run and
chooses no K.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import platform
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator import interrupts
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.faults import LinkWatcher, follow_links
from orchestrator.experiment.link_recorder import LinkRecorder
from orchestrator.experiment.lost_machines import lost_note
from orchestrator.experiment.online import run_online
from orchestrator.experiment.progress import Progress
from orchestrator.experiment.resume import Resume
from orchestrator.experiment.run_context import ExperimentRun, lifecycle_for
from orchestrator.experiment.runs import scheduler_order, site_peaks, task_sets
from orchestrator.results.db import ResultsDB
from orchestrator.runtime import compute_model
from orchestrator.scheduling import NetworkState
from topologies.plan import EmulationPlan

LOG = logging.getLogger("netai.experiment")


@dataclass
class RunShared:
    """What every session of one emulated run shares: its database, run and folder, the network
    model, the compute backend and the model's size, the remote Docker clients, the live dashboard,
    whether to draw progress bars, and on a resume what the run kept."""

    db: ResultsDB
    run_id: int
    run_dir: Path
    model: Any
    backend_kind: str
    model_bytes: int
    remote: dict[str, Any] = field(default_factory=dict)
    dash: Any = None
    progress: bool = True
    again: Resume | None = None


@dataclass(frozen=True)
class SessionEnd:
    """What a session leaves: its tasks' outcomes by state, a lost machine's note ('' when none),
    the run clock at its end (emulated seconds), and its wall time and the bring-up's, seconds; its
    link samples and where the host's CPU went (``cpu_s_*``), to be summed over sessions; the wall
    seconds its tasks waited for the schedulers' background measurements (`view_s`)."""

    outcomes: dict[str, int]
    lost: str
    clock_end_s: float
    wall_s: float
    bringup_s: float
    link_samples: int = 0
    cpu: dict[str, float] = field(default_factory=dict)
    view_s: float = 0.0
    #: Whether it ran on an emulation a session before it ran on (its last trial's): no bring-up.
    reused: bool = False


def environment(cfg: ExperimentConfig, plan: EmulationPlan, info: Any, backend: str) -> dict[str, Any]:
    cluster = getattr(info, "cluster", {}) or {}
    return {
        "kernel": platform.release(),
        "python": platform.python_version(),
        "datapath": getattr(info, "datapath", "?"),
        "delay_emulated": getattr(info, "delay_emulated", False),
        # each copy paced at its edge's bottleneck rate by its sender (workers/pacing.py), else htb alone
        "paced_copies": cfg.emulation.pace_copies,
        # the userspace datapath's one send budget for every link, bytes (orchestrator/emulation/ovs_socket.py)
        "ovs_send_buffer": getattr(info, "ovs_send_buffer", None),
        # the smallest receive buffer of the run's switch ports' packet sockets, bytes (same module)
        "ovs_receive_buffer": getattr(info, "ovs_receive_buffer", None),
        "bringup_s": round(getattr(info, "bringup_s", 0.0), 3),
        # what ovs-vswitchd's threads were raised to (orchestrator/emulation/datapath_priority.py)
        "datapath_priority": getattr(info, "datapath_priority", None),
        "backend": backend,
        "bw_scale": plan.bw_scale,
        "max_link_mbps": cfg.emulation.max_link_mbps,
        # emulated time runs this many times slower than the wall (1: real time); durations are emulated
        "time_dilation": plan.time_dilation,
        "time_dilation_from": cfg.emulation.time_dilation_from or None,  # `time_dilation: host`: whose K
        # how the locals' training times were taken (workers.compute): the fidelity verdict reads it
        "compute_timing": cfg.task.compute_timing,
        **compute_model.resolve(cfg.task, cfg.compute).environment(),  # the compute model (compute_* keys)
        "connectivity": cfg.emulation.connectivity,
        "cpus": os.cpu_count(),
        "background": f"{cfg.background.pattern}, load {cfg.background.load}, {cfg.background.pairs} pairs"
        if cfg.background.enabled else "off",
    } | ({"cluster": cluster} if cluster else {})  # {servers: {server: [sites]}, cut: [[a, b]..], cut_mbps, ..}


@dataclass
class Hosting:
    """An emulation and its site servers, up: what a session runs on. A run's session brings up its
    own (`hosted`); a point of a run with ``time_dilation: auto`` runs on the one its faithful trial
    ran on, kept up for it (`orchestrator.experiment.kept`), so the trial judged the emulation the
    run measures on. The sessions on one share its install ids (the controller's cookies are never
    reused) and each takes its own folder of task directories (`ComputeManager.tasks_folder`)."""

    emu: Any
    compute: Any
    #: The install ids its sessions hand out, in turn (`ControllerNetwork.new_install_id`).
    install_ids: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    #: How many sessions have run on it (the one running included).
    sessions: int = 0

    def next_session(self) -> None:
        """A session starts on it: from its second on, the tasks' directories go to a folder of its own
        and the site servers' memory peaks are counted afresh (the session's own, `runs.site_peaks`)."""
        self.sessions += 1
        self.compute.tasks_folder = "tasks" if self.sessions == 1 else f"tasks-{self.sessions}"
        if self.sessions > 1:
            getattr(self.compute, "peak_rss", {}).clear()

    @property
    def reused(self) -> bool:
        """Whether the session running on it is not its first (it brought up nothing)."""
        return self.sessions > 1


@contextlib.contextmanager
def hosted(backend_kind: str, cfg: ExperimentConfig, plan: EmulationPlan, log_root: Path, *,
           remote: dict[str, Any] | None = None) -> Iterator[Hosting]:
    """The emulation of `plan` and its site servers brought up (their logs under `log_root`:
    ``emulation/`` and ``workers/``) and torn down on every exit path."""
    from orchestrator.emulation.network import Emulation
    from orchestrator.runtime.backends import emulation_options, open_compute
    from orchestrator.runtime.forked import early_fork_server

    workers = log_root / "workers"
    options = emulation_options(backend_kind, log_dir=workers, clients=remote or {})
    with early_fork_server(backend_kind, log_root=workers) as forks, \
            Emulation(plan, log_dir=log_root / "emulation", connectivity=cfg.emulation.connectivity,
                      datapath=cfg.emulation.datapath, cluster=cfg.emulation.cluster, **options) as emu, \
            open_compute(backend_kind, emu, log_root=workers, forks=forks) as compute:
        yield Hosting(emu=emu, compute=compute)


def run_session(shared: RunShared, cfg: ExperimentConfig, plan: EmulationPlan, *,
                clock_start_s: float = 0.0, hosting: Hosting | None = None) -> SessionEnd:
    """Bring the emulation of `plan` up (or run on `hosting`, up at `plan`'s K, left up), run `cfg`'s
    tasks on it (sequential or online), settle and record, tear down what it brought up (on every
    exit path); the run clock starts at `clock_start_s` emulated seconds."""
    started, db, run_id, run_dir = time.monotonic(), shared.db, shared.run_id, shared.run_dir
    views_before = db.background_view_mark()
    with contextlib.ExitStack() as stack:
        up = hosting or stack.enter_context(hosted(shared.backend_kind, cfg, plan, run_dir, remote=shared.remote))
        up.next_session()
        emu, compute = up.emu, up.compute
        if emu.plan.to_dict() != plan.to_dict():
            raise ValueError(f"the emulation is up with another plan (K={emu.plan.time_dilation:g}) than the "
                             f"session's (K={plan.time_dilation:g})")
        record_environment(db, run_id, cfg, plan, shared.backend_kind, emu, compute, reused=up.reused)
        background = Background(cfg, plan, shared.model, emu, run_dir / "background")
        run = lifecycle_for(cfg, emu, compute, db=db, run_id=run_id, plan=plan, model=shared.model, run_dir=run_dir,
                            clock_start_s=clock_start_s, install_ids=up.install_ids)
        run.background_step = background.step
        if shared.dash is not None:
            shared.dash.controller = emu.client
        recorder = LinkRecorder(emu.client, plan, db.path, run_id, clock=run.core.clock.now, cpu=emu.run_id).start()
        try:
            if cfg.mode == "online":
                run_online(run, shared.model_bytes)
            else:
                run_sequential(run, shared.model_bytes, progress=shared.progress, again=shared.again)
        finally:
            settle_and_record(run.core, recorder, background, db, run_id, plan, clock_start_s=clock_start_s)
            db.update_environment(run_id, **site_peaks(compute, shared.model_bytes))
            if hosting is not None:  # left up: its far machines' probes settled now, not at its teardown
                emu.lost_sites(settle=True)
        reused = up.reused
    if emu.info is not None and emu.info.cluster.get("far", {}).get("lost"):
        db.update_environment(run_id, cluster=emu.info.cluster)  # with the lost machines
    bringup_s = 0.0 if reused else float(getattr(emu.info, "bringup_s", 0.0) or 0.0)  # a trial's, before it
    return SessionEnd(outcomes=dict(run.core.outcomes), lost=lost_note(emu), clock_end_s=run.core.clock.now(),
                      wall_s=time.monotonic() - started, bringup_s=bringup_s,
                      link_samples=recorder.samples, cpu=recorder.cpu_environment(),
                      view_s=db.background_view_wait_s(run_id, views_before), reused=reused)


def record_environment(db: ResultsDB, run_id: int, cfg: ExperimentConfig, plan: EmulationPlan,
                       backend_kind: str, emu: Any, compute: Any, *, reused: bool = False) -> None:
    """Record the machine, the emulation just brought up (or, `reused`, left up by the run's last
    trial: ``on_trial_emulation``) and whether it enforces reservations."""
    info = emu.info
    reservations = emu.client.health().get("reservations", {})
    db.update_environment(run_id, **environment(cfg, plan, info, backend_kind) | {  # a resume's adds to the first
        "remote_sites": {site: server.docker for server in cfg.remote_servers for site in server.sites},
        "reservations_enforced": bool(reservations.get("enforced")),
        "reservations_note": reservations.get("reason", ""), "mode": cfg.mode, "on_trial_emulation": reused,
        # the site containers' CPU weight against the host's other processes (orchestrator/runtime/site_cgroup.py)
        "site_cpu_group": getattr(getattr(emu, "host_cls", None), "describe_groups", lambda: None)()})
    LOG.info("emulation up: %d switches in %.1f s, delay emulated: %s; %d site servers up",
             len(plan.switches), getattr(info, "bringup_s", 0.0), getattr(info, "delay_emulated", False),
             len(compute.servers))


class Background:
    """The run's background traffic: started with the config's flows when made, replaced by a load
    step (a fault event, `step`), and stopped once at the end (`stop`), which returns the flow
    results of every run of it, the replaced ones included."""

    def __init__(self, cfg: ExperimentConfig, plan: EmulationPlan, model: Any, emu: Any, log_dir: Path) -> None:
        from orchestrator.emulation.background import BackgroundTraffic, plan_background

        self._cfg, self._plan, self._model, self._emu, self._log_dir = cfg, plan, model, emu, log_dir
        flows = plan_background(model, plan, cfg.background, topology=cfg.topology, seed=cfg.seed) \
            if cfg.background.enabled else []
        if flows:
            emu.client.set_background([[f.src, f.dst] for f in flows])
        self._traffic = BackgroundTraffic(emu.host, flows, cfg.background, seed=cfg.seed, log_dir=log_dir)
        self._traffic.start()
        self._stopped: list[Any] = []  # flow results of background runs a load step replaced
        self._steps = itertools.count(1)

    def step(self, load: float) -> None:
        """A step of the background load (a fault event): the flows re-planned for `load`."""
        from orchestrator.emulation.background import BackgroundTraffic, plan_background

        cfg = self._cfg
        self._stopped.extend(self._traffic.stop())
        step_cfg = replace(cfg.background, load=load, enabled=load > 0)
        new = plan_background(self._model, self._plan, step_cfg, topology=cfg.topology, seed=cfg.seed) \
            if load > 0 else []
        self._emu.client.set_background([[f.src, f.dst] for f in new])
        self._traffic = BackgroundTraffic(self._emu.host, new, step_cfg, seed=cfg.seed,
                                          log_dir=self._log_dir / f"step-{next(self._steps)}")
        self._traffic.start()

    def stop(self) -> list[Any]:
        """Stop the current flows; the results of every run of the background, in order."""
        return [*self._stopped, *self._traffic.stop()]


def settle_and_record(core: Any, recorder: LinkRecorder, background: Background, db: ResultsDB, run_id: int,
                      plan: EmulationPlan, *, clock_start_s: float = 0.0) -> None:
    """The end of the tasks, on every exit path: the last flow counters settled (best effort), the
    link recorder stopped, the run's clock end, the session's wall time in its tasks (its emulated
    time since `clock_start_s` times K), link samples and the background flows recorded."""
    with contextlib.suppress(Exception):
        core.settle_counters(wait=True)
    recorder.stop()
    end = core.clock.now()
    db.update_environment(run_id, clock_end_s=round(end, 3), link_samples=recorder.samples,
                          wall_s=round((end - clock_start_s) * plan.time_dilation, 3))
    db.update_environment(run_id, **recorder.cpu_environment())  # where the host's CPU went (cpu_use)
    for r in background.stop():
        db.record_background(run_id, r.src, r.dst, r.offered_mbps / plan.bw_scale,
                             None if r.achieved_mbps is None else r.achieved_mbps / plan.bw_scale)


def run_sequential(run: ExperimentRun, model_bytes: int, *, progress: bool, again: Resume | None = None) -> None:
    """Every point's tasks, one at a time, every scheduler on the same task before the next (so
    background load and machine noise hit the schedulers alike), in the order `scheduler_order`
    gives the task (by default rotated from task to task, so no scheduler always runs first). On a
    resume (`again`) the tasks the run kept are not run again: their reservations go back on their
    scheduler's network state."""
    cfg, core = run.cfg, run.core
    tasks = task_sets(cfg, run.model, model_bytes)
    bar = Progress(sum(len(ts) for ts in tasks.values()) * len(cfg.schedulers), enabled=progress)
    core.on_events = bar.follow
    states = {(s, n): NetworkState(run.model) for s in cfg.schedulers for n in cfg.locals}
    watcher = None
    if run.machines is not None:  # a lost machine's links are cuts: a task crossing them fails (no moves here)
        watcher = LinkWatcher(run.emu.client, run.machines.links)
        core.labels |= {name: (name, "never") for name in cfg.schedulers}
    try:
        for n in cfg.locals:
            for k, task in enumerate(tasks[n]):
                for name in scheduler_order(cfg.schedulers, k, cfg.order):
                    if again is not None and again.has(name, task.id):
                        again.readmit(name, task.id, states[(name, n)])
                        bar.advance_run()
                        continue
                    if watcher is not None and run.machines is not None:
                        run.machines.label = name
                        run.machines.refresh()
                        follow_links(core, watcher, [])  # a machine lost since: scheduled without it
                    core.arrive(name, task)
                    live = core.admit(name, task, states[(name, n)])
                    if not live.ended:
                        bar.task(f"{name}: task {task.id}, {len(task.local_sites)} locals", task.rounds)
                        nodes = live.schedule.overlay_nodes
                        while not (watcher is not None and follow_links(core, watcher, [live])) and \
                                not core.check(live, run.compute.poll(nodes)):
                            interrupts.check()
                            core.settle_counters()
                            time.sleep(0.05)  # poll interval of the roles' states; tasks have budgets
                    core.settle_counters()
                    bar.advance_run()
    finally:
        core.on_events = None
        bar.close()
