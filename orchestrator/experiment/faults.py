"""Dynamics and faults of a run: scheduled events, what the orchestrator learns of them, and the
rescheduling policy (docs/faults.md, "Faults and rescheduling").

- `FaultEvent` / `parse_events`: the config's ``events:`` list, validated before anything starts.
  Each fires at a time (``at_s``, counted from the start of the first task of each scheduler's trace,
  online mode) or at a point of a task's progress (``at_round: {task: N, round: R}``: once task N has
  completed round R, read about once a second; the same point of the learning on any machine). Actions:
  ``link_down`` / ``link_up`` (``link: [A, B]``: both directions, as a fibre cut; or ``on_task: N``:
  the link that most of running task N's paths cross, one whose loss leaves the network
  connected, chosen when the event fires; its ``link_up`` restores that link), ``server_kill``
  (``site``; optional ``restart_after_s``), ``server_restart`` (``site``), ``controller_restart``,
  and ``background`` (``load``: a step of the background load to that fraction).
- `RescheduleConfig`: the ``reschedule:`` section. ``policies`` is a list of ``never``,
  ``on_failure`` and ``periodic``; with more than one, every scheduler runs the same trace (tasks
  and events) once per policy, labelled ``<scheduler>/<policy>``, so the report compares them.
- `FaultInjector`: applies due events to the emulation, the site servers and the background, and
  records each in the run database (``faults`` table) with its outcome.
- `LinkWatcher`: what reaches the orchestrator from the controller: the links whose ports are down
  (port-status messages), polled; the task manager reacts to what it reports, not to the injector,
  so a cut made by hand (``netai net link``) is handled the same way.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.lifecycle.policy import Link, link_name, links_changed
from orchestrator.results.schema import NOT_APPLIED
from topologies.model import NetworkModel

LOG = logging.getLogger("netai.faults")

ACTIONS = ("link_down", "link_up", "server_kill", "server_restart", "controller_restart", "background")
POLICIES = ("never", "on_failure", "periodic")
_KEYS = {
    "link_down": set(), "link_up": set(), "server_kill": {"site"}, "server_restart": {"site"},
    "controller_restart": set(), "background": {"load"},
}
_OPTIONAL = {"server_kill": {"restart_after_s"}}



@dataclass(frozen=True)
class FaultEvent:
    """One scheduled event (see the module docstring): at `at_s`, or after round `at_round[1]` of
    task `at_round[0]`."""

    action: str
    at_s: float | None = None
    at_round: tuple[int, int] | None = None
    link: Link | None = None
    #: ``link_down`` / ``link_up`` by task: the link under running task `on_task` (see the module docstring).
    on_task: int | None = None
    site: str | None = None
    restart_after_s: float | None = None
    load: float | None = None

    @property
    def target(self) -> str:
        if self.link is not None:
            return link_name(self.link)
        if self.on_task is not None:
            return f"under task {self.on_task}"
        if self.site is not None:
            return self.site
        return "" if self.load is None else f"load {self.load:g}"

    def __post_init__(self) -> None:
        if (self.at_s is None) == (self.at_round is None):
            raise ValueError(f"a {self.action} event needs exactly one of at_s and at_round")

    @property
    def when(self) -> str:
        """``at 4.0 s`` or ``after round 50 of task 1``."""
        if self.at_round is not None:
            return f"after round {self.at_round[1]} of task {self.at_round[0]}"
        return f"at {self.at_s:.1f} s"

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"action": self.action}
        if self.at_round is not None:
            d["at_round"] = {"task": self.at_round[0], "round": self.at_round[1]}
        else:
            d["at_s"] = self.at_s
        if self.link is not None:
            d["link"] = list(self.link)
        for k in ("on_task", "site", "restart_after_s", "load"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d


@dataclass(frozen=True)
class RescheduleConfig:
    """The ``reschedule:`` section: which policies run, and the periodic policy's knobs."""

    policies: tuple[str, ...] = ("on_failure",)
    #: ``periodic``: seconds between looks at every running task.
    period_s: float = 10.0
    #: ``periodic``: move a task only if its predicted round latency falls by more than this fraction.
    threshold: float = 0.1

    def to_dict(self) -> dict[str, Any]:
        return {"policies": list(self.policies), "period_s": self.period_s, "threshold": self.threshold}


def _number(where: str, v: Any, lo: float, hi: float = math.inf) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not lo <= v <= hi:
        raise ConfigError(f"{where} must be a number in [{lo:g}, {hi:g}], got {v!r}")
    return float(v)


def _order(ev: FaultEvent) -> tuple[int, float, int, int]:
    """Timed events first, by time; then those at a round, by task and round."""
    if ev.at_round is not None:
        return (1, 0.0, *ev.at_round)
    return (0, float(ev.at_s or 0.0), 0, 0)


def _at_round(where: str, v: Any, tasks: int | None, rounds: int | None) -> tuple[int, int]:
    """``at_round: {task: N, round: R}``, checked against the trace's `tasks` and each task's `rounds`."""
    if not isinstance(v, Mapping) or set(v) != {"task", "round"} or any(
            isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in v.values()):
        raise ConfigError(f"{where}.at_round must be a mapping {{task: N, round: R}} of positive integers, got {v!r}")
    task, rnd = int(v["task"]), int(v["round"])
    if tasks is not None and task > tasks:
        raise ConfigError(f"{where}.at_round: task {task} is not in the trace (online.tasks is {tasks})")
    if rounds is not None and rnd >= rounds:
        raise ConfigError(f"{where}.at_round: round {rnd} is not before the task's last round ({rounds}): "
                          f"the task would have ended")
    return task, rnd


def parse_events(raw: Any, model: NetworkModel, *, tasks: int | None = None,
                 rounds: int | None = None) -> tuple[FaultEvent, ...]:
    """The ``events:`` list: timed events in time order, then those at a round (by task and round).

    `tasks` and `rounds` (the trace's number of tasks and each task's rounds), when given, bound
    ``at_round``.

    Raises
    ------
    ConfigError
        One line naming the event (by index) and what is wrong: an unknown action or key, neither or
        both of ``at_s`` and ``at_round``, a time that is not a non-negative number, a round that is
        not before the task's last, a link that is not in the topology, a site without a server, a
        load outside [0, 1].
    """
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"events must be a list of events, got {raw!r}")
    out = []
    for i, ev in enumerate(raw):
        where = f"events[{i}]"
        action, need = _event_keys(where, ev)
        kw: dict[str, Any] = {"action": action}
        if "at_s" in ev:
            kw["at_s"] = _number(f"{where}.at_s", ev["at_s"], 0.0)
        else:
            kw["at_round"] = _at_round(where, ev["at_round"], tasks, rounds)
        out.append(FaultEvent(**kw | _event_targets(where, ev, need, model)))
    return tuple(sorted(out, key=_order))


def _event_keys(where: str, ev: Any) -> tuple[str, set[str]]:
    """(action, the keys it needs) of event `ev` after checking its keys: a known action, one
    trigger (``at_s`` or ``at_round``), every needed key and no unknown one (`parse_events`)."""
    if not isinstance(ev, Mapping):
        raise ConfigError(f"{where} must be a mapping with at_s (or at_round) and action, got {ev!r}")
    action = ev.get("action")
    if action not in ACTIONS:
        raise ConfigError(f"{where}.action must be one of {', '.join(ACTIONS)}, got {action!r}")
    need, optional = _KEYS[action], _OPTIONAL.get(action, set())
    if action in ("link_down", "link_up"):
        if ("link" in ev) == ("on_task" in ev):
            raise ConfigError(f"{where}: {action} needs either link: [A, B] or on_task: N")
        need = {"link"} if "link" in ev else {"on_task"}
    unknown = sorted(set(ev) - need - optional - {"at_s", "at_round", "action"})
    if unknown:
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} for {action}; allowed: "
                          f"{', '.join(['at_s or at_round', 'action', *sorted(need | optional)])}")
    missing = sorted(need - set(ev))
    if ("at_s" in ev) == ("at_round" in ev) or missing:
        raise ConfigError(f"{where}: {action} needs {', '.join(['at_s or at_round (one of them)', *sorted(need)])}")
    return action, need


def _event_targets(where: str, ev: Mapping[str, Any], need: set[str], model: NetworkModel) -> dict[str, Any]:
    """What event `ev` acts on and how (`FaultEvent`'s fields other than its action and trigger),
    checked against the topology: a link of it, a task id, a compute site, a load in [0, 1]."""
    kw: dict[str, Any] = {}
    if "link" in need:
        link = ev["link"]
        if not (isinstance(link, list) and len(link) == 2 and all(isinstance(s, str) for s in link)):
            raise ConfigError(f"{where}.link must be a list of two site names, got {link!r}")
        if not model.has_link(link[0], link[1]):
            raise ConfigError(f"{where}.link: {link[0]!r}-{link[1]!r} is not a link of {model.name}")
        kw["link"] = (link[0], link[1])
    if "on_task" in need:
        kw["on_task"] = int(_number(f"{where}.on_task", ev["on_task"], 1))
        if ev["on_task"] != kw["on_task"]:
            raise ConfigError(f"{where}.on_task must be a task id (an integer), got {ev['on_task']!r}")
    if "site" in need:
        site = ev["site"]
        if not isinstance(site, str) or site not in model.sites or not model.sites[site].has_compute:
            raise ConfigError(f"{where}.site must be a compute site of {model.name}, got {site!r}")
        kw["site"] = site
    if "restart_after_s" in ev:
        kw["restart_after_s"] = _number(f"{where}.restart_after_s", ev["restart_after_s"], 0.0)
    if "load" in need:
        kw["load"] = _number(f"{where}.load", ev["load"], 0.0, 1.0)
    return kw


def mixed_triggers(events: Sequence[FaultEvent]) -> list[str]:
    """Warnings, one per target (a link, a task's link, a site, the controller, the background
    load) whose events mix the two kinds of trigger: timed events and round events are not ordered
    with each other (a ``link_up`` at 20 s can come before the ``link_down`` after round 50), so a
    pair meant in order should use one kind. Empty when nothing mixes."""
    groups: dict[str, list[FaultEvent]] = {}
    for ev in events:
        key = {"background": "the background load", "controller_restart": "the controller"}.get(ev.action, ev.target)
        groups.setdefault(key, []).append(ev)
    out = []
    for key, evs in groups.items():
        timed = next((e for e in evs if e.at_round is None), None)
        at_round = next((e for e in evs if e.at_round is not None), None)
        if timed is not None and at_round is not None:
            out.append(f"the events on {key} mix triggers ({timed.action} {timed.when}, {at_round.action} "
                       f"{at_round.when}): timed and round events are not ordered with each other; give a pair "
                       "meant in order the same kind of trigger")
    return out


def parse_reschedule(raw: Any) -> RescheduleConfig:
    """The ``reschedule:`` section. Raises ConfigError naming the bad key."""
    if raw is None:
        return RescheduleConfig()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"reschedule must be a mapping, got {raw!r}")
    unknown = sorted(set(raw) - {"policies", "period_s", "threshold"})
    if unknown:
        raise ConfigError(f"unknown key reschedule.{unknown[0]}; allowed: policies, period_s, threshold")
    pol = raw.get("policies", ["on_failure"])
    if isinstance(pol, str):
        pol = [pol]
    if not isinstance(pol, list) or not pol or any(p not in POLICIES for p in pol) or len(set(pol)) != len(pol):
        raise ConfigError(f"reschedule.policies must be a list of distinct policies among {', '.join(POLICIES)}, "
                          f"got {pol!r}")
    return RescheduleConfig(
        policies=tuple(pol),
        period_s=_number("reschedule.period_s", raw.get("period_s", 10.0), 0.5),
        threshold=_number("reschedule.threshold", raw.get("threshold", 0.1), 0.0, 1.0),
    )


# -- applying events -------------------------------------------------------------------------------
@dataclass
class FaultInjector:
    """Applies `events` (times from `start`; rounds as `progress` reports them) to the run; `due` is
    called from the run's loop.

    Parameters
    ----------
    emu
        The emulation (``set_link``, ``restart_controller``).
    compute
        The site servers (``kill_server``, ``restart_server``).
    background_step
        Sets the background load to a fraction (restarting the iperf3 flows); None: refused.
    record
        Called with each applied event's row (``ResultsDB.record_fault``'s keywords).
    """

    events: Sequence[FaultEvent]
    emu: Any
    compute: Any
    clock: Callable[[], float]
    record: Callable[..., None]
    background_step: Callable[[float], None] | None = None
    #: Task id -> the link an ``on_task`` event cuts (None: no such running task).
    task_link: Callable[[int], Link | None] | None = None
    #: Task id -> the last round it completed (None: not running); for ``at_round`` events.
    progress: Callable[[int], int | None] | None = None
    t0: float | None = None
    #: Links ``on_task`` events cut, by task, for their ``link_up``.
    _cut_for: dict[int, Link] = field(default_factory=dict)
    _pending: list[FaultEvent] = field(default_factory=list)

    def start(self) -> None:
        """Start counting (the first task of the trace starts now)."""
        self.t0 = self.clock()
        self._pending = sorted(self.events, key=_order)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def finish(self) -> list[FaultEvent]:
        """The trace has ended: record every event not applied (not ok, with why); those events."""
        left, self._pending = self._pending, []
        for ev in left:
            self.record(at_s=self.clock(), action=ev.action, target=ev.target, ok=False,
                        detail=f"{NOT_APPLIED}: the trace ended before it was due ({ev.when})", took_s=None)
        return left

    def _is_due(self, ev: FaultEvent, elapsed: float) -> bool:
        if ev.at_round is None:
            return elapsed >= float(ev.at_s or 0.0)
        done = self.progress(ev.at_round[0]) if self.progress is not None else None
        return done is not None and done >= ev.at_round[1]

    def due(self) -> list[FaultEvent]:
        """Apply every event whose time (or round) has come, timed ones in time order; the events applied."""
        if self.t0 is None:
            return []
        done: list[FaultEvent] = []
        while True:
            elapsed = self.clock() - self.t0
            ev = next((e for e in self._pending if self._is_due(e, elapsed)), None)
            if ev is None:
                return done
            self._pending.remove(ev)
            self.apply(ev)
            done.append(ev)

    def apply(self, ev: FaultEvent) -> None:
        """Apply one event now; a failure is recorded (and logged), not raised."""
        at = self.clock()
        detail, ok = "", True
        try:
            if ev.action in ("link_down", "link_up"):
                link = ev.link
                if ev.on_task is not None:
                    link = self._cut_for.get(ev.on_task) if ev.action == "link_up" else (
                        self.task_link(ev.on_task) if self.task_link is not None else None)
                    if link is None:
                        raise RuntimeError(f"no link to {'restore' if ev.action == 'link_up' else 'cut'} "
                                           f"under task {ev.on_task} (not running now)")
                    self._cut_for[ev.on_task] = link
                    detail = link_name(link)
                assert link is not None
                self.emu.set_link(link[0], link[1], ev.action == "link_up")
            elif ev.action == "server_kill":
                assert ev.site is not None
                self.compute.kill_server(ev.site)
                if ev.restart_after_s is not None:
                    assert self.t0 is not None
                    back = FaultEvent(at_s=at - self.t0 + ev.restart_after_s, action="server_restart", site=ev.site)
                    self._pending = sorted([*self._pending, back], key=_order)
            elif ev.action == "server_restart":
                assert ev.site is not None
                detail = f"back in {self.compute.restart_server(ev.site):.2f} s"
            elif ev.action == "controller_restart":
                health = self.emu.restart_controller()
                detail = f"restored tasks {health.get('restored_tasks', [])}"
            elif ev.action == "background":
                if self.background_step is None:
                    raise RuntimeError("this run has no background traffic to step")
                assert ev.load is not None
                self.background_step(ev.load)
        except Exception as e:  # noqa: BLE001 -- a fault that could not be injected is a result, not a crash
            ok, detail = False, f"{type(e).__name__}: {e}"
            LOG.warning("event %s %s %s failed: %s", ev.action, ev.target, ev.when, detail)
        else:
            LOG.info("event %s %s (%s) applied at %.1f s%s", ev.action, ev.target, ev.when, at - (self.t0 or at),
                     f" ({detail})" if detail else "")
        self.record(at_s=at, action=ev.action, target=ev.target, ok=ok, detail=detail,
                    took_s=self.clock() - at)


def links_down(topology: Mapping[str, Any]) -> set[Link]:
    """The site-to-site links (sorted site pairs) with a port down, from the controller's ``/topology``."""
    out: set[Link] = set()
    for port in topology.get("ports_down", []):
        link = port.get("link")
        if isinstance(link, list) and len(link) == 2 and "host" not in link:
            a, b = sorted(str(x) for x in link)
            out.add((a, b))
    return out


class LinkWatcher:
    """The links the controller reports down (from port-status messages), polled.

    `poll` returns the links that went down and came up since the last call (each as a sorted
    site pair). A controller that does not answer (restarting) changes nothing. `also_down`, when
    given, adds links known down otherwise (those of a machine lost mid-run:
    `orchestrator.experiment.lost_machines.MachineWatch.links`).
    """

    def __init__(self, client: Any, also_down: Callable[[], set[Link]] | None = None) -> None:
        self.client = client
        self.also_down = also_down
        self.down: set[Link] = set()

    def poll(self) -> tuple[set[Link], set[Link]]:
        extra = self.also_down() if self.also_down is not None else set()
        try:
            topo = self.client.topology()
        except Exception:  # noqa: BLE001 -- the controller is restarting: nothing new this time
            return set(), set()
        now = links_down(topo) | extra
        went_down, came_up = now - self.down, self.down - now
        self.down = now
        return went_down, came_up


def busiest_link(schedule: Any, model: NetworkModel) -> Link | None:
    """The link (sorted site pair) that most of `schedule`'s paths cross, among those whose loss
    leaves `model` connected (ties by name); None if there is none."""
    import networkx as nx

    count: dict[Link, int] = {}
    for e in schedule.edges:
        for hop in {tuple(sorted(h)) for h in e.links()}:
            count[(hop[0], hop[1])] = count.get((hop[0], hop[1]), 0) + 1
    bridges = {tuple(sorted(b)) for b in nx.bridges(model.graph)}
    usable = [link for link in count if link not in bridges]
    return min(usable, key=lambda link: (-count[link], link), default=None)




def follow_links(core: Any, watcher: LinkWatcher, live: list[Any]) -> int:
    """React to the links `watcher` reports down or up again (`policy.links_changed` on the lifecycle
    `core`); how many of the running tasks `live` ended (they leave it)."""
    went_down, came_up = watcher.poll()
    if not (went_down or came_up):
        return 0
    n = len(live)
    links_changed(core, went_down, came_up, live)
    return n - len(live)
