"""The online mode: tasks arrive over time and run side by side on the shared network.

`arrival_trace` draws the tasks and their arrival times once, from ``online.seed``: ``poisson``
(exponential inter-arrival times of mean ``online.mean_interarrival_s``) or ``all`` (every task at
time 0); each task draws its number of locals from the config's ``locals``. Every scheduler gets
the same trace, one scheduler after the other on the same emulation, each from an empty network
state, so their runs do not disturb each other.

`run_online` admits each task when it arrives (on the live state: running tasks' reservations and
the measured load), follows every running task, and ends each after its rounds, releasing its
reservation. Every ``online.sample_s`` it records the tasks running, the reserved and the carried
bandwidth (model units, summed over links; carried from the task flows' byte counters), the
machine's memory in use, and every site server's CPU seconds, memory and roles
(`ResultsDB.record_sample`).

With ``events`` (`orchestrator.experiment.faults`) each trace also replays the same events, timed
from its first task's arrival, and the loop hands what the controller reports (links down or up)
to the task manager, which applies the trace's rescheduling policy; with several policies every
scheduler runs the trace once per policy (labels ``<scheduler>/<policy>``). Between traces every cut
link is restored and every killed server restarted, so each starts from the same network.
"""

from __future__ import annotations

import logging
import random
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import interrupts
from orchestrator.emulation.controller_client import onto_link
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.lifecycle import policy
from orchestrator.scheduling import NetworkState
from orchestrator.scheduling.tasks import Task, generate_tasks
from topologies.model import NetworkModel

if TYPE_CHECKING:
    from orchestrator.experiment.faults import FaultInjector
    from orchestrator.experiment.run_context import ExperimentRun

LOG = logging.getLogger("netai.online")


def arrival_trace(cfg: ExperimentConfig, model: NetworkModel, model_bytes: int) -> list[tuple[float, Task]]:
    """(arrival time in seconds from the start, task) for ``cfg.online.tasks`` tasks, in arrival order."""
    on = cfg.online
    rng = random.Random(on.seed)
    t, trace = 0.0, []
    for k in range(on.tasks):
        n = rng.choice(cfg.locals)
        (task,) = generate_tasks(model, count=1, locals_per_task=n, seed=on.seed * 100_003 + k, first_id=k + 1,
                                 model_name=cfg.task.model, rounds=cfg.task.rounds,
                                 demand_mbps=cfg.task.demand_mbps, model_bytes=model_bytes)
        if on.arrival == "poisson" and k > 0:
            t += rng.expovariate(1.0 / on.mean_interarrival_s)
        trace.append((t, task))
    return trace


def memory_used_bytes() -> int | None:
    """The machine's memory in use (MemTotal - MemAvailable), or None where /proc/meminfo lacks it."""
    try:
        info = {k: int(v.split()[0]) * 1024 for k, _, v in
                (line.partition(":") for line in Path("/proc/meminfo").read_text().splitlines())}
        return info["MemTotal"] - info["MemAvailable"]
    except (OSError, KeyError, ValueError, IndexError):
        return None


class _Sampler:
    """Reserved and carried bandwidth, memory and the sites' load, every `period_s`."""

    def __init__(self, run: ExperimentRun, scheduler: str, period_s: float) -> None:
        self.run = run
        self.scheduler = scheduler
        self.period_s = period_s
        self.next_t = 0.0
        self._last_bytes: dict[int, int] = {}
        self._last_t: float | None = None

    def carried_mbps(self, live_ids: set[int], now: float) -> float | None:
        try:
            flows = self.run.emu.client.flows()
        except Exception:  # noqa: BLE001 -- the controller did not answer this time: no figure
            return None
        by_task: dict[int, int] = {}
        for f in flows:
            if f.get("task") in live_ids and onto_link(f):  # once per link crossed, as carried bytes
                by_task[f["task"]] = by_task.get(f["task"], 0) + int(f.get("bytes", 0))
        rate = None
        if self._last_t is not None and now > self._last_t:
            delta = sum(max(0, b - self._last_bytes.get(t, 0)) for t, b in by_task.items())
            rate = delta * 8 / 1e6 / (now - self._last_t) / self.run.plan.bw_scale
        self._last_bytes, self._last_t = by_task, now
        return rate

    def maybe(self, live: list[Any], statuses: dict[str, dict[str, Any]], *, force: bool = False) -> None:
        now = self.run.core.clock.now()
        if now < self.next_t and not force:
            return
        self.next_t = now + self.period_s
        sites = {s: (float(st.get("cpu_s", 0.0)), int(st.get("pss_bytes", 0)), len(st.get("roles", {})))
                 for s, st in statuses.items()}
        self.run.db.record_sample(
            self.run.run_id, self.scheduler, now, running=len(live),
            reserved_mbps=sum(lv.schedule.reserved_mbps_total for lv in live),
            carried_mbps=self.carried_mbps({lv.install_id for lv in live}, now),
            memory_used_bytes=memory_used_bytes(), sites=sites)


def run_online(run: ExperimentRun, model_bytes: int) -> None:
    """Run the arrival trace under every scheduler of ``run.cfg`` in turn (see the module docstring)."""
    cfg = run.cfg
    trace = arrival_trace(cfg, run.model, model_bytes)
    LOG.info("online: %d tasks over %.1f s (%s), schedulers %s", len(trace), trace[-1][0] if trace else 0.0,
             cfg.online.arrival, ", ".join(cfg.schedulers))
    policies = cfg.reschedule.policies
    for name in cfg.schedulers:
        for resched in policies:
            label = name if len(policies) == 1 else f"{name}/{resched}"
            run.core.labels[label] = (name, resched)
            try:
                _run_trace(run, label, trace, NetworkState(run.model))
            finally:
                restore_network(run)
            run.core.settle_counters(wait=True)  # this trace's flows gone before the next one's


def restore_network(run: ExperimentRun) -> None:
    """Bring back every link the emulation has cut and every site server that was killed (between
    traces, so each starts from the same network); failures are logged."""
    from orchestrator.experiment.faults import LinkWatcher

    lost = run.machines.links() if run.machines is not None else set()  # not to be restored: their machine is gone
    cut = ({tuple(sorted(e.link)) for e in run.cfg.events if e.link is not None} | set(run.core.down)) - lost
    for a, b in sorted(cut):
        try:
            run.emu.set_link(a, b, True)
        except Exception as e:  # noqa: BLE001 -- the next trace reports what is still cut
            LOG.warning("restoring link %s-%s: %s", a, b, e)
    for site in sorted(run.compute.lost):
        try:
            run.compute.restart_server(site)
        except Exception as e:  # noqa: BLE001
            LOG.warning("restarting the site server of %s: %s", site, e)
    if any(e.action == "background" for e in run.cfg.events) and run.background_step is not None:
        try:
            run.background_step(run.cfg.background.load if run.cfg.background.enabled else 0.0)
        except Exception as e:  # noqa: BLE001
            LOG.warning("restoring the background load: %s", e)
    if run.core.down:
        watcher = LinkWatcher(run.emu.client, None if run.machines is None else run.machines.links)
        for _ in range(50):  # until the controller has seen the ports come back; bounded (~5 s)
            watcher.poll()
            if watcher.down <= lost:
                break
            time.sleep(0.1)
        run.core.down = set(watcher.down)


def _run_trace(run: ExperimentRun, scheduler: str, trace: list[tuple[float, Task]], state: NetworkState) -> None:
    from orchestrator.experiment.faults import LinkWatcher, follow_links

    tm = run.core
    pending = deque(trace)
    live: list[Any] = []
    sampler = _Sampler(run, scheduler, run.cfg.online.sample_s)
    start = tm.clock.now()
    ended = 0
    injector = _injector(run, scheduler, live)
    injector.start()
    if run.machines is not None:
        run.machines.label = scheduler
    also = None if run.machines is None else run.machines.links
    watcher = LinkWatcher(run.emu.client, also) if run.cfg.events or also else None
    resched = tm.labels.get(scheduler, (scheduler, ""))[1]
    next_look = start + run.cfg.reschedule.period_s
    while pending or live:
        injector.due()
        if watcher is not None:
            ended += follow_links(tm, watcher, live)
        if resched == "periodic" and tm.clock.now() >= next_look:
            next_look = tm.clock.now() + run.cfg.reschedule.period_s
            n = len(live)
            policy.periodic(tm, live, run.cfg.reschedule.threshold)
            ended += n - len(live)
        now = tm.clock.now() - start
        while pending and pending[0][0] <= now:
            t_arrival, task = pending.popleft()
            tm.arrive(scheduler, task, at_s=start + t_arrival)  # the trace's time, however late the loop is
            admitted = tm.admit(scheduler, task, state)
            if admitted.ended:
                ended += 1
            else:
                live.append(admitted)
            LOG.info("%s: task %d arrived at %.1f s (%d locals): %s; %d running", scheduler, task.id, now,
                     len(task.local_sites), "not admitted" if admitted.ended else "admitted", len(live))
        statuses = run.compute.poll()
        for lv in list(live):
            if tm.check(lv, statuses):
                live.remove(lv)
                ended += 1
        sampler.maybe(live, statuses)
        tm.settle_counters()
        if pending or live:
            interrupts.check()
            time.sleep(0.1)  # poll interval; every task has its own budget (TaskExecution.check)
    left = injector.finish()
    if left:
        LOG.warning("%s: the trace ended before %d event(s) were due; not applied (recorded as failed): %s",
                    scheduler, len(left), "; ".join(" ".join(filter(None, (e.action, e.target, e.when))) for e in left))
    sampler.maybe(live, run.compute.poll(), force=True)  # the trace's end: its last CPU and memory figures
    LOG.info("%s: %d tasks ended in %.1f s", scheduler, ended, tm.clock.now() - start)


def _injector(run: ExperimentRun, scheduler: str, live: list[Any]) -> FaultInjector:
    """The fault injector of one scheduler's trace: it records each event under `scheduler`, and
    finds a task's busiest link and its progress among `live` (the running tasks, a list the
    trace's loop keeps up to date in place)."""
    from functools import partial

    from orchestrator.experiment.faults import FaultInjector, busiest_link

    return FaultInjector(run.cfg.events, run.emu, run.compute.manager, run.core.clock.now,
                         partial(run.db.record_fault, run.run_id, scheduler),
                         background_step=run.background_step,
                         task_link=lambda tid: next((busiest_link(lv.schedule, run.model) for lv in live
                                                     if lv.task.id == tid), None),
                         progress=lambda tid: next((lv.rounds_recorded for lv in live if lv.task.id == tid), None))
