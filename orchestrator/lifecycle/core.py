"""The task lifecycle core: every task of every engine goes through this one state machine.

A task goes ``pending`` (arrived) -> ``scheduled`` (admitted: placed on the live state, its flows
and reservation installed) -> ``running`` (its roles started) -> ``done`` or ``failed``; or
``pending`` -> ``blocked`` (no feasible placement); `orchestrator.lifecycle.states` holds the
transitions. Each state change is recorded with the time on the run's clock: arrival, admitted,
first broadcast (G starting round 1), finished; ``start_overhead_s`` is admitted -> first
broadcast.

What the scheduler sees when a task arrives (`NetworkState`): the reservations of the tasks
holding links (running tasks in the online mode; in the sequential mode, the point's earlier
tasks, as in the paper's static evaluation) and the background load the network port measures.

A task that ends (done or failed) has its roles stopped and, after its flow counters have settled
(the network port's ``counter_settle_s``), its carried bytes recorded and its flows removed; with
``release_on_end`` (the online mode) it releases its reservation at once.

The drivers (the sequential and online experiment, ``netai task run``, ``--attach`` and the
simulation engine) only decide *when* tasks arrive and how long to wait between checks; the
policy (admission, faults and moves: `orchestrator.lifecycle.policy`) lives here, the engines
behind the ports (`orchestrator.lifecycle.ports`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator import interrupts
from orchestrator.errors import ConfigError
from orchestrator.lifecycle import states as st
from orchestrator.lifecycle.dilation import undilate_overruns, undilate_round, undilate_setup
from orchestrator.lifecycle.fidelity import copy_rows, hop_rows, link_rate_rows, overrun_rows, training_rows
from orchestrator.lifecycle.live import CounterReads, LiveTask
from orchestrator.lifecycle.policy import follow_lost_roles
from orchestrator.lifecycle.ports import Clock, ComputePort, Events, Link, NetworkPort, Recorder, link_name
from orchestrator.lifecycle.recorder import round_bound, round_policy, round_reference_s
from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.cost import RoundFigures, round_figures
from orchestrator.scheduling.tasks import Task
from topologies.model import NetworkModel

LOG = logging.getLogger("netai.tasks")


class RunClock:
    """Seconds since the run's clock started (CLOCK_MONOTONIC, which the roles' events use too), in
    emulated time: wall seconds divided by the emulation's time dilation."""

    def __init__(self, t0: float | None = None, *, dilation: float = 1.0) -> None:
        self.t0 = time.monotonic() if t0 is None else t0
        self.dilation = dilation

    def now(self) -> float:
        return (time.monotonic() - self.t0) / self.dilation

    def of(self, monotonic_t: float) -> float:
        return (monotonic_t - self.t0) / self.dilation


class Lifecycle:
    """Admits, follows and ends tasks for one run (see the module docstring).

    Parameters
    ----------
    network, compute, recorder, clock
        The ports (`orchestrator.lifecycle.ports`).
    model
        The network model tasks are scheduled on (the bounds' topology).
    schedulers
        Scheduler name -> an object with ``schedule(state, task) -> Schedule``.
    release_on_end
        Release a task's reservation in its `NetworkState` when it ends (the online mode); the
        sequential mode keeps the point's earlier tasks' reservations, as the paper's evaluation does.
    whole_updates
        Updates travel uncompressed (the bounds count whole models).
    faults
        G checkpoints after every round and lost roles are tolerated (the run has events or moves).
    progress_period_s
        Rounds are recorded while a task runs at most this often.
    on_rounds
        Called with the task and its newly completed rounds whenever they are recorded.
    dilation
        The emulation's time dilation K: what the roles measure is divided by it before anything is
        computed from it or recorded (`orchestrator.lifecycle.dilation`); the clock reads emulated time.
    """

    def __init__(self, *, network: NetworkPort, compute: ComputePort, recorder: Recorder, clock: Clock,
                 model: NetworkModel, schedulers: Callable[[str], Any], release_on_end: bool = False,
                 whole_updates: bool = True, faults: bool = False, progress_period_s: float = 1.0,
                 on_rounds: Callable[[LiveTask, list[Any]], None] | None = None, dilation: float = 1.0) -> None:
        self.dilation = dilation
        self.network = network
        self.compute = compute
        self.recorder = recorder
        self.clock = clock
        self.model = model
        self.schedulers = schedulers
        self.release_on_end = release_on_end
        self.whole_updates = whole_updates
        self.faults = faults
        self.progress_period_s = progress_period_s
        self.on_rounds = on_rounds
        #: Called with a running task and its events whenever they are read (progress bars).
        self.on_events: Callable[[LiveTask, Events], None] | None = None
        self.counters = CounterReads()
        #: Tasks that ended, by outcome (done, failed, blocked).
        self.outcomes: dict[str, int] = {st.DONE: 0, st.FAILED: 0, st.BLOCKED: 0}
        #: Links cut now (sorted site pairs), as the controller reports them (`policy.links_changed`).
        self.down: set[Link] = set()
        #: Label -> (scheduler name, rescheduling policy): a trace may run a scheduler under each policy.
        self.labels: dict[str, tuple[str, str]] = {}
        #: (label, task id) -> its state, checked on every change (`states.check_transition`).
        self._states: dict[tuple[str, int], str] = {}

    # -- states ---------------------------------------------------------------------------------------
    def set_state(self, label: str, task_id: int, new: str, reason: str = "", *, at_s: float | None = None) -> float:
        """Move the task to `new` (checked against the state machine) and record it; the time."""
        key = (label, task_id)
        st.check_transition(self._states.get(key), new)
        self._states[key] = new
        at = self.clock.now() if at_s is None else at_s
        if new != st.PENDING:
            self.recorder.state(label, task_id, new, reason, at_s=at)
        return at

    def state_of(self, label: str, task_id: int) -> str | None:
        """The task's state (None if it never arrived)."""
        return self._states.get((label, task_id))

    # -- arrival and admission ------------------------------------------------------------------------
    def arrive(self, label: str, task: Task, at_s: float | None = None) -> None:
        """Record `task`'s arrival (at `at_s` on the run's clock; default now)."""
        at = self.set_state(label, task.id, st.PENDING, at_s=at_s)
        self.recorder.task(label, task, arrival_s=at)

    def admit(self, label: str, task: Task, state: NetworkState, *, schedule: Schedule | None = None) -> LiveTask:
        """Schedule `task` on the live `state` (or take `schedule`, made on it), install it and start
        its roles. The returned task's ``status`` is ``running``, or ``blocked`` / ``failed`` (recorded)."""
        background = self.network.background(state, task.id)
        if background is not None:
            state.set_background(background)
        self.recorder.network_state(label, task.id, state)
        if schedule is None:
            schedule = self.schedule(label, task, state)
        schedule = self.within_memory(task, schedule)
        live = LiveTask(label=label, task=task, schedule=schedule, state=state, figures=None, install_id=0)
        if schedule.blocked:
            LOG.info("task %d (%d locals) blocked by %s: %s", task.id, len(task.local_sites), label, schedule.reason)
            live.status, live.reason = st.BLOCKED, schedule.reason
            self.recorder.hold(label, task.id)
            self.set_state(label, task.id, st.BLOCKED, schedule.reason)
            self.recorder.seal(label, task.id)  # its record whole: a blocked task ends here
            self.outcomes[st.BLOCKED] += 1
            return live
        state.admit(schedule)
        live.figures = self.figures(schedule, task.model_bytes)
        self.recorder.schedule(label, schedule, live.figures.lower_bound.lower_s)
        live.admitted_s = self.set_state(label, task.id, st.SCHEDULED)
        self.recorder.times(label, task.id, admitted_s=live.admitted_s)
        live.install_id = self.network.new_install_id()
        try:  # from here on, any failure ends the task as failed: roles, flows and reservation released
            name = f"{label.replace('/', '-')}-{task.id}"
            live.log_dir = self.compute.task_dir(name)
            self.launch(live, live.log_dir)
        except Exception as e:  # noqa: BLE001 -- whatever went wrong, the task is recorded as failed
            self.end(live, st.FAILED, f"start: {type(e).__name__}: {e}".splitlines()[0])
            return live
        live.status = st.RUNNING
        self.set_state(label, task.id, st.RUNNING)
        return live

    def within_memory(self, task: Task, schedule: Schedule) -> Schedule:
        """`schedule`, or a blocked one naming the site whose memory its roles would exceed
        (`orchestrator.scheduling.memory`)."""
        from orchestrator.scheduling.memory import refusal, roles_by_site

        if schedule.blocked:
            return schedule
        roles = roles_by_site(schedule.global_site, schedule.local_sites, schedule.overlay_nodes)
        memory = {site: s.memory_mb for site, s in self.model.sites.items()}
        why = refusal(memory, roles, task.model_bytes)
        return schedule if why is None else Schedule.blocked_for(task, schedule.scheduler, why)

    def figures(self, schedule: Schedule, model_bytes: int) -> RoundFigures:
        """The schedule's bounds and references on this network (`cost.round_figures`)."""
        return round_figures(self.model, schedule, model_bytes, rate=self.network.rate,
                             propagation=self.network.delay_emulated, whole_updates=self.whole_updates)

    def schedule(self, label: str, task: Task, state: NetworkState) -> Schedule:
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
        return self.schedulers(name).schedule(view, task)

    def launch(self, live: LiveTask, log_dir: Path, *, first_round: int = 1, init_model: Path | None = None) -> None:
        """Install `live`'s paths (its schedule under its install id) and start its roles, logging to
        `log_dir`, from round `first_round` (G from `init_model`). Raises on failure."""
        wire = replace(live.schedule, task_id=live.install_id)
        live.execution = self.compute.launch(wire, task=live.task, schedule=live.schedule, log_dir=log_dir,
                                             first_round=first_round, init_model=init_model)
        live.reservation_enforced = self.network.install(wire)
        live.execution.start()

    def run_one(self, label: str, task: Task, state: NetworkState, *, schedule: Schedule | None = None,
                poll_s: float = 0.05) -> LiveTask:
        """One task from arrival to its end, waiting for it (``netai task run``, ``--attach``).
        Whatever ends the wait (Ctrl-C included) ends the task as failed and removes its paths at once.

        Raises
        ------
        ConfigError
            The scheduler blocks the task (nothing was installed).
        RuntimeError
            The task failed (a role, a server, the controller, or its budget), with the reason.
        """
        self.arrive(label, task)
        return self.follow(self.admit(label, task, state, schedule=schedule), poll_s=poll_s)

    def follow(self, live: LiveTask, *, poll_s: float = 0.05) -> LiveTask:
        """Wait for an admitted task's end (see `run_one`, which raises the same)."""
        if live.status == st.BLOCKED:
            raise ConfigError(f"{live.label} cannot place task {live.task.id}: {live.reason}")
        try:
            while not live.ended and not self.check(live, self.compute.poll(live.schedule.overlay_nodes)):
                interrupts.check()
                time.sleep(poll_s)  # poll interval of the roles' states, bounded by the task's budget
        except BaseException as e:
            self.abort(live, f"{type(e).__name__}: {e}".splitlines()[0])
            self.settle_counters(at_once=True)
            raise
        done = live.status == st.DONE
        self.settle_counters(wait=done, at_once=not done)
        if not done:
            raise RuntimeError(live.reason)
        return live

    # -- following -----------------------------------------------------------------------------------------
    def check(self, live: LiveTask, statuses: Mapping[str, Mapping[str, Any]]) -> bool:
        """Whether `live` has ended (done or failed; recorded either way)."""
        assert live.execution is not None
        try:
            if not live.execution.check(statuses):
                self.record_progress(live)
                return not follow_lost_roles(self, live)
        except (RuntimeError, TimeoutError) as e:
            self.end(live, st.FAILED, str(e).splitlines()[0])
            return True
        self.end(live, st.DONE, "")
        return True

    def abort(self, live: LiveTask, reason: str) -> None:
        """End a running task as failed (the driver was interrupted or gave up on it)."""
        if not live.ended:
            self.end(live, st.FAILED, reason)

    def end(self, live: LiveTask, outcome: str, reason: str) -> None:
        """Record how `live` ended and release what it holds, whatever goes wrong on the way. The end's
        records are held back (`Recorder.hold`) and written in one transaction once its flows' carried
        bytes are in (`settle_counters`), or now if it installed none."""
        label, task = live.label, live.task
        finished = self.clock.now()
        self.recorder.hold(label, task.id)
        try:
            if live.execution is not None:
                live.execution.stop()
            if outcome == st.DONE:
                try:
                    finished = self.record_result(live) or finished
                except Exception as e:  # noqa: BLE001 -- G's events lack a round, or are unreadable
                    outcome, reason = st.FAILED, f"{type(e).__name__}: {e}"
        finally:
            if outcome == st.FAILED:
                LOG.warning("task %d %s failed: %s", task.id, label, reason)
            live.status, live.reason = outcome, reason
            self.recorder.times(label, task.id, finished_s=finished)
            self.set_state(label, task.id, outcome, reason, at_s=finished)
            self.outcomes[outcome] += 1
            if self.release_on_end:
                with contextlib.suppress(KeyError):
                    live.state.release(task.id)
            if live.install_id:
                self.counters.pending[(label, task.id, live.install_id)] = (time.monotonic(), None)
            self._seal_if_settled(label, task.id)

    def _seal_if_settled(self, label: str, task_id: int) -> None:
        """Seal the record of a task that ended once none of its installs' counters is pending."""
        if self._states.get((label, task_id)) in st.FINAL and \
                not any(key[:2] == (label, task_id) for key in self.counters.pending):
            self.recorder.seal(label, task_id)

    # -- records ---------------------------------------------------------------------------------------
    def record_rounds(self, live: LiveTask, rounds: list[Any], events: Events) -> None:
        """Record `rounds` of `live` with their bounds and references, and what every node did."""
        assert live.figures is not None and live.execution is not None
        fig, sched = live.figures, live.schedule
        if self.dilation != 1:
            rounds = [undilate_round(r, self.dilation) for r in rounds]
        self.recorder.rounds(live.label, sched, rounds, [round_bound(fig, sched, r) for r in rounds],
                             [round_reference_s(fig, r) for r in rounds], policy=round_policy(sched, events),
                             node_rows=live.execution.node_rows(events, self.clock.of))
        if self.on_rounds is not None:
            fresh = [r for r in rounds if r.round > live.rounds_recorded]
            if fresh:
                self.on_rounds(live, fresh)
        if rounds:
            live.rounds_recorded = max(live.rounds_recorded, rounds[-1].round)

    def record_progress(self, live: LiveTask, *, events: Events | None = None) -> None:
        """While `live` runs, record the rounds G has completed at most every ``progress_period_s``,
        so that a live view sees rounds as they end; the task's end rewrites them with the same figures."""
        now = time.monotonic()
        if live.execution is None or (events is None and now - live.progress_read_t < self.progress_period_s):
            return
        live.progress_read_t = now
        if events is None:
            events = live.execution.events()
        if self.on_events is not None:
            self.on_events(live, events)
        if live.pending_move is not None:
            self.record_resumption(live, events)
        rounds = [r for r in live.execution.rounds_so_far(events) if r.round > live.rounds_recorded]
        if rounds:
            self.record_rounds(live, rounds, events)

    def record_resumption(self, live: LiveTask, events: Events) -> None:
        """Once a moved task's G starts its first round, record the move's interruption."""
        assert live.execution is not None and live.pending_move is not None
        first = live.execution.first_round
        starts = [float(e["t"]) for e in events.get(live.schedule.global_site, [])
                  if e.get("event") == "round_start" and e.get("round") == first]
        if not starts:
            return
        start_s = self.clock.of(starts[0])
        end_s = None if live.last_round_end_t is None else self.clock.of(live.last_round_end_t)
        self.recorder.move(live.label, live.task.id, live.pending_move, next_round_start_s=start_s,
                           interruption_s=None if end_s is None else start_s - end_s)
        live.pending_move = None

    def record_result(self, live: LiveTask) -> float | None:
        """Record the rounds and figures of a task that completed; G's end on the run's clock."""
        assert live.execution is not None and live.figures is not None
        events = live.execution.events()
        result = live.result = live.execution.result(events)
        if live.pending_move is not None:
            self.record_resumption(live, events)
        label, task, figures = live.label, live.task, live.figures
        first_t = live.first_broadcast_t or result.first_broadcast_t
        first = self.clock.of(first_t) if first_t else None
        self.recorder.times(label, task.id, first_broadcast_s=first,
                            start_overhead_s=None if first is None else first - live.admitted_s)
        self.recorder.setup(label, task.id, **undilate_setup(dict(
            agents_ready_s=result.agents_ready_s, connect_s=result.connect_s,
            chunk_bytes=result.chunk_bytes, connections_lost=result.connections_lost,
            reservation_enforced=live.reservation_enforced,
            store_and_forward_s=figures.store_and_forward.broadcast_s + figures.store_and_forward.upload_s,
            broadcast_bytes=sum(r.broadcast_bytes for r in result.rounds),
            upload_bytes=sum(r.upload_bytes for r in result.rounds)), self.dilation))
        self.recorder.tcp_bytes(label, task.id, result.sent_bytes, result.retrans_bytes)
        self.record_rounds(live, list(result.rounds), events)
        node_rows = live.execution.node_rows(events, self.clock.of)
        rate, delay = self.network.rate, self.network.delay_emulated
        copies = copy_rows(events, self.clock.of)
        self.recorder.fidelity(
            label, task.id, overruns=undilate_overruns(overrun_rows(events), self.dilation),
            trainings=undilate_overruns(training_rows(events), self.dilation),
            hops=hop_rows(self.model, live.schedule, node_rows, chunk_bytes=result.chunk_bytes,
                          model_bytes=task.model_bytes, rate=rate, propagation=delay, copies=copies,
                          payload_share=self.network.payload_share, burst_bytes=self.network.link_burst_bytes),
            link_rates=link_rate_rows(self.model, live.schedule, node_rows, model_bytes=task.model_bytes, rate=rate,
                                      propagation=delay, copies=copies, burst_bytes=self.network.link_burst_bytes))
        # the round as recorded: emulated seconds (the roles measured wall seconds, K times as many)
        last = undilate_round(result.rounds[-1], self.dilation) if result.rounds else None
        LOG.info("task %d %s: %d rounds, last latency %.3f s%s, accuracy %s, start overhead %s s", task.id, label,
                 len(result.rounds), last.latency_s if last else float("nan"),
                 "" if self.dilation == 1 else f" emulated (K={self.dilation:g})",
                 f"{last.accuracy:.3f}" if last else "-", "-" if first is None else f"{first - live.admitted_s:.2f}")
        return self.clock.of(result.finished_t) if result.finished_t else None

    # -- carried bytes, then the flows' removal ----------------------------------------------------------
    def settle_counters(self, *, wait: bool = False, at_once: bool = False) -> None:
        """Record the carried bytes of ended tasks whose counters agree over two reads the network's
        ``counter_settle_s`` apart (the first as soon as the task is pending), then remove their flows.
        `wait`: block until every pending task is done (at most ~10 s each); `at_once`: one read
        each, then remove (after a failure or Ctrl-C)."""
        settle = 0.0 if at_once else self.network.counter_settle_s
        deadline = time.monotonic() + 10.0 * max(1, len(self.counters.pending))
        while self.counters.pending:
            now = time.monotonic()
            for key, (t_last, last) in list(self.counters.pending.items()):
                if now - t_last < settle and not at_once and last is not None:
                    continue  # the first read is at once: the second, `settle` later, may make it final
                label, task_id, install_id = key
                try:
                    got = int(self.network.task_bytes(install_id))
                except Exception:  # noqa: BLE001 -- the task's flows were never installed
                    got = last if last is not None else -1
                if got == last or got < 0 or at_once or settle == 0.0 or (wait and now > deadline):
                    if got >= 0:
                        self.recorder.carried_bytes(label, task_id, got)
                    with contextlib.suppress(Exception):
                        self.network.remove(install_id)
                    del self.counters.pending[key]
                    self._seal_if_settled(label, task_id)
                else:
                    self.counters.pending[key] = (now, got)
            if not wait and not at_once:
                return
            if self.counters.pending:
                time.sleep(0.1)  # between counter reads; bounded by the deadline
