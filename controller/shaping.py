"""Reserved rates enforced on the links: one htb class per task, fed by u32 filters on its TCP ports.

Every shaped switch-to-switch egress interface (the directed link a->b leaves a's switch on
``<switch of a>-eth<plan.port_towards(a, b)>``) carries this htb tree::

    5:0   root qdisc htb, default 5:2 (what no filter claims is background)
    └─ 5:1   the link: rate = ceil = the plan's emulated rate
       ├─ 5:2    background: rate = BACKGROUND_SHARE of the link, ceil = the link, prio 1
       ├─ 5:3    best-effort connectivity: rate = MIN_RATE_MBPS, ceil = the link, prio 2
       ├─ 5:4    small TCP segments (pure ACKs): rate = ACK_SHARE of the link, ceil = the link, prio 0
       └─ 5:N    one class per task (N = 0x10, 0x11, ...; a task has the same N on every link):
                 rate = the task's guaranteed rate on the link, ceil = the link, prio 0

The emulation builds 5:0, 5:1, 5:2, 5:3, 5:4 and their two filters when it brings the links up
(`base_layout`, used by Mininet's interface class); the controller adds a task's classes and
filters after the task's flow entries and removes them with the entries (`TcShaper`). Where the
kernel has netem, every leaf class carries the link's propagation delay (`delay_leaves`).

Best-effort connectivity (`controller.flows.best_effort_entries`) marks its packets with the Lower
Effort DSCP; one u32 filter per link (preference `BEST_EFFORT_FILTER_PRIO`, below any task's) sends
them to 5:3, the lowest class: it is guaranteed next to nothing and borrows only after the tasks and
the background, so a ``ping`` or a hand-run ``iperf3`` never takes a task's reserved rate.

Pure ACKs (and any TCP segment under 128 bytes: `small_segment_match`) go to 5:4, whatever flow
they belong to (filter preference `ACK_FILTER_PRIO`, after best effort's, before any task's). Without
it, the ACKs of a task's flow down a path shared the task's FIFO on the reverse links with the task's
own data coming up them (spff's copies of the model from G, while the first locals already upload),
waited behind up to a full queue of it, and held the flow to a fraction of the link
(`benchmarks/bench_dataplane.py`, bound). 5:4 is guaranteed `ACK_SHARE` of the link (the ACKs of
about 20 times that much data) and borrows at the tasks' prio.

A reservation is a guarantee, not a cap: a task's class is guaranteed the sum of the
`PathSpec.reserved_mbps` of the task's paths that cross the link, and borrows up to the link's rate
while the link has room, before the background does (better htb prio). The guarantees on a link
never add up to more than the link's rate: the background keeps `BACKGROUND_SHARE`, the ACKs
`ACK_SHARE`, and a task
gets at most what earlier tasks left (first come, first served; `LinkClass.capped` says when it got
less than it asked). A class needs a positive rate, so a task granted nothing (or only carrying
ACKs on a link) gets `MIN_RATE_MBPS`, still at the tasks' prio.

Filters (u32, on the root qdisc, one filter preference per task, equal to its class minor, so
``tc filter del ... prio N`` removes exactly that task's filters) match TCP between the path's two
hosts: the data direction ``dport = tcp_dst`` on the links of the path, the ACK direction
``sport = tcp_dst`` on the reverse links.

Pure builders turn `TaskPaths` + `EmulationPlan` into ``tc`` argument lists (`task_classes`,
`install_commands`, `remove_commands`, `batch_text`); a `TcRunner` executes them
(`SubprocessTc`: ``tc -batch -`` with the lines on stdin, never a shell). This module imports
nothing from the orchestrator or the workers.

Over 400 lines: the htb layout, class-id allocation and the u32 filters are one mechanism whose
pure builders and runner are tested together.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from controller.flows import LOWER_EFFORT_DSCP
from controller.paths import TaskPaths
from topologies.errors import TopologyError
from topologies.plan import EmulationPlan

#: Environment variable the emulation sets to "1" when its links carry a netem delay; task classes
#: then get the same delay (netem under each task class, as under the background class).
ENV_LINK_DELAY = "NETAI_LINK_DELAY"

ROOT_MAJOR = 5
LINK_CLASS = 1
BACKGROUND_CLASS = 2
BEST_EFFORT_CLASS = 3
ACK_CLASS = 4
FIRST_TASK_CLASS = 0x10
LAST_TASK_CLASS = 0xFFFF
#: htb priorities (lower is better): spare capacity goes to task classes before the background.
TASK_PRIO = 0
BACKGROUND_PRIO = 1
BEST_EFFORT_PRIO = 2
#: The preference of the best-effort filter (task filters use their class minor, from 0x10).
BEST_EFFORT_FILTER_PRIO = 1
#: The preference of the small-segment filter (after best effort's: best-effort ACKs stay there).
ACK_FILTER_PRIO = 2
#: The ACK class's guaranteed share of every link.
ACK_SHARE = 0.02
#: The background's guaranteed share of every link (the tasks' guarantees share the rest).
BACKGROUND_SHARE = 0.01
#: The background leaf's queue, packets (a pfifo under 5:2 where no netem delay takes that place).
#: htb's default leaf queue is txqueuelen (1000) packets; in Open vSwitch's userspace datapath every
#: packet waiting in any class of any port also holds the send budget of the datapath's one packet
#: socket (`orchestrator.emulation.ovs_socket`), so a saturating background with 1000 packets queued
#: left the tasks' packets no room: they were dropped before htb could classify them. 8 packets were
#: chosen under the kernel's default budget (212992 bytes); with the 4 MiB that `make setup` gives,
#: 8 packets dropped the datapath's batches of up to 32 frames and a background TCP flow over three
#: 100 Mbit/s links reached 0.66-0.75 of the line rate (`netai net test`). 64 packets (about 8 ms
#: at 100 Mbit/s) give 0.95, with the tasks still isolated (`benchmarks/bench_dataplane.py`: 1.05).
BACKGROUND_QUEUE_PACKETS = 64
BACKGROUND_QDISC_MAJOR = 6
#: The rate of a task class with nothing guaranteed (htb needs a positive rate): 1 kbit/s.
MIN_RATE_MBPS = 0.001
#: One MTU frame: at tens of Mbit/s htb's default quantum (rate / r2q) draws a warning.
QUANTUM = 1514
BURST = "15k"
_EPS = 1e-9

Link = tuple[str, str]
TcCommand = list[str]


class ShapingError(RuntimeError):
    """``tc`` refused or failed to run a batch (the message carries its output)."""


class ShapingBuildError(ValueError):
    """A task whose paths cannot be turned into classes (an unknown site or link, a site without host)."""


# -- small builders ---------------------------------------------------------------------------------
def classid(minor: int) -> str:
    """``5:<minor in hex>``, as tc writes class ids."""
    return f"{ROOT_MAJOR}:{minor:x}"


def rate_arg(mbps: float) -> str:
    """A tc rate in bit/s (exact, no unit rounding)."""
    return f"{round(mbps * 1e6)}bit"


def interface(plan: EmulationPlan, a: str, b: str) -> str:
    """The egress interface of the directed link a->b: on a's switch, the port towards b."""
    return f"{plan.switch(a).name}-eth{plan.port_towards(a, b)}"


def background_rate_mbps(link_mbps: float) -> float:
    return link_mbps * BACKGROUND_SHARE


def ack_rate_mbps(link_mbps: float) -> float:
    return link_mbps * ACK_SHARE


def task_budget_mbps(link_mbps: float) -> float:
    """What the tasks' guarantees on a link may add up to."""
    return link_mbps - background_rate_mbps(link_mbps) - ack_rate_mbps(link_mbps)


def _htb(rate_mbps: float, ceil_mbps: float, prio: int | None = None) -> list[str]:
    args = ["htb", "rate", rate_arg(rate_mbps), "ceil", rate_arg(ceil_mbps), "burst", BURST, "cburst", BURST,
            "quantum", str(QUANTUM)]
    return args + (["prio", str(prio)] if prio is not None else [])


def best_effort_filter_match() -> list[str]:
    """u32 match of the packets best-effort entries marked: DSCP = Lower Effort (ECN bits ignored)."""
    return ["match", "ip", "dsfield", f"{LOWER_EFFORT_DSCP << 2:#04x}", "0xfc"]


def small_segment_match() -> list[str]:
    """u32 match of TCP segments whose IP datagram is under 128 bytes: pure ACKs (52 bytes with
    timestamps, up to 84 with SACK blocks), and nothing that carries a real share of the data."""
    return ["match", "ip", "protocol", "6", "0xff", "match", "u16", "0x0000", "0xff80", "at", "2"]


def base_layout(dev: str, link_mbps: float) -> list[TcCommand]:
    """The root qdisc, the link, background, best-effort and ACK classes and the best-effort and
    small-segment filters of one interface (see the module docstring)."""
    return [
        ["qdisc", "add", "dev", dev, "root", "handle", f"{ROOT_MAJOR}:0", "htb", "default", f"{BACKGROUND_CLASS:x}"],
        ["class", "add", "dev", dev, "parent", f"{ROOT_MAJOR}:0", "classid", classid(LINK_CLASS),
         *_htb(link_mbps, link_mbps)],
        ["class", "add", "dev", dev, "parent", classid(LINK_CLASS), "classid", classid(BACKGROUND_CLASS),
         *_htb(background_rate_mbps(link_mbps), link_mbps, BACKGROUND_PRIO)],
        ["class", "add", "dev", dev, "parent", classid(LINK_CLASS), "classid", classid(BEST_EFFORT_CLASS),
         *_htb(MIN_RATE_MBPS, link_mbps, BEST_EFFORT_PRIO)],
        ["filter", "add", "dev", dev, "parent", f"{ROOT_MAJOR}:0", "protocol", "ip", "prio",
         str(BEST_EFFORT_FILTER_PRIO), "u32", *best_effort_filter_match(), "flowid", classid(BEST_EFFORT_CLASS)],
        ["class", "add", "dev", dev, "parent", classid(LINK_CLASS), "classid", classid(ACK_CLASS),
         *_htb(ack_rate_mbps(link_mbps), link_mbps, TASK_PRIO)],
        ["filter", "add", "dev", dev, "parent", f"{ROOT_MAJOR}:0", "protocol", "ip", "prio",
         str(ACK_FILTER_PRIO), "u32", *small_segment_match(), "flowid", classid(ACK_CLASS)],
    ]


def background_queue(dev: str) -> TcCommand:
    """The background leaf's short queue (`BACKGROUND_QUEUE_PACKETS`), for links without netem."""
    return ["qdisc", "add", "dev", dev, "parent", classid(BACKGROUND_CLASS), "handle", f"{BACKGROUND_QDISC_MAJOR}:",
            "pfifo", "limit", str(BACKGROUND_QUEUE_PACKETS)]


#: The handles of the netem qdiscs `delay_leaves` puts under the best-effort and ACK classes
#: (Mininet's netem under the background class is 10:; the controller's under task classes take
#: handles tc allocates, from 8000:).
DELAY_QDISC_MAJORS = {BEST_EFFORT_CLASS: 0x11, ACK_CLASS: 0x12}


def delay_leaves(dev: str, delay: str) -> list[TcCommand]:
    """The link's propagation delay (netem, e.g. ``delay="1.500ms"``) under the best-effort and ACK classes.

    The delay is the fibre's, so every class of a link carries it: the background's netem comes with
    the link (Mininet's), each task's from the controller (`install_commands`), and these two with
    the link as well. Without them, best-effort traffic (a user's ``ping``) crossed the links with no
    delay at all, and every TCP flow's pure ACKs came back without the reverse path's delay, so a
    task's round trip was one way's fibre delay (seen on a stock kernel: ping 0.6 ms over a path
    of 20 ms).
    """
    return [["qdisc", "add", "dev", dev, "parent", classid(minor), "handle", f"{major:x}:", "netem", "delay", delay]
            for minor, major in DELAY_QDISC_MAJORS.items()]


@dataclass(frozen=True)
class ShapedLink:
    """One directed switch-to-switch link and its egress interface."""

    src: str
    dst: str
    dev: str
    link_mbps: float
    delay_ms: float


def shaped_links(plan: EmulationPlan) -> list[ShapedLink]:
    """Both directions of every link of the plan, in the plan's order."""
    out = []
    for ln in plan.links:
        for a, b in ((ln.a, ln.b), (ln.b, ln.a)):
            out.append(ShapedLink(a, b, interface(plan, a, b), ln.emulated_mbps, ln.delay_ms))
    return out


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
                     *_htb(lc.htb_rate_mbps, d.link_mbps, TASK_PRIO)])
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


def batch_text(commands: Sequence[Sequence[str]]) -> str:
    """The input of ``tc -batch -``: one command a line. Raises ValueError on an argument tc would split."""
    lines = []
    for cmd in commands:
        for arg in cmd:
            if not arg or any(c.isspace() or c in "\"'\\#" for c in arg):
                raise ValueError(f"unsafe tc argument {arg!r} in {list(cmd)}")
        lines.append(" ".join(cmd))
    return "".join(line + "\n" for line in lines)


# -- running tc -------------------------------------------------------------------------------------
class TcRunner(Protocol):
    """Executes tc batches; `check` says why the given interfaces cannot be shaped (None: they can)."""

    def check(self, devices: Sequence[str]) -> str | None: ...

    def run(self, commands: Sequence[Sequence[str]], *, force: bool = False) -> None:
        """Run the batch; stop at the first error unless `force`. Raises ShapingError if any command failed."""
        ...


class SubprocessTc:
    """`TcRunner` running the ``tc`` binary (root, in the namespace of the switch interfaces)."""

    def __init__(self, tc: str | None = None, *, timeout_s: float = 20.0) -> None:
        self.tc = tc
        self.timeout_s = timeout_s

    def _binary(self) -> str | None:
        return self.tc or shutil.which("tc") or next(
            (p for p in ("/usr/sbin/tc", "/sbin/tc") if os.access(p, os.X_OK)), None
        )

    def check(self, devices: Sequence[str]) -> str | None:
        tc = self._binary()
        if tc is None:
            return "tc (iproute2) is not installed"
        if os.geteuid() != 0:
            return "the controller does not run as root (tc needs CAP_NET_ADMIN)"
        try:
            res = subprocess.run([tc, "-j", "qdisc", "show"], capture_output=True, text=True,
                                 timeout=self.timeout_s, check=False)
            qdiscs = json.loads(res.stdout or "[]") if res.returncode == 0 else None
        except (OSError, subprocess.SubprocessError, ValueError) as e:
            return f"tc qdisc show failed: {e}"
        if not isinstance(qdiscs, list):
            return f"tc qdisc show failed: {res.stderr.strip()[:200]}"
        return layout_problem(devices, qdiscs)

    def run(self, commands: Sequence[Sequence[str]], *, force: bool = False) -> None:
        if not commands:
            return
        tc = self._binary()
        if tc is None:
            raise ShapingError("tc (iproute2) is not installed")
        text = batch_text(commands)
        try:
            res = subprocess.run([tc, *(["-force"] if force else []), "-batch", "-"], input=text,
                                 capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            raise ShapingError(f"tc -batch failed: {e}") from e
        if res.returncode != 0:
            raise ShapingError(f"tc -batch exited {res.returncode}: {(res.stderr or res.stdout).strip()[:500]}")


def layout_problem(devices: Sequence[str], qdiscs: Iterable[Mapping[str, Any]]) -> str | None:
    """Why `devices` lack the base layout, from ``tc -j qdisc show`` (None if every one has it)."""
    roots = {q.get("dev"): q for q in qdiscs if q.get("root")}
    expected_default = f"{BACKGROUND_CLASS:#x}"
    bad = []
    for dev in devices:
        q = roots.get(dev)
        if (q is None or q.get("kind") != "htb" or q.get("handle") != f"{ROOT_MAJOR}:"
                or (q.get("options") or {}).get("default") != expected_default):
            bad.append(dev)
    if not bad:
        return None
    shown = ", ".join(bad[:4]) + (", ..." if len(bad) > 4 else "")
    return (f"{len(bad)} of {len(devices)} switch-to-switch interfaces lack the htb layout "
            f"(root {ROOT_MAJOR}: default {BACKGROUND_CLASS:x}): {shown}")


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
