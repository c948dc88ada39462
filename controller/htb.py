"""The htb tree every shaped link carries, and the pure builders of its ``tc`` commands.

Every shaped switch-to-switch egress interface (the directed link a->b leaves a's switch on
``<switch of a>-eth<plan.port_towards(a, b)>``) carries this htb tree::

    5:0   root qdisc htb, default 5:2 (what no filter claims is background; best effort, 5:3, on the
          tc datapath: `controller.tc_flows`)
    └─ 5:1   the link: rate = ceil = the plan's emulated rate
       ├─ 5:2    background: rate = BACKGROUND_SHARE of the link, ceil = the link, prio 1
       ├─ 5:3    best-effort connectivity: rate = MIN_RATE_MBPS, ceil = the link, prio 2
       ├─ 5:4    small TCP segments (pure ACKs): rate = ACK_SHARE of the link, ceil = the link, prio 0
       └─ 5:N    one class per task (N = 0x10, 0x11, ...; a task has the same N on every link):
                 rate = the task's guaranteed rate on the link, ceil = the link, prio 0

The emulation builds 5:0, 5:1, 5:2, 5:3, 5:4 and their two filters when it brings the links up
(`base_layout`, used by Mininet's interface class); the controller adds a task's classes and
filters after the task's flow entries and removes them with the entries (`TcShaper`).

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

The per-task classes and filters that go under 5:1 are built by `controller.shaping`; ``tc`` runs
in `controller.tc`. This module only builds argument lists; it imports nothing from the orchestrator
or the workers.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.flows import LOWER_EFFORT_DSCP
from topologies.plan import EmulationPlan

# The burst is the emulation plan's, shared with the simulation's twin (topologies/shaping.py).
from topologies.shaping import BURST_CAP_BYTES as BURST_CAP_BYTES
from topologies.shaping import BURST_FLOOR_BYTES as BURST_FLOOR_BYTES
from topologies.shaping import BURST_WINDOW_S as BURST_WINDOW_S
from topologies.shaping import burst_bytes as burst_bytes

ROOT_MAJOR = 5
LINK_CLASS = 1
BACKGROUND_CLASS = 2
BEST_EFFORT_CLASS = 3
ACK_CLASS = 4
FIRST_TASK_CLASS = 0x10
LAST_TASK_CLASS = 0xFFEF
#: htb priorities (lower is better): spare capacity goes to task classes before the background.
TASK_PRIO = 0
BACKGROUND_PRIO = 1
BEST_EFFORT_PRIO = 2
#: The preference of the best-effort filter (task filters use their class minor, from 0x10).
BEST_EFFORT_FILTER_PRIO = 1
#: The preference of the small-segment filter (after best effort's: best-effort ACKs stay there).
ACK_FILTER_PRIO = 2
#: The preference of the tc datapath's background filters (`controller.tc_flows`), after every task's
#: (a task's filter preference is its class minor, up to `LAST_TASK_CLASS`).
BACKGROUND_FILTER_PRIO = 0xFFF0
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

Link = tuple[str, str]
TcCommand = list[str]


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


def interface_switch(device: str) -> str:
    """The switch a switch interface (Mininet's ``<switch>-eth<port>``, `interface`) is on."""
    return device.rsplit("-eth", 1)[0]


def background_rate_mbps(link_mbps: float) -> float:
    return link_mbps * BACKGROUND_SHARE


def ack_rate_mbps(link_mbps: float) -> float:
    return link_mbps * ACK_SHARE


def task_budget_mbps(link_mbps: float) -> float:
    """What the tasks' guarantees on a link may add up to."""
    return link_mbps - background_rate_mbps(link_mbps) - ack_rate_mbps(link_mbps)


def htb_args(rate_mbps: float, ceil_mbps: float, prio: int | None = None) -> list[str]:
    """An htb class at `rate_mbps`, borrowing up to `ceil_mbps`; its burst from the rate and its
    cburst from the ceil (`burst_bytes`)."""
    args = ["htb", "rate", rate_arg(rate_mbps), "ceil", rate_arg(ceil_mbps), "burst", str(burst_bytes(rate_mbps)),
            "cburst", str(burst_bytes(ceil_mbps)), "quantum", str(QUANTUM)]
    return args + (["prio", str(prio)] if prio is not None else [])


def best_effort_filter_match() -> list[str]:
    """u32 match of the packets best-effort entries marked: DSCP = Lower Effort (ECN bits ignored)."""
    return ["match", "ip", "dsfield", f"{LOWER_EFFORT_DSCP << 2:#04x}", "0xfc"]


def small_segment_match() -> list[str]:
    """u32 match of TCP segments whose IP datagram is under 128 bytes: pure ACKs (52 bytes with
    timestamps, up to 84 with SACK blocks), and nothing that carries a real share of the data."""
    return ["match", "ip", "protocol", "6", "0xff", "match", "u16", "0x0000", "0xff80", "at", "2"]


def base_layout(dev: str, link_mbps: float, default_class: int = BACKGROUND_CLASS) -> list[TcCommand]:
    """The root qdisc, the link, background, best-effort and ACK classes and the best-effort and
    small-segment filters of one interface (see the module docstring). `default_class` is what no
    filter claims: the background on Open vSwitch, best effort on the tc datapath
    (`controller.tc_flows`, which cannot mark best-effort packets)."""
    return [
        ["qdisc", "add", "dev", dev, "root", "handle", f"{ROOT_MAJOR}:0", "htb", "default", f"{default_class:x}"],
        ["class", "add", "dev", dev, "parent", f"{ROOT_MAJOR}:0", "classid", classid(LINK_CLASS),
         *htb_args(link_mbps, link_mbps)],
        ["class", "add", "dev", dev, "parent", classid(LINK_CLASS), "classid", classid(BACKGROUND_CLASS),
         *htb_args(background_rate_mbps(link_mbps), link_mbps, BACKGROUND_PRIO)],
        ["class", "add", "dev", dev, "parent", classid(LINK_CLASS), "classid", classid(BEST_EFFORT_CLASS),
         *htb_args(MIN_RATE_MBPS, link_mbps, BEST_EFFORT_PRIO)],
        ["filter", "add", "dev", dev, "parent", f"{ROOT_MAJOR}:0", "protocol", "ip", "prio",
         str(BEST_EFFORT_FILTER_PRIO), "u32", *best_effort_filter_match(), "flowid", classid(BEST_EFFORT_CLASS)],
        ["class", "add", "dev", dev, "parent", classid(LINK_CLASS), "classid", classid(ACK_CLASS),
         *htb_args(ack_rate_mbps(link_mbps), link_mbps, TASK_PRIO)],
        ["filter", "add", "dev", dev, "parent", f"{ROOT_MAJOR}:0", "protocol", "ip", "prio",
         str(ACK_FILTER_PRIO), "u32", *small_segment_match(), "flowid", classid(ACK_CLASS)],
    ]


def background_queue(dev: str) -> TcCommand:
    """The background leaf's short queue (`BACKGROUND_QUEUE_PACKETS`), for links without netem."""
    return ["qdisc", "add", "dev", dev, "parent", classid(BACKGROUND_CLASS), "handle", f"{BACKGROUND_QDISC_MAJOR}:",
            "pfifo", "limit", str(BACKGROUND_QUEUE_PACKETS)]


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


#: The handles of the netem qdiscs `delay_leaves` puts under the best-effort and ACK classes
#: (Mininet's netem under the background class is 10:; the controller's under task classes take
#: handles tc allocates, from 8000:).
DELAY_QDISC_MAJORS = {BEST_EFFORT_CLASS: 0x11, ACK_CLASS: 0x12}


def delay_leaves(dev: str, delay: str) -> list[TcCommand]:
    """The link's propagation delay (netem, e.g. ``delay="1.500ms"``) under the best-effort and ACK classes.

    The delay is the fibre's, so every class of a link carries it: the background's netem comes with
    the link (Mininet's), each task's from the controller (`controller.shaping.install_commands`),
    and these two with the link as well. Without them, best-effort traffic (a user's ``ping``)
    crossed the links with no delay at all, and every TCP flow's pure ACKs came back without the
    reverse path's delay, so a task's round trip was one way's fibre delay (seen on a stock kernel:
    ping 0.6 ms over a path of 20 ms).
    """
    return [["qdisc", "add", "dev", dev, "parent", classid(minor), "handle", f"{major:x}:", "netem", "delay", delay]
            for minor, major in DELAY_QDISC_MAJORS.items()]
