"""Pure flow logic: a task's `TaskPaths` (or a list of background host pairs) + an `EmulationPlan` -> flow entries.

Every path ``src -> dst`` of a task becomes, on each switch along its sites, one entry that matches
the path's TCP segments (IPv4 src/dst of the two hosts + the path's destination TCP port) and
outputs towards the next site (the host port on the last switch). The ACK direction (``dst -> src``
with that port as TCP *source* port) follows the reverse of the same path. The cookie of a task's entries is the task
id, so flow statistics and deletion select a task by cookie.

Background traffic between two hosts gets IPv4 src/dst entries along a shortest path (fewest hops,
ties broken by the plan's link order) at a lower priority, in both directions.

Best-effort connectivity (`best_effort_entries`, the controller's default; ``strict`` leaves it out)
gives every host pair a fewest-hops route below the background's priority, so that ``ping`` and a
hand-run ``iperf3`` work on a running network: on every switch, one IPv4 entry per destination host
(match ``ipv4_dst``), towards it along a shortest-path tree rooted at it. Per destination rather than
per pair: hosts x switches entries instead of pairs x hops, and the trees make the routes
consistent hop by hop. These entries also set the IP DSCP to Lower Effort (`LOWER_EFFORT_DSCP`,
RFC 8622), which the links' shaping classifies into their lowest class (`controller.shaping`), so
best-effort traffic only uses what tasks and background leave. A packet that a task or background
entry matches on its first switch is never marked: those entries win there, and they lead to the
same destination hop by hop.

A table-miss entry drops everything else: ARP is static, so nothing floods, and in ``strict`` mode
a host pair with no route is isolated.

This module does no I/O and knows nothing of OpenFlow libraries: it returns `FlowEntry` values; the
SDN app turns them into messages (`controller.app`) and `parse_ofctl_dump` reads them back from
``ovs-ofctl dump-flows`` text for comparison. Its fewest-hops paths are `controller.hops`'.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from controller.hops import NoPath, next_hops_towards, shortest_path, site_neighbours
from controller.paths import PathSpec, TaskPaths
from topologies.errors import TopologyError
from topologies.plan import HOST_PORT, EmulationPlan

ETH_TYPE_IPV4 = 0x0800
IP_PROTO_TCP = 6

#: Priorities: task paths win over background routes, which win over best-effort connectivity; the
#: table-miss entry drops the rest.
TASK_PRIORITY = 200
BACKGROUND_PRIORITY = 100
BEST_EFFORT_PRIORITY = 10
TABLE_MISS_PRIORITY = 0

#: Cookies outside the task-id range (task ids are positive and below 2**63): 0 for the table-miss
#: entry, and from 2**63 up the controller's own routes.
TABLE_MISS_COOKIE = 0
BACKGROUND_COOKIE = 1 << 63
BEST_EFFORT_COOKIE = BACKGROUND_COOKIE + 1
COOKIE_MASK_ALL = (1 << 64) - 1

#: The DSCP best-effort entries set: Lower Effort (RFC 8622), shaped into the links' lowest class.
LOWER_EFFORT_DSCP = 1

#: Connectivity modes: ``best-effort`` (every host pair routed, below tasks and background) or
#: ``strict`` (only tasks and background routes carry anything).
BEST_EFFORT = "best-effort"
STRICT = "strict"
CONNECTIVITY_MODES = (BEST_EFFORT, STRICT)
#: The environment variable the emulation starts the controller with to choose the mode (default best-effort).
ENV_CONNECTIVITY = "NETAI_CONNECTIVITY"

MatchValue = int | str
Match = tuple[tuple[str, MatchValue], ...]


class FlowBuildError(ValueError):
    """A schedule or a background request that cannot be turned into flow entries.

    `unknown_site` is set when the input names a site the plan does not have.
    """

    def __init__(self, message: str, *, unknown_site: str | None = None) -> None:
        super().__init__(message)
        self.unknown_site = unknown_site


@dataclass(frozen=True)
class FlowEntry:
    """One OpenFlow 1.3 entry in table 0: match fields (OXM names), priority, cookie, output port.

    `out_port` None means drop (no instructions). `set_dscp`, when given, rewrites the IP DSCP
    before the output (best-effort entries). `match` is a sorted tuple of (field, value) so that
    entries compare and hash by value.
    """

    dpid: int
    priority: int
    cookie: int
    match: Match
    out_port: int | None
    table_id: int = 0
    set_dscp: int | None = None

    @property
    def match_dict(self) -> dict[str, MatchValue]:
        return dict(self.match)

    def key(self) -> tuple[int, int, int, int, Match, int | None, int | None]:
        """What makes two entries the same entry on a switch (counters aside)."""
        return (self.dpid, self.table_id, self.priority, self.cookie, self.match, self.out_port, self.set_dscp)

    def sort_key(self) -> tuple[int, int, int, int, str, int]:
        """Switch, table, then highest priority first: the order ``ovs-ofctl`` lists them in."""
        return (self.dpid, self.table_id, -self.priority, self.cookie, repr(self.match), self.out_port or -1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "dpid": self.dpid,
            "table_id": self.table_id,
            "priority": self.priority,
            "cookie": self.cookie,
            "match": self.match_dict,
            "actions": self.actions(),
        }

    def actions(self) -> list[dict[str, Any]]:
        """The apply-actions in order, as JSON: a DSCP rewrite (if any) and the output (none: drop)."""
        if self.out_port is None:
            return []
        out: list[dict[str, Any]] = []
        if self.set_dscp is not None:
            out.append({"type": "SET_FIELD", "field": "ip_dscp", "value": self.set_dscp})
        out.append({"type": "OUTPUT", "port": self.out_port})
        return out


# -- small builders -------------------------------------------------------------------------------
def make_match(**fields: MatchValue | None) -> Match:
    """A canonical match from OXM field names (None values are left out)."""
    return tuple(sorted((k, v) for k, v in fields.items() if v is not None))


def ipv4_match(ipv4_src: str, ipv4_dst: str) -> Match:
    """All IPv4 packets from `ipv4_src` to `ipv4_dst`."""
    return make_match(eth_type=ETH_TYPE_IPV4, ipv4_src=ipv4_src, ipv4_dst=ipv4_dst)


def tcp_match(ipv4_src: str, ipv4_dst: str, *, tcp_src: int | None = None, tcp_dst: int | None = None) -> Match:
    """TCP segments from `ipv4_src` to `ipv4_dst`, optionally with a given source/destination port."""
    return make_match(
        eth_type=ETH_TYPE_IPV4,
        ip_proto=IP_PROTO_TCP,
        ipv4_src=ipv4_src,
        ipv4_dst=ipv4_dst,
        tcp_src=tcp_src,
        tcp_dst=tcp_dst,
    )


def table_miss_entry(dpid: int) -> FlowEntry:
    """Drop what nothing else matches (no flooding, no packet-in)."""
    return FlowEntry(dpid=dpid, priority=TABLE_MISS_PRIORITY, cookie=TABLE_MISS_COOKIE, match=(), out_port=None)


def table_miss_entries(plan: EmulationPlan) -> list[FlowEntry]:
    return [table_miss_entry(sw.dpid) for sw in plan.switches]


# -- paths -> entries -----------------------------------------------------------------------------
def path_entries(
    plan: EmulationPlan, path: Sequence[str], match: Match, *, priority: int, cookie: int
) -> list[FlowEntry]:
    """Entries that carry packets matching `match` along the site `path` to the last site's host.

    Raises
    ------
    FlowBuildError
        If the path is shorter than one site, names an unknown site, or hops between two sites that
        have no link.
    """
    if not path:
        raise FlowBuildError("empty path")
    known = {sw.site for sw in plan.switches}
    for site in path:
        if site not in known:
            raise FlowBuildError(f"unknown site {site!r} in path {list(path)}", unknown_site=site)
    entries = []
    for i, site in enumerate(path):
        if i + 1 < len(path):
            try:
                port = plan.port_towards(site, path[i + 1])
            except TopologyError as e:
                raise FlowBuildError(f"path {list(path)}: no link {site}-{path[i + 1]}") from e
        else:
            port = HOST_PORT
        entries.append(
            FlowEntry(dpid=plan.switch(site).dpid, priority=priority, cookie=cookie, match=match, out_port=port)
        )
    return entries


def _host_ip(plan: EmulationPlan, site: str, what: str) -> str:
    if site not in {sw.site for sw in plan.switches}:
        raise FlowBuildError(f"{what}: unknown site {site!r}", unknown_site=site)
    try:
        return plan.host(site).ip
    except TopologyError as e:
        raise FlowBuildError(f"{what}: site {site!r} has no compute host") from e


def edge_entries(plan: EmulationPlan, task_id: int, path: PathSpec) -> list[FlowEntry]:
    """Entries of one path of a task: data along `path.sites`, ACKs along their reverse."""
    what = f"task {task_id} {path.kind or 'path'} {path.src}->{path.dst}"
    if len(path.sites) < 2 or path.sites[0] != path.src or path.sites[-1] != path.dst:
        raise FlowBuildError(f"{what}: path {list(path.sites)} must run from {path.src} to {path.dst}")
    src_ip = _host_ip(plan, path.src, what)
    dst_ip = _host_ip(plan, path.dst, what)
    forward = tcp_match(src_ip, dst_ip, tcp_dst=path.tcp_dst)
    reverse = tcp_match(dst_ip, src_ip, tcp_src=path.tcp_dst)
    return [
        *path_entries(plan, path.sites, forward, priority=TASK_PRIORITY, cookie=task_id),
        *path_entries(plan, tuple(reversed(path.sites)), reverse, priority=TASK_PRIORITY, cookie=task_id),
    ]


def task_entries(task: TaskPaths, plan: EmulationPlan) -> list[FlowEntry]:
    """All flow entries of a task's paths, sorted, without duplicates.

    Raises
    ------
    FlowBuildError
        If a path names an unknown site or a site without a host, does not follow the plan's
        links, or two paths would need different output ports for the same packets on one switch.
    """
    seen: dict[tuple[int, Match], FlowEntry] = {}
    for path in task.paths:
        for entry in edge_entries(plan, task.task_id, path):
            slot = (entry.dpid, entry.match)
            other = seen.get(slot)
            if other is not None and other.out_port != entry.out_port:
                raise FlowBuildError(
                    f"task {task.task_id}: paths disagree on switch dpid {entry.dpid} for "
                    f"{entry.match_dict} (ports {other.out_port} and {entry.out_port})"
                )
            seen[slot] = entry
    return sorted(seen.values(), key=FlowEntry.sort_key)


def shortest_site_path(plan: EmulationPlan, a: str, b: str) -> list[str]:
    """A fewest-hops path from site `a` to site `b`, deterministic for a given plan (`controller.hops`)."""
    try:
        return shortest_path(plan, a, b)
    except NoPath as e:
        raise FlowBuildError(f"no path between {a!r} and {b!r}: {e}") from e


def normalize_pairs(pairs: Iterable[Sequence[str]]) -> list[tuple[str, str]]:
    """Unordered host pairs as sorted tuples, deduplicated, in first-seen order."""
    out: dict[tuple[str, str], None] = {}
    for pair in pairs:
        if not isinstance(pair, list | tuple) or len(pair) != 2 or not all(isinstance(s, str) and s for s in pair):
            raise FlowBuildError(f"a background pair must be two site names, got {pair!r}")
        a, b = pair
        if a == b:
            raise FlowBuildError(f"a background pair must join two different sites, got {a!r} twice")
        out[(min(a, b), max(a, b))] = None
    return list(out)


def background_entries(plan: EmulationPlan, pairs: Iterable[Sequence[str]]) -> list[FlowEntry]:
    """Shortest-path IPv4 entries (both directions, one path) for each background host pair.

    Raises
    ------
    FlowBuildError
        On a malformed pair, an unknown site or a site without a host.
    """
    entries: dict[tuple[int, Match], FlowEntry] = {}
    for a, b in normalize_pairs(pairs):
        ip_a = _host_ip(plan, a, "background pair")
        ip_b = _host_ip(plan, b, "background pair")
        path = shortest_site_path(plan, a, b)
        for entry in (
            *path_entries(plan, path, ipv4_match(ip_a, ip_b), priority=BACKGROUND_PRIORITY, cookie=BACKGROUND_COOKIE),
            *path_entries(
                plan, path[::-1], ipv4_match(ip_b, ip_a), priority=BACKGROUND_PRIORITY, cookie=BACKGROUND_COOKIE
            ),
        ):
            entries[(entry.dpid, entry.match)] = entry
    return sorted(entries.values(), key=FlowEntry.sort_key)


def best_effort_entries(plan: EmulationPlan) -> list[FlowEntry]:
    """Best-effort connectivity between every pair of hosts (see the module docstring).

    On every switch, one entry per destination host: IPv4 to its address, DSCP set to
    `LOWER_EFFORT_DSCP`, out towards it along a fewest-hops tree rooted at its site (the host port
    on its own switch). A switch that cannot reach a host (a disconnected plan) gets no entry for it.
    """
    entries = []
    neighbours = site_neighbours(plan)
    for host in plan.hosts:
        # One breadth-first tree per destination: each switch's next hop continues its parent's route.
        towards = next_hops_towards(plan, host.site, neighbours=neighbours)
        match = make_match(eth_type=ETH_TYPE_IPV4, ipv4_dst=host.ip)
        for site, hop in towards.items():
            port = HOST_PORT if hop is None else plan.port_towards(site, hop)
            entries.append(FlowEntry(dpid=plan.switch(site).dpid, priority=BEST_EFFORT_PRIORITY,
                                     cookie=BEST_EFFORT_COOKIE, match=match, out_port=port,
                                     set_dscp=LOWER_EFFORT_DSCP))
    return sorted(entries, key=FlowEntry.sort_key)


def entry_kind(cookie: int) -> str:
    """What installed an entry, from its cookie: ``task``, ``background``, ``best-effort`` or ``table-miss``."""
    if cookie == TABLE_MISS_COOKIE:
        return "table-miss"
    if cookie == BACKGROUND_COOKIE:
        return "background"
    if cookie == BEST_EFFORT_COOKIE:
        return "best-effort"
    return "task" if 0 < cookie < BACKGROUND_COOKIE else "other"


def by_dpid(entries: Iterable[FlowEntry]) -> dict[int, list[FlowEntry]]:
    out: dict[int, list[FlowEntry]] = {}
    for e in entries:
        out.setdefault(e.dpid, []).append(e)
    return out


# -- reading entries back -------------------------------------------------------------------------
#: ovs-ofctl's names for OXM fields, and the shorthand protocol words it prints.
_OFCTL_FIELDS: Mapping[str, str] = {
    "nw_src": "ipv4_src",
    "nw_dst": "ipv4_dst",
    "tp_src": "tcp_src",
    "tp_dst": "tcp_dst",
    "tcp_src": "tcp_src",
    "tcp_dst": "tcp_dst",
    "in_port": "in_port",
    "dl_type": "eth_type",
    "nw_proto": "ip_proto",
    "ip_proto": "ip_proto",
    "ipv4_src": "ipv4_src",
    "ipv4_dst": "ipv4_dst",
}
_OFCTL_SHORTHANDS: Mapping[str, Mapping[str, int]] = {
    "ip": {"eth_type": ETH_TYPE_IPV4},
    "tcp": {"eth_type": ETH_TYPE_IPV4, "ip_proto": IP_PROTO_TCP},
    "arp": {"eth_type": 0x0806},
}
_SKIP_FIELDS = frozenset({"cookie", "duration", "table", "n_packets", "n_bytes", "idle_age", "hard_age",
                          "idle_timeout", "hard_timeout", "priority", "reset_counts", "send_flow_rem"})
_OUTPUT_RE = re.compile(r"^(?:output:)?(\d+)$")
#: A DSCP rewrite as ovs-ofctl prints it: an OpenFlow 1.2+ set-field (DSCP, or the TOS byte), or the
#: OpenFlow 1.0 form (the TOS byte).
_SET_DSCP_RE = re.compile(r"^(?:set_field:(0x[0-9a-fA-F]+|\d+)->(ip_dscp|nw_tos)|mod_nw_tos:(\d+))$")


def _int(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def parse_ofctl_line(dpid: int, line: str) -> FlowEntry | None:
    """One line of ``ovs-ofctl -O OpenFlow13 dump-flows`` as a `FlowEntry` (None for a non-flow line).

    Raises
    ------
    ValueError
        On actions other than drop, a single output, or a DSCP rewrite and an output (the project
        installs no others).
    """
    line = line.strip()
    if "actions=" not in line:
        return None
    head, actions = line.split("actions=", 1)
    tokens = [t.strip() for t in head.replace(" ", ",").split(",") if t.strip()]
    cookie, table_id, priority = 0, 0, 32768
    fields: dict[str, MatchValue] = {}
    for tok in tokens:
        key, sep, value = tok.partition("=")
        if not sep:
            if key in _OFCTL_SHORTHANDS:
                fields.update(_OFCTL_SHORTHANDS[key])
                continue
            raise ValueError(f"unknown match word {key!r} in {line!r}")
        if key == "cookie":
            cookie = _int(value)
        elif key == "table":
            table_id = int(value)
        elif key == "priority":
            priority = int(value)
        elif key in _SKIP_FIELDS:
            continue
        elif key in _OFCTL_FIELDS:
            name = _OFCTL_FIELDS[key]
            fields[name] = value if name in {"ipv4_src", "ipv4_dst"} else _int(value)
        else:
            raise ValueError(f"unknown match field {key!r} in {line!r}")
    out_port, set_dscp = _parse_actions(actions.strip(), line)
    return FlowEntry(
        dpid=dpid, priority=priority, cookie=cookie, match=make_match(**fields), out_port=out_port, table_id=table_id,
        set_dscp=set_dscp,
    )


def _parse_actions(actions: str, line: str) -> tuple[int | None, int | None]:
    """(output port, DSCP set) of an ``actions=`` value: drop, an output, or a DSCP rewrite then an output."""
    if actions in ("drop", ""):
        return None, None
    *rewrites, last = actions.split(",")
    m = _OUTPUT_RE.match(last)
    if not m or len(rewrites) > 1:
        raise ValueError(f"unexpected actions {actions!r} in {line!r}")
    set_dscp = None
    if rewrites:
        d = _SET_DSCP_RE.match(rewrites[0])
        if not d:
            raise ValueError(f"unexpected actions {actions!r} in {line!r}")
        if d.group(3) is not None:
            set_dscp = int(d.group(3)) >> 2
        else:
            value = _int(d.group(1))
            set_dscp = value if d.group(2) == "ip_dscp" else value >> 2
    return int(m.group(1)), set_dscp


def parse_ofctl_dump(dpid: int, text: str) -> list[FlowEntry]:
    """All flow entries in the text of ``ovs-ofctl -O OpenFlow13 dump-flows SWITCH``, sorted."""
    entries = [e for line in text.splitlines() if (e := parse_ofctl_line(dpid, line)) is not None]
    return sorted(entries, key=FlowEntry.sort_key)


def diff_entries(expected: Iterable[FlowEntry], actual: Iterable[FlowEntry]) -> dict[str, list[FlowEntry]]:
    """Entries only expected (`missing`) and only present (`unexpected`), compared by `FlowEntry.key`."""
    exp = {e.key(): e for e in expected}
    act = {e.key(): e for e in actual}
    return {
        "missing": sorted((exp[k] for k in exp.keys() - act.keys()), key=FlowEntry.sort_key),
        "unexpected": sorted((act[k] for k in act.keys() - exp.keys()), key=FlowEntry.sort_key),
    }
