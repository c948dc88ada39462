"""Reserved rates enforced on the links: one htb class per task, fed by u32 filters on its TCP ports.

Every shaped switch-to-switch egress interface carries the htb tree of `controller.htb` (root 5:0,
the link 5:1, background 5:2, best-effort connectivity 5:3, pure ACKs 5:4); a task gets one class
5:N under 5:1 on every link its segments cross (N = 0x10, 0x11, ...; the same N on every link),
added after the task's flow entries and removed with them (`TcShaper`). Where the kernel has netem,
every leaf class carries the link's propagation delay (`controller.htb.delay_leaves`).

A reservation is a guarantee, not a cap: a task's class is guaranteed the sum of the
`PathSpec.reserved_mbps` of the task's paths that cross the link, and borrows up to the link's rate
while the link has room, before the background does (better htb prio). The guarantees on a link
never add up to more than the link's rate: the background keeps `controller.htb.BACKGROUND_SHARE`,
the ACKs `controller.htb.ACK_SHARE`, and a task gets at most what earlier tasks left (first come, first served; `LinkClass.capped` says when it got
less than it asked). A class needs a positive rate, so a task granted nothing (or only carrying
ACKs on a link) gets `MIN_RATE_MBPS`, still at the tasks' prio.

Filters (u32, on the root qdisc, one filter preference per task, equal to its class minor, so
``tc filter del ... prio N`` removes exactly that task's filters) match TCP between the path's two
hosts: the data direction ``dport = tcp_dst`` on the links of the path, the ACK direction
``sport = tcp_dst`` on the reverse links.

Pure builders turn `TaskPaths` + `EmulationPlan` into ``tc`` argument lists (`task_classes`,
`install_commands`, `remove_commands`); a `controller.tc.TcRunner` executes them. This module
imports nothing from the orchestrator or the workers.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from controller.htb import (
    FIRST_TASK_CLASS,
    LAST_TASK_CLASS,
    LINK_CLASS,
    MIN_RATE_MBPS,
    ROOT_MAJOR,
    TASK_PRIO,
    Link,
    TcCommand,
    classid,
    htb_args,
    shaped_links,
    task_budget_mbps,
)
from controller.paths import TaskPaths
from controller.tc import ShapingError, TcRunner
from topologies.errors import TopologyError
from topologies.plan import EmulationPlan

#: Environment variable the emulation sets to "1" when its links carry a netem delay; task classes
#: then get the same delay (netem under each task class, as under the background class).
ENV_LINK_DELAY = "NETAI_LINK_DELAY"

_EPS = 1e-9


class ShapingBuildError(ValueError):
    """A task whose paths cannot be turned into classes (an unknown site or link, a site without host)."""


@dataclass(frozen=True)
class TcFilter:
    """TCP segments from `src_ip` to `dst_ip` with a given source or destination port."""

    src_ip: str
    dst_ip: str
    sport: int | None = None
    dport: int | None = None

    def sort_key(self) -> tuple[str, str, int, int]:
        return (self.src_ip, self.dst_ip, self.sport or 0, self.dport or 0)

    def match_args(self) -> list[str]:
        args = ["match", "ip", "protocol", "6", "0xff",
                "match", "ip", "src", f"{self.src_ip}/32", "match", "ip", "dst", f"{self.dst_ip}/32"]
        if self.sport is not None:
            args += ["match", "ip", "sport", str(self.sport), "0xffff"]
        if self.dport is not None:
            args += ["match", "ip", "dport", str(self.dport), "0xffff"]
        return args


@dataclass(frozen=True)
class LinkDemand:
    """What one task asks of one directed link: a guaranteed rate and the filters of its segments."""

    link: Link
    dev: str
    link_mbps: float
    delay_ms: float
    asked_mbps: float
    filters: tuple[TcFilter, ...]


@dataclass(frozen=True)
class LinkClass:
    """A task's class on one directed link: its demand and the rate it is guaranteed."""

    demand: LinkDemand
    guaranteed_mbps: float

    @property
    def htb_rate_mbps(self) -> float:
        return max(self.guaranteed_mbps, MIN_RATE_MBPS)

    @property
    def capped(self) -> bool:
        return self.guaranteed_mbps < self.demand.asked_mbps - _EPS

    def to_dict(self) -> dict[str, Any]:
        d = self.demand
        return {
            "link": list(d.link),
            "dev": d.dev,
            "reserved_mbps": round(d.asked_mbps, 6),
            "guaranteed_mbps": round(self.guaranteed_mbps, 6),
            "ceil_mbps": d.link_mbps,
            "filters": len(d.filters),
        }


@dataclass(frozen=True)
class TaskClasses:
    """Everything shaped for one task: one class id, a class (and filters) on each of its links."""

    task_id: int
    minor: int
    links: tuple[LinkClass, ...]

    @property
    def classid(self) -> str:
        return classid(self.minor)

    @property
    def capped(self) -> bool:
        return any(lc.capped for lc in self.links)

    def guaranteed(self) -> dict[Link, float]:
        return {lc.demand.link: lc.guaranteed_mbps for lc in self.links}

    def to_dict(self) -> dict[str, Any]:
        return {"classid": self.classid, "capped": self.capped, "links": [lc.to_dict() for lc in self.links]}


def task_demands(task: TaskPaths, plan: EmulationPlan) -> list[LinkDemand]:
    """Per directed link a task's segments cross (data or ACKs): its reserved rate and filters, by link.

    The rate on a link is the sum of `reserved_mbps` over the task's paths whose data crosses it.

    Raises
    ------
    ShapingBuildError
        If a path names an unknown site or a site without a host, or hops over a missing link.
    """
    by_link = {(sl.src, sl.dst): sl for sl in shaped_links(plan)}
    asked: dict[Link, float] = {}
    filters: dict[Link, dict[TcFilter, None]] = {}
    for path in task.paths:
        try:
            src_ip, dst_ip = plan.host(path.src).ip, plan.host(path.dst).ip
        except TopologyError as e:
            raise ShapingBuildError(f"task {task.task_id} path {path.src}->{path.dst}: {e}") from e
        data = TcFilter(src_ip, dst_ip, dport=path.tcp_dst)
        acks = TcFilter(dst_ip, src_ip, sport=path.tcp_dst)
        for a, b in path.links():
            if (a, b) not in by_link:
                raise ShapingBuildError(f"task {task.task_id} path {list(path.sites)}: no link {a}-{b}")
            asked[(a, b)] = asked.get((a, b), 0.0) + path.reserved_mbps
            asked.setdefault((b, a), 0.0)
            filters.setdefault((a, b), {})[data] = None
            filters.setdefault((b, a), {})[acks] = None
    out = []
    for link in sorted(asked):
        sl = by_link[link]
        out.append(LinkDemand(link, sl.dev, sl.link_mbps, sl.delay_ms, asked[link], tuple(sorted(filters[link], key=TcFilter.sort_key))))
    return out


def grant(demands: Iterable[LinkDemand], used: Mapping[Link, float]) -> tuple[LinkClass, ...]:
    """Guarantee each demand what the link's task budget has left after `used` (other tasks' guarantees)."""
    out = []
    for d in demands:
        room = max(0.0, task_budget_mbps(d.link_mbps) - used.get(d.link, 0.0))
        out.append(LinkClass(d, min(d.asked_mbps, room)))
    return tuple(out)


def task_classes(
    task: TaskPaths, plan: EmulationPlan, minor: int, used: Mapping[Link, float] | None = None
) -> TaskClasses:
    """A task's classes with class minor `minor`, granted against the other tasks' guarantees `used`."""
    if not FIRST_TASK_CLASS <= minor <= LAST_TASK_CLASS:
        raise ValueError(f"a task class minor must be in {FIRST_TASK_CLASS:#x}..{LAST_TASK_CLASS:#x}, got {minor:#x}")
    return TaskClasses(task.task_id, minor, grant(task_demands(task, plan), used or {}))


def install_commands(tc: TaskClasses, *, delay: bool = False) -> list[TcCommand]:
    """tc commands adding a task's classes (then their filters); with `delay`, netem under each class."""
    cmds: list[TcCommand] = []
    for lc in tc.links:
        d = lc.demand
        cmds.append(["class", "add", "dev", d.dev, "parent", classid(LINK_CLASS), "classid", tc.classid,
                     *htb_args(lc.htb_rate_mbps, d.link_mbps, TASK_PRIO)])
        if delay and d.delay_ms > 0:
            cmds.append(["qdisc", "add", "dev", d.dev, "parent", tc.classid, "netem", "delay", f"{d.delay_ms:.3f}ms"])
        for f in d.filters:
            cmds.append(["filter", "add", "dev", d.dev, "parent", f"{ROOT_MAJOR}:0", "protocol", "ip",
                         "prio", str(tc.minor), "u32", *f.match_args(), "flowid", tc.classid])
    return cmds


def remove_commands(tc: TaskClasses) -> list[TcCommand]:
    """tc commands removing a task's filters, then its classes (a class with filters cannot go)."""
    cmds: list[TcCommand] = []
    for lc in tc.links:
        cmds.append(["filter", "del", "dev", lc.demand.dev, "parent", f"{ROOT_MAJOR}:0", "protocol", "ip",
                     "prio", str(tc.minor)])
    for lc in tc.links:
        cmds.append(["class", "del", "dev", lc.demand.dev, "classid", tc.classid])
    return cmds


# -- the controller's shaper ------------------------------------------------------------------------
@dataclass(frozen=True)
class ShapingStatus:
    """Whether reserved rates are enforced on the links, and why (not)."""

    enforced: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"enforced": self.enforced, "reason": self.reason}


@dataclass(frozen=True)
class Reservation:
    """The outcome of shaping one task: enforced or not (and why), and its classes when enforced."""

    enforced: bool
    reason: str
    classes: TaskClasses | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"enforced": self.enforced, "reason": self.reason}
        if self.classes is not None:
            d.update(self.classes.to_dict())
        return d


class Shaper(Protocol):
    """What the controller's core needs to enforce reservations."""

    def status(self) -> ShapingStatus: ...

    def install(self, task: TaskPaths) -> Reservation:
        """(Re)place the task's classes. Raises ShapingError / ShapingBuildError; unavailable is not an error."""
        ...

    def remove(self, task_id: int) -> TaskClasses | None:
        """Remove the task's classes (None if it had none). Raises ShapingError."""
        ...


class TcShaper:
    """`Shaper` keeping the task classes of one plan's interfaces through a `TcRunner`.

    Class minors are allocated per task (the lowest free one from `FIRST_TASK_CLASS`; a replaced task
    keeps its own); a minor whose removal failed is not reused. Readiness is probed through the
    runner (one ``tc qdisc show``) on every call until every interface has the base layout (the
    controller starts before Mininet creates them); from then on it is taken as ready for good.
    """

    def __init__(
        self,
        plan: EmulationPlan,
        runner: TcRunner,
        *,
        delay: bool = False,
    ) -> None:
        self.plan = plan
        self.runner = runner
        self.delay = delay
        self.devices = [sl.dev for sl in shaped_links(plan)]
        self.tasks: dict[int, TaskClasses] = {}
        self.stale: set[int] = set()
        self._status: ShapingStatus | None = None
        # Held across tc runs: batches and the bookkeeping change together (a green lock under os-ken).
        self._lock = threading.RLock()

    def status(self) -> ShapingStatus:
        with self._lock:
            if self._status is not None and self._status.enforced:
                return self._status
            if not self.devices:
                self._status = ShapingStatus(False, "the plan has no switch-to-switch links to shape")
            else:
                problem = self.runner.check(self.devices)
                self._status = ShapingStatus(
                    problem is None,
                    problem or f"htb classes per task on {len(self.devices)} switch-to-switch interfaces",
                )
            return self._status

    def _allocate(self, task_id: int) -> int:
        old = self.tasks.get(task_id)
        if old is not None:
            return old.minor
        taken = {tc.minor for tc in self.tasks.values()} | self.stale
        for minor in range(FIRST_TASK_CLASS, LAST_TASK_CLASS + 1):
            if minor not in taken:
                return minor
        raise ShapingError(f"no free htb class id left for task {task_id}")

    def _used(self, task_id: int) -> dict[Link, float]:
        used: dict[Link, float] = {}
        for other in self.tasks.values():
            if other.task_id != task_id:
                for link, mbps in other.guaranteed().items():
                    used[link] = used.get(link, 0.0) + mbps
        return used

    def install(self, task: TaskPaths) -> Reservation:
        with self._lock:
            minor = self._allocate(task.task_id)
            classes = task_classes(task, self.plan, minor, self._used(task.task_id))
            self._remove_locked(task.task_id)
            status = self.status()
            if not status.enforced:
                return Reservation(False, status.reason)
            self._install_classes(classes)
            n = len(classes.links)
            reason = f"class {classes.classid} on {n} link{'s' if n != 1 else ''}"
            if classes.capped:
                reason += " (capped: the links' guarantees are taken)"
            return Reservation(True, reason, classes)

    def remove(self, task_id: int) -> TaskClasses | None:
        with self._lock:
            return self._remove_locked(task_id)

    def switches_down(self, switches: Iterable[str]) -> None:
        """The switches not connected to the controller now (names), for a runner that reaches
        other machines' interfaces (`controller.tc.ClusterTc`)."""
        tell = getattr(self.runner, "switches_down", None)
        if tell is not None:
            tell(switches)

    def restore(self, task: TaskPaths, minor: int) -> Reservation:
        """Take back a task a previous controller shaped with class `minor` (a restarted controller):
        whatever of its classes and filters the links still hold is removed, then they are
        installed afresh, so what is enforced is what this shaper records."""
        with self._lock:
            classes = task_classes(task, self.plan, minor, self._used(task.task_id))
            status = self.status()
            if not status.enforced:
                return Reservation(False, status.reason)
            self._cleanup(classes)
            self.stale.discard(minor)
            self._install_classes(classes)
            return Reservation(True, f"class {classes.classid} on {len(classes.links)} links (restored)", classes)

    def _install_classes(self, classes: TaskClasses) -> None:
        """Record and install a task's classes; on failure nothing of them stays (ShapingError)."""
        self.tasks[classes.task_id] = classes
        try:
            self.runner.run(install_commands(classes, delay=self.delay))
        except ShapingError:
            self.tasks.pop(classes.task_id, None)
            self._cleanup(classes)
            raise

    def _remove_locked(self, task_id: int) -> TaskClasses | None:
        classes = self.tasks.pop(task_id, None)
        if classes is None:
            return None
        try:
            self.runner.run(remove_commands(classes), force=True)
        except ShapingError:
            self.stale.add(classes.minor)
            raise
        return classes

    def _cleanup(self, classes: TaskClasses) -> None:
        """Remove what a failed install may have added; errors are expected (some parts never existed)."""
        try:
            self.runner.run(remove_commands(classes), force=True)
        except ShapingError:
            # Some of it never existed, or some of it stayed: do not reuse the class id.
            self.stale.add(classes.minor)
