"""The AI task manager: the task database's life cycle of every task, on the live network state.

A task goes ``pending`` (arrived) -> ``scheduled`` (admitted: placed on the live state, its flows
and reservation installed) -> ``running`` (its roles sent to the site servers) -> ``done`` or
``failed``; or ``pending`` -> ``blocked`` (no feasible placement). Each state change is written to
the results database with the time on the run's clock (`RunClock`): arrival, admitted, first
broadcast (G starting round 1), finished; ``start_overhead_s`` is admitted -> first broadcast.

What the scheduler sees when a task arrives (`NetworkState`): the reservations of the tasks
holding links (running tasks in the online mode; in the sequential mode, the point's earlier
tasks, as in the paper's static evaluation) and the background load measured from the switches'
port statistics, less what the running tasks' own reservations account for on each link.

A task that ends (done or failed) has its roles stopped and forgotten on the servers, and, after
its flow counters have settled (`CounterReads`: Open vSwitch refreshes them about once a second),
its carried bytes recorded and its flows and rate classes removed; in the online mode it releases
its reservation at once.

Faults (`orchestrator.experiment.faults`; docs/architecture.md, "Faults and rescheduling"): while
links are cut, schedulers see the network without them. A running task whose paths cross a link
that went down fails (policy ``never``) or is *moved* (``on_failure``, ``periodic``): its roles
stop, it is scheduled again, its new paths installed under a new install id, and new roles resume
from the round after the last one G completed, G starting from its checkpoint of that round (the
round in flight is retried). ``periodic`` also moves a task whose predicted round latency a new
schedule would cut by more than the threshold. A role other than G that is lost (its server
killed) leaves the task running without it; when its server is back the task is moved onto the
same schedule so the site rejoins. Every move is recorded (``moves`` table): when, why, both
schedules, the round resumed, the interruption (last good round end to the next round start) and
the predicted saving.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import ExperimentConfig, TaskConfig
from orchestrator.experiment.faults import Link, crosses, link_name
from orchestrator.results.db import ResultsDB
from orchestrator.runtime.task_runner import FLOptions, RoundResult, TaskExecution, node_rounds, rounds_so_far
from orchestrator.runtime.timing import task_timing
from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.cost import RoundBound, RoundFigures, emulated_rate, round_figures
from orchestrator.scheduling.tasks import Task
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan

LOG = logging.getLogger("netai.tasks")
#: A task moved more often than this fails (a role that fails again at every restart must not loop).
MAX_MOVES = 8


class RunClock:
    """Seconds since the run's clock started (CLOCK_MONOTONIC, which the roles' events use too)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def of(self, monotonic_t: float) -> float:
        return monotonic_t - self.t0


@dataclass
class LiveTask:
    """A task admitted by one scheduler and not yet ended."""

    scheduler: str
    task: Task
    schedule: Schedule
    state: NetworkState
    figures: RoundFigures
    execution: TaskExecution | None
    admitted_s: float
    reservation_enforced: bool
    #: The id its flows (cookie), ports and roles carry: unique in the run, so that the same task under
    #: the next scheduler never meets this one's flows while their counters settle.
    install_id: int
    #: The last round recorded while the task ran, and when its events were last read (monotonic).
    rounds_recorded: int = 0
    progress_read_t: float = 0.0
    #: Moves so far; the move whose next round start is not yet recorded; when the last good round ended
    #: (monotonic); G's first round start (monotonic, from the first execution); G's latest checkpoint.
    moves: int = 0
    pending_move: int | None = None
    last_round_end_t: float | None = None
    first_broadcast_t: float | None = None
    checkpoint: Path | None = None
    #: Sites whose role loss was already recorded (this execution).
    lost_seen: set[str] = field(default_factory=set)
    #: The log directory of the task (each move's roles log in a subdirectory).
    log_dir: Path | None = None
    last_move_s: float = 0.0


@dataclass
class CounterReads:
    """Tasks whose flow counters are still settling: (scheduler, task id) -> (last read, bytes)."""

    settle_s: float = 1.2
    #: (scheduler, task id, install id) -> (time of the last read, its bytes)
    pending: dict[tuple[str, int, int], tuple[float, int | None]] = field(default_factory=dict)


def measured_background(client: Any, plan: EmulationPlan) -> dict[tuple[str, str], float]:
    """Current load per directed link from the controller's port statistics, in model units."""
    loads: dict[tuple[str, str], float] = {}
    for link in client.link_stats():
        try:
            (a, b), rate = link["link"], float(link["rate_mbps"])
        except (KeyError, TypeError, ValueError):
            continue
        loads[(str(a), str(b))] = rate / plan.bw_scale
    return loads


def fl_options(task: TaskConfig, *, rounds: int, seed: int) -> FLOptions:
    """How a task of an experiment learns: its config's `task` section (model, data, training knobs)."""
    return FLOptions(model=task.model, model_args=dict(task.model_args), rounds=rounds, partitioning=task.partition,
                     alpha=task.alpha, seed=seed, lr=task.lr, local_epochs=task.local_epochs,
                     batch_size=task.batch_size, strategy=task.strategy, mu=task.mu, compression=task.compression,
                     k=task.k, dataset=task.dataset, dataset_args=dict(task.dataset_args),
                     selection=task.selection)


def round_bound(figures: RoundFigures, schedule: Schedule, r: RoundResult) -> RoundBound:
    """The lower bound of round `r`: with the round's own fastest training, and the joint bound
    only if every local trained and none was left out (`orchestrator.scheduling.cost`)."""
    every_local = r.trained >= len(schedule.local_sites) and not r.stragglers
    return replace(figures.lower_bound, train_s=r.train_min_s, joint_s=figures.joint_s if every_local else 0.0)


def record_rounds(db: ResultsDB, run_id: int, scheduler: str, schedule: Schedule, figures: RoundFigures,
                  rounds: Sequence[RoundResult], events: Mapping[str, Sequence[Mapping[str, Any]]],
                  clock_of: Callable[[float], float]) -> None:
    """Record `rounds` of `schedule`'s task, each with its lower bound and physical reference (the
    round's own fastest training in place of the model's), its local-model selection (the policy G
    logged, the locals it chose, the round's UPDATE bytes), and what every node did in each round
    (from `events`, on the clock `clock_of`)."""
    chose = [e for e in events.get(schedule.global_site, ()) if e.get("event") == "selected"]
    policy = str(chose[0].get("policy", "all")) if chose else "all"
    for r in rounds:
        bound = round_bound(figures, schedule, r)
        db.record_round(
            run_id, scheduler, schedule.task_id, r.round, latency_s=r.latency_s, broadcast_s=r.broadcast_s,
            train_s=r.train_s, upload_s=r.upload_s, accuracy=r.accuracy, lower_bound_s=bound.lower_s,
            stragglers=len(r.stragglers), broadcast_all_s=r.broadcast_all_s, upload_tail_s=r.upload_tail_s,
            broadcast_bound_s=bound.broadcast_s, upload_bound_s=bound.upload_s,
            reference_s=replace(figures.reference, train_s=r.train_min_s).lower_s)
        db.record_round_selection(run_id, scheduler, schedule.task_id, r.round, policy=policy,
                                  selected=r.selected, upload_bytes=r.upload_bytes)
    db.record_node_rounds(run_id, scheduler, schedule.task_id, node_rounds(schedule, events, clock_of))


class TaskManager:
    """Admits, follows and ends tasks for one run (see the module docstring).

    Parameters
    ----------
    release_on_end
        Release a task's reservation in its `NetworkState` when it ends (the online mode); the
        sequential mode keeps the point's earlier tasks' reservations, as the paper's evaluation does.
    """

    def __init__(self, *, db: ResultsDB, run_id: int, emu: Any, plan: EmulationPlan, model: NetworkModel,
                 compute: Any, cfg: ExperimentConfig, run_dir: Path, clock: RunClock,
                 release_on_end: bool) -> None:
        self.db = db
        self.run_id = run_id
        self.emu = emu
        self.plan = plan
        self.model = model
        self.compute = compute
        self.cfg = cfg
        self.run_dir = run_dir
        self.clock = clock
        self.release_on_end = release_on_end
        self.counters = CounterReads()
        self.delay = bool(getattr(emu.info, "delay_emulated", False))
        self.rate = emulated_rate(plan)
        #: Tasks that ended, by outcome (done, failed, blocked).
        self.outcomes: dict[str, int] = {"done": 0, "failed": 0, "blocked": 0}
        self._install_ids = itertools.count(1)
        #: Links cut now (sorted site pairs), as the controller reports them (`links_changed`).
        self.down: set[Link] = set()
        #: Label -> (scheduler name, rescheduling policy): a trace may run a scheduler under each policy.
        self.labels: dict[str, tuple[str, str]] = {}
        #: G checkpoints after every round and lost roles are tolerated (the run has events or moves).
        self.faults = bool(getattr(cfg, "faults", False))
        #: Sets the background load to a fraction (the runner's; a fault event's load step), or None.
        self.background_step: Callable[[float], None] | None = None

    # -- arrival and admission ------------------------------------------------------------------------
    def arrive(self, scheduler: str, task: Task, at_s: float | None = None) -> None:
        """Record `task`'s arrival (at `at_s` on the run's clock; default now)."""
        at = self.clock.now() if at_s is None else at_s
        self.db.record_task(self.run_id, scheduler, task, state="pending")
        self.db.set_task_times(self.run_id, scheduler, task.id, arrival_s=at)
        self.db.set_task_state(self.run_id, scheduler, task.id, "pending", at_s=at)

    def admit(self, scheduler: str, task: Task, state: NetworkState) -> LiveTask | None:
        """Schedule `task` on the live `state`, install it and send its roles; None if blocked or
        failed at start (both recorded)."""
        state.set_background(self._background(state))
        self.db.record_network_state(self.run_id, scheduler, task.id, state)
        schedule = self._schedule(scheduler, task, state)
        if schedule.blocked:
            LOG.info("task %d (%d locals) blocked by %s: %s", task.id, len(task.local_sites), scheduler,
                     schedule.reason)
            self.db.set_task_state(self.run_id, scheduler, task.id, "blocked", schedule.reason, at_s=self.clock.now())
            self.outcomes["blocked"] += 1
            return None
        state.admit(schedule)
        figures = self._figures(schedule, task.model_bytes)
        self.db.record_schedule(self.run_id, schedule, figures.lower_bound.lower_s, scheduler=scheduler)
        admitted = self.clock.now()
        self.db.set_task_state(self.run_id, scheduler, task.id, "scheduled", at_s=admitted)
        self.db.set_task_times(self.run_id, scheduler, task.id, admitted_s=admitted)
        install_id = next(self._install_ids)
        wire = replace(schedule, task_id=install_id)
        live = LiveTask(scheduler=scheduler, task=task, schedule=schedule, state=state, figures=figures,
                        execution=None, admitted_s=admitted, reservation_enforced=False, install_id=install_id)
        try:  # from here on, any failure ends the task as failed: roles, flows and reservation released
            name = f"{scheduler.replace('/', '-')}-{task.id}"
            log_dir = live.log_dir = self.compute.task_dir(name)
            link = self.run_dir / "tasks" / name
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists() and not link.is_symlink():
                link.symlink_to(log_dir.resolve(), target_is_directory=True)
            self._launch(live, wire, log_dir)
        except Exception as e:  # noqa: BLE001 -- whatever went wrong, the task is recorded as failed
            self._end(live, "failed", f"start: {type(e).__name__}: {e}")
            return None
        self.db.set_task_state(self.run_id, scheduler, task.id, "running", at_s=self.clock.now())
        return live

    def _figures(self, schedule: Schedule, model_bytes: int) -> RoundFigures:
        """The schedule's bounds and references as emulated (`cost.round_figures`)."""
        return round_figures(self.model, schedule, model_bytes, rate=self.rate, propagation=self.delay,
                             whole_updates=self.cfg.task.compression == "none")

    def _schedule(self, label: str, task: Task, state: NetworkState) -> Schedule:
        """`task` scheduled by `label`'s scheduler on `state` without the links cut now (blocked,
        with the reason, if the cut separates its sites)."""
        name = self.labels.get(label, (label, ""))[0]
        view = state
        if self.down:
            try:
                view = state.without_links(self.down, around=task.global_site)
            except ConfigError as e:
                return Schedule.blocked_for(task, name, str(e))
            apart = sorted(set(task.local_sites) - set(view.model.sites))
            if apart:
                cut = ", ".join(link_name(link) for link in sorted(self.down))
                return Schedule.blocked_for(task, name, f"the cut links ({cut}) separate {apart} from G")
        return self.cfg.scheduler(name).schedule(view, task)

    def _launch(self, live: LiveTask, wire: Schedule, log_dir: Path, *, first_round: int = 1,
                init_model: Path | None = None) -> None:
        """Install `live`'s paths (`wire`: its schedule under its install id) and send its roles,
        logging to `log_dir`, from round `first_round` (G from `init_model`). Raises on failure."""
        task = live.task
        options = fl_options(self.cfg.task, rounds=task.rounds, seed=self.cfg.seed + task.id)
        timing = task_timing(self.model, live.schedule, task.model_bytes, rate=self.rate, propagation=self.delay,
                             train_allowance_s=self.cfg.task.train_allowance_s)
        live.execution = TaskExecution(wire, manager=self.compute, options=options, log_dir=log_dir, timing=timing,
                                       first_round=first_round, init_model=init_model, checkpoint=self.faults,
                                       tolerate_lost=self.faults)
        installed = self.emu.install_task(wire)
        live.reservation_enforced = bool(installed.get("reservation", {}).get("enforced"))
        live.execution.start()

    def _background(self, state: NetworkState) -> dict[tuple[str, str], float]:
        """Measured load per link less the reservations the state already holds there (the running
        tasks' traffic is counted by their reservations, not twice). While the controller does not
        answer (it restarts), the state's last background stands."""
        try:
            measured = measured_background(self.emu.client, self.plan)
        except Exception:  # noqa: BLE001 -- the controller restarts: keep what was last measured
            return dict(state.background_mbps)
        return {k: max(0.0, v - state.ai_mbps(*k)) for k, v in measured.items()}

    # -- following -----------------------------------------------------------------------------------------
    def check(self, live: LiveTask, statuses: dict[str, dict[str, Any]]) -> bool:
        """Whether `live` has ended (done or failed; recorded either way)."""
        assert live.execution is not None
        try:
            if not live.execution.check(statuses):
                self._record_progress(live)
                return not self._follow_lost_roles(live)
        except (RuntimeError, TimeoutError) as e:
            self._end(live, "failed", str(e).splitlines()[0])
            return True
        self._end(live, "done", "")
        return True

    # -- faults and moves -------------------------------------------------------------------------------
    def _follow_lost_roles(self, live: LiveTask) -> bool:
        """Record roles newly lost; once every lost role's server is back, move the task onto the same
        schedule so those sites rejoin. False if the task ended."""
        assert live.execution is not None
        lost = live.execution.lost_roles
        for site in sorted(set(lost) - live.lost_seen):
            live.lost_seen.add(site)
            LOG.warning("task %d %s: role at %s lost (%s); the rounds go on without it", live.task.id,
                        live.scheduler, site, lost[site])
            self.db.set_task_state(self.run_id, live.scheduler, live.task.id, "running",
                                   f"role at {site} lost: {lost[site]}", at_s=self.clock.now())
        back = [s for s in lost if s not in self.compute.lost]
        if lost and len(back) == len(lost):
            return self.move(live, f"rejoin {', '.join(sorted(back))}", same=True)
        return True

    def links_changed(self, went_down: set[Link], came_up: set[Link], live: list[LiveTask]) -> None:
        """React to links the controller reports cut or restored: every running task in `live` whose
        paths cross a cut link fails (policy ``never``) or moves; a task that ended leaves `live`."""
        self.down = (self.down | went_down) - came_up
        for link in sorted(went_down):
            LOG.warning("link %s down", link_name(link))
        for link in sorted(came_up):
            LOG.info("link %s up again", link_name(link))
        for lv in list(live):
            hit = crosses(lv.schedule, went_down)
            if not hit:
                continue
            what = ", ".join(link_name(link) for link in hit)
            if self.labels.get(lv.scheduler, ("", "on_failure"))[1] == "never":
                self._end(lv, "failed", f"link {what} on its paths went down (reschedule: never)")
                live.remove(lv)
            elif not self.move(lv, f"link {what} down"):
                live.remove(lv)

    def periodic(self, live: list[LiveTask], threshold: float) -> None:
        """Policy ``periodic``: move each running task of a ``periodic`` label whose new schedule (on
        the network as it is now, without the task's own reservation) predicts a round latency lower
        by more than `threshold` (a fraction); a task that ended leaves `live`."""
        for lv in list(live):
            if self.labels.get(lv.scheduler, ("", ""))[1] != "periodic" or lv.execution is None:
                continue
            lv.state.set_background(self._background(lv.state))
            old = lv.state.release(lv.task.id)
            try:
                new = self._schedule(lv.scheduler, lv.task, lv.state)
            finally:
                lv.state.admit(old)
            if new.blocked:
                continue
            was = lv.figures.lower_bound.lower_s
            now = self._figures(new, lv.task.model_bytes).lower_bound.lower_s
            if was > 0 and (was - now) / was > threshold and not self.move(lv, f"periodic: predicted round "
                                                                            f"{was:.3f} s -> {now:.3f} s", new=new):
                live.remove(lv)

    def move(self, live: LiveTask, reason: str, *, same: bool = False, new: Schedule | None = None) -> bool:
        """Move a running task (see the module docstring): onto `new`, onto its own schedule (`same`),
        or onto a fresh schedule of its scheduler. False if the task ended instead (blocked, failed
        to restart, or moved too often), recorded as failed with the reason."""
        assert live.execution is not None and live.log_dir is not None
        task, label = live.task, live.scheduler
        old_exec = live.execution
        at = self.clock.now()
        old_exec.stop()  # G's last round and checkpoint are final once its role has ended
        events = old_exec.events()
        self._record_progress(live, period_s=0.0, events=events)
        done = old_exec.rounds_completed(events)
        g_events = events.get(live.schedule.global_site, [])
        ends = [float(e["t"]) for e in g_events if e.get("event") == "round_complete" and e.get("round") == done]
        if ends:
            live.last_round_end_t = ends[0]
        if live.first_broadcast_t is None:
            starts = [float(e["t"]) for e in g_events if e.get("event") == "round_start"]
            live.first_broadcast_t = min(starts, default=None)
        if done >= old_exec.first_round and old_exec.checkpoint_file.exists():
            live.checkpoint = old_exec.checkpoint_file
        if done >= task.rounds:
            self._end(live, "done", "")
            return False
        live.moves += 1
        if live.moves > MAX_MOVES:
            self._end(live, "failed", f"moved more than {MAX_MOVES} times; last: {reason}")
            return False
        old = live.schedule
        live.state.release(task.id)
        self.counters.pending[(label, task.id, live.install_id)] = (time.monotonic(), None)  # old flows
        if new is None:
            new = old if same else self._schedule(label, task, live.state)
        old_bound = live.figures.lower_bound.lower_s
        self.db.record_move(self.run_id, label, task.id, live.moves, at_s=at, reason=reason,
                            old_schedule_json=json.dumps(old.to_dict()), resumed_round=done + 1,
                            last_round_end_s=None if live.last_round_end_t is None else
                            self.clock.of(live.last_round_end_t),
                            old_bound_s=old_bound, old_reserved_mbps=old.reserved_mbps_total)
        if new.blocked:
            live.execution = None
            self._end(live, "failed", f"{reason}; no new schedule: {new.reason}")
            return False
        live.state.admit(new)
        figures = self._figures(new, task.model_bytes)
        self.db.record_schedule(self.run_id, new, figures.lower_bound.lower_s, scheduler=label)
        self.db.record_move(self.run_id, label, task.id, live.moves, new_schedule_json=json.dumps(new.to_dict()),
                            new_bound_s=figures.lower_bound.lower_s, new_reserved_mbps=new.reserved_mbps_total)
        live.install_id = next(self._install_ids)
        live.schedule, live.figures, live.pending_move, live.last_move_s = new, figures, live.moves, at
        live.lost_seen = set()
        wire = replace(new, task_id=live.install_id)
        try:
            self._launch(live, wire, live.log_dir / f"move-{live.moves}", first_round=done + 1,
                         init_model=live.checkpoint)
        except Exception as e:  # noqa: BLE001 -- whatever went wrong, the task is recorded as failed
            self._end(live, "failed", f"{reason}; restart: {type(e).__name__}: {e}")
            return False
        LOG.info("task %d %s moved (%s): resumes at round %d; predicted round %.3f s -> %.3f s", task.id, label,
                 reason, done + 1, old_bound, figures.lower_bound.lower_s)
        return True

    def _record_resumption(self, live: LiveTask, events: dict[str, list[dict[str, Any]]]) -> None:
        """Once a moved task's G starts its first round, record the move's interruption."""
        assert live.execution is not None and live.pending_move is not None
        first = live.execution.first_round
        starts = [float(e["t"]) for e in events.get(live.schedule.global_site, [])
                  if e.get("event") == "round_start" and e.get("round") == first]
        if not starts:
            return
        start_s = self.clock.of(starts[0])
        end_s = None if live.last_round_end_t is None else self.clock.of(live.last_round_end_t)
        self.db.record_move(self.run_id, live.scheduler, live.task.id, live.pending_move, next_round_start_s=start_s,
                            interruption_s=None if end_s is None else start_s - end_s)
        live.pending_move = None

    def _end(self, live: LiveTask, outcome: str, reason: str) -> None:
        """Record how `live` ended and release what it holds, whatever goes wrong on the way."""
        sched, task = live.scheduler, live.task
        finished = self.clock.now()
        try:
            if live.execution is not None:
                live.execution.stop()
            if outcome == "done":
                try:
                    finished = self._record_result(live) or finished
                except Exception as e:  # noqa: BLE001 -- G's events lack a round, or are unreadable
                    outcome, reason = "failed", f"{type(e).__name__}: {e}"
        finally:
            if outcome == "failed":
                LOG.warning("task %d %s failed: %s", task.id, sched, reason)
            self.db.set_task_times(self.run_id, sched, task.id, finished_s=finished)
            self.db.set_task_state(self.run_id, sched, task.id, outcome, reason, at_s=finished)
            self.outcomes[outcome] += 1
            if self.release_on_end:
                with contextlib.suppress(KeyError):
                    live.state.release(task.id)
            self.counters.pending[(sched, task.id, live.install_id)] = (time.monotonic(), None)

    def _record_progress(self, live: LiveTask, period_s: float = 1.0,
                         events: dict[str, list[dict[str, Any]]] | None = None) -> None:
        """While `live` runs, record the rounds G has completed (and what each node did in them) at
        most every `period_s`, so that a live view sees rounds as they end; the task's end rewrites
        them with the same figures."""
        now = time.monotonic()
        if (now - live.progress_read_t < period_s and events is None) or live.execution is None:
            return
        live.progress_read_t = now
        if events is None:
            events = live.execution.events()
        if live.pending_move is not None:
            self._record_resumption(live, events)
        rounds = [r for r in rounds_so_far(live.schedule, events, first=live.execution.first_round)
                  if r.round > live.rounds_recorded]
        if not rounds:
            return
        record_rounds(self.db, self.run_id, live.scheduler, live.schedule, live.figures, rounds, events,
                      self.clock.of)
        live.rounds_recorded = rounds[-1].round

    def _record_result(self, live: LiveTask) -> float | None:
        """Record the rounds and figures of a task that completed; G's end on the run's clock."""
        assert live.execution is not None
        events = live.execution.events()
        result = live.execution.result(events)
        if live.pending_move is not None:
            self._record_resumption(live, events)
        sched, task, figures = live.scheduler, live.task, live.figures
        first_t = live.first_broadcast_t or result.first_broadcast_t
        first = self.clock.of(first_t) if first_t else None
        self.db.set_task_times(self.run_id, sched, task.id, first_broadcast_s=first,
                               start_overhead_s=None if first is None else first - live.admitted_s)
        self.db.set_task_setup(
            self.run_id, sched, task.id, agents_ready_s=result.agents_ready_s, connect_s=result.connect_s,
            chunk_bytes=result.chunk_bytes, connections_lost=result.connections_lost,
            reservation_enforced=live.reservation_enforced,
            store_and_forward_s=figures.store_and_forward.broadcast_s + figures.store_and_forward.upload_s,
            broadcast_bytes=sum(r.broadcast_bytes for r in result.rounds),
            upload_bytes=sum(r.upload_bytes for r in result.rounds))
        record_rounds(self.db, self.run_id, sched, live.schedule, figures, result.rounds, events, self.clock.of)
        last = result.rounds[-1] if result.rounds else None
        LOG.info("task %d %s: %d rounds, last latency %.3f s, accuracy %s, start overhead %s s", task.id, sched,
                 len(result.rounds), last.latency_s if last else float("nan"),
                 f"{last.accuracy:.3f}" if last else "-", "-" if first is None else f"{first - live.admitted_s:.2f}")
        return self.clock.of(result.finished_t) if result.finished_t else None

    # -- carried bytes, then the flows' removal ----------------------------------------------------------
    def settle_counters(self, *, wait: bool = False) -> None:
        """Record the carried bytes of ended tasks whose counters agree over two reads `settle_s` apart,
        then remove their flows. `wait`: block until every pending task is done (at most ~10 s each)."""
        deadline = time.monotonic() + 10.0 * max(1, len(self.counters.pending))
        while self.counters.pending:
            now = time.monotonic()
            for key, (t_last, last) in list(self.counters.pending.items()):
                if now - t_last < self.counters.settle_s:
                    continue
                sched, task_id, install_id = key
                try:
                    got = int(self.emu.client.task_bytes(install_id))
                except Exception:  # noqa: BLE001 -- the task's flows were never installed
                    got = last if last is not None else -1
                if got == last or got < 0 or (wait and now > deadline):
                    if got >= 0:
                        self.db.add_carried_bytes(self.run_id, sched, task_id, got)
                    with contextlib.suppress(Exception):
                        self.emu.client.remove_task(install_id)
                    del self.counters.pending[key]
                else:
                    self.counters.pending[key] = (now, got)
            if not wait:
                return
            time.sleep(0.1)  # between counter reads; bounded by the deadline
