"""The core's policy for faults and moves (docs/faults.md, "Faults and rescheduling").

While links are cut, schedulers see the network without them. A running task whose paths cross a
link that went down fails (policy ``never``) or is *moved* (``on_failure``, ``periodic``): its roles
stop, it is scheduled again, its new paths installed under a new install id, and new roles resume
from the round after the last one G completed, G starting from its checkpoint of that round (the
round in flight is retried). ``periodic`` also moves a task whose predicted round latency a new
schedule would cut by more than the threshold. A role other than G that is lost (its server
killed) leaves the task running without it; when its server is back the task is moved onto the
same schedule so the site rejoins. Every move is recorded (``moves``): when, why, both schedules,
the round resumed, the interruption (last good round end to the next round start) and the
predicted saving.

These are functions of the core (`orchestrator.lifecycle.core.Lifecycle`), not of any port. They
take the core as a `Core`: what they use of it, stated here, so that this module does not import
the core's (the core imports this one).
"""

from __future__ import annotations

import copy
import json
import logging
import time
from pathlib import Path
from typing import Any, Protocol

from orchestrator.lifecycle import states as st
from orchestrator.lifecycle.live import CounterReads, LiveTask
from orchestrator.lifecycle.ports import Clock, ComputePort, Events, Link, NetworkPort, Recorder, link_name
from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.cost import RoundFigures
from orchestrator.scheduling.tasks import Task

LOG = logging.getLogger("netai.tasks")
#: A task moved more often than this fails (a role that fails again at every restart must not loop).
MAX_MOVES = 8

__all__ = ["Core", "Link", "crosses", "follow_lost_roles", "link_name", "links_changed", "move", "periodic"]


class Core(Protocol):
    """What the policy uses of the lifecycle core (`orchestrator.lifecycle.core.Lifecycle`)."""

    network: NetworkPort
    compute: ComputePort
    recorder: Recorder
    clock: Clock
    counters: CounterReads
    #: Links cut now; label -> (scheduler name, rescheduling policy).
    down: set[Link]
    labels: dict[str, tuple[str, str]]

    def set_state(self, label: str, task_id: int, new: str, reason: str = "", *,
                  at_s: float | None = None) -> float: ...

    def end(self, live: LiveTask, outcome: str, reason: str) -> None: ...

    def record_progress(self, live: LiveTask, *, events: Events | None = None) -> None: ...

    def schedule(self, label: str, task: Task, state: NetworkState) -> Schedule: ...

    def figures(self, schedule: Schedule, model_bytes: int) -> RoundFigures: ...

    def launch(self, live: LiveTask, log_dir: Path, *, first_round: int = 1,
               init_model: Path | None = None) -> None: ...


def crosses(schedule: Any, links: set[Link]) -> list[Link]:
    """The links of `links` (sorted site pairs) that any path of `schedule` uses, in either direction."""
    used = {tuple(sorted(hop)) for e in schedule.edges for hop in e.links()}
    return sorted(link for link in links if link in used)


def follow_lost_roles(core: Core, live: LiveTask) -> bool:
    """Record roles newly lost; once every lost role's server is back, move the task onto the same
    schedule so those sites rejoin. False if the task ended."""
    assert live.execution is not None
    lost = live.execution.lost_roles
    for site in sorted(set(lost) - live.lost_seen):
        live.lost_seen.add(site)
        LOG.warning("task %d %s: role at %s lost (%s); the rounds go on without it", live.task.id,
                    live.label, site, lost[site])
        core.set_state(live.label, live.task.id, st.RUNNING, f"role at {site} lost: {lost[site]}")
    back = [s for s in lost if s not in core.compute.lost]
    if lost and len(back) == len(lost):
        return move(core, live, f"rejoin {', '.join(sorted(back))}", same=True)
    return True


def links_changed(core: Core, went_down: set[Link], came_up: set[Link], live: list[LiveTask]) -> None:
    """React to links the controller reports cut or restored: every running task in `live` whose
    paths cross a cut link fails (policy ``never``) or moves; a task that ended leaves `live`."""
    core.down = (core.down | went_down) - came_up
    for link in sorted(went_down):
        LOG.warning("link %s down", link_name(link))
    for link in sorted(came_up):
        LOG.info("link %s up again", link_name(link))
    for lv in list(live):
        hit = crosses(lv.schedule, went_down)
        if not hit:
            continue
        what = ", ".join(link_name(link) for link in hit)
        if core.labels.get(lv.label, ("", "on_failure"))[1] == "never":
            core.end(lv, st.FAILED, f"link {what} on its paths went down (reschedule: never)")
            live.remove(lv)
        elif not move(core, lv, f"link {what} down"):
            live.remove(lv)


def periodic(core: Core, live: list[LiveTask], threshold: float) -> None:
    """Policy ``periodic``: move each running task of a ``periodic`` label whose new schedule (on
    the network as it is now, without the task's own reservation) predicts a round latency lower
    by more than `threshold` (a fraction); a task that ended leaves `live`."""
    for lv in list(live):
        if core.labels.get(lv.label, ("", ""))[1] != "periodic" or lv.execution is None or lv.figures is None:
            continue
        background = core.network.background(lv.state)
        if background is not None:
            lv.state.set_background(background)
        # On a copy: the task's own reservation, released and admitted again, need not fit a
        # background measured since (a saturated link's port counters read a little over capacity).
        view = copy.deepcopy(lv.state, {id(lv.state.model): lv.state.model})
        view.release(lv.task.id)
        new = core.schedule(lv.label, lv.task, view)
        if new.blocked:
            continue
        was = lv.figures.lower_bound.lower_s
        now = core.figures(new, lv.task.model_bytes).lower_bound.lower_s
        if was > 0 and (was - now) / was > threshold and not move(core, lv, f"periodic: predicted round "
                                                                   f"{was:.3f} s -> {now:.3f} s", new=new):
            live.remove(lv)


def _stop_for_move(core: Core, live: LiveTask) -> int:
    """Stop `live`'s roles, record what they completed; the last round G completed."""
    assert live.execution is not None
    old_exec = live.execution
    old_exec.stop()  # G's last round and checkpoint are final once its role has ended
    events = old_exec.events()
    core.record_progress(live, events=events)
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
    return done


def move(core: Core, live: LiveTask, reason: str, *, same: bool = False, new: Schedule | None = None) -> bool:
    """Move a running task (see the module docstring): onto `new`, onto its own schedule (`same`),
    or onto a fresh schedule of its scheduler. False if the task ended instead (blocked, failed
    to restart, or moved too often), recorded as failed with the reason."""
    assert live.execution is not None and live.log_dir is not None and live.figures is not None
    task, label = live.task, live.label
    at = core.clock.now()
    done = _stop_for_move(core, live)
    if done >= task.rounds:
        core.end(live, st.DONE, "")
        return False
    live.moves += 1
    if live.moves > MAX_MOVES:
        core.end(live, st.FAILED, f"moved more than {MAX_MOVES} times; last: {reason}")
        return False
    old = live.schedule
    if not same:  # the same schedule keeps its reservation (it need not fit the background again)
        live.state.release(task.id)
    core.counters.pending[(label, task.id, live.install_id)] = (time.monotonic(), None)  # old flows
    if new is None:
        new = old if same else core.schedule(label, task, live.state)
    old_bound = live.figures.lower_bound.lower_s
    core.recorder.move(label, task.id, live.moves, at_s=at, reason=reason,
                       old_schedule_json=json.dumps(old.to_dict()), resumed_round=done + 1,
                       last_round_end_s=None if live.last_round_end_t is None else
                       core.clock.of(live.last_round_end_t),
                       old_bound_s=old_bound, old_reserved_mbps=old.reserved_mbps_total)
    if new.blocked:
        live.execution = None
        core.end(live, st.FAILED, f"{reason}; no new schedule: {new.reason}")
        return False
    if not same:
        live.state.admit(new)
    figures = core.figures(new, task.model_bytes)
    core.recorder.schedule(label, new, figures.lower_bound.lower_s)
    core.recorder.move(label, task.id, live.moves, new_schedule_json=json.dumps(new.to_dict()),
                       new_bound_s=figures.lower_bound.lower_s, new_reserved_mbps=new.reserved_mbps_total)
    live.install_id = core.network.new_install_id()
    live.schedule, live.figures, live.pending_move, live.last_move_s = new, figures, live.moves, at
    live.lost_seen = set()
    try:
        core.launch(live, live.log_dir / f"move-{live.moves}", first_round=done + 1, init_model=live.checkpoint)
    except Exception as e:  # noqa: BLE001 -- whatever went wrong, the task is recorded as failed
        core.end(live, st.FAILED, f"{reason}; restart: {type(e).__name__}: {e}")
        return False
    LOG.info("task %d %s moved (%s): resumes at round %d; predicted round %.3f s -> %.3f s", task.id, label,
             reason, done + 1, old_bound, figures.lower_bound.lower_s)
    return True
