"""Pure flow logic: a task's `TaskPaths` (or a list of background host pairs) + an `EmulationPlan` -> flow entries.

Every path ``src -> dst`` of a task becomes, on each switch along its sites, one entry that matches
the path's TCP segments (IPv4 src/dst of the two hosts + the path's destination TCP port) and
outputs towards the next site (the host port on the last switch). The ACK direction (``dst -> src``
with that port as TCP *source* port) follows the reverse of the same path. The cookie of a task's entries is the task
id, so flow statistics and deletion select a task by cookie.

Background traffic between two hosts gets IPv4 src/dst entries along a shortest path (fewest hops,
ties broken by the plan's link order) at a lower priority, in both directions. A table-miss entry
drops everything else: ARP is static, so nothing floods, and a host pair with no route is isolated.

This module does no I/O and knows nothing of OpenFlow libraries: it returns `FlowEntry` values; the
SDN app turns them into messages (`controller.app`) and `parse_ofctl_dump` reads them back from
``ovs-ofctl dump-flows`` text for comparison.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx

from controller.paths import PathSpec, TaskPaths
from topologies.errors import TopologyError
from topologies.plan import HOST_PORT, EmulationPlan

ETH_TYPE_IPV4 = 0x0800
IP_PROTO_TCP = 6

#: Priorities: task paths win over background routes; the table-miss entry drops the rest.
TASK_PRIORITY = 200
BACKGROUND_PRIORITY = 100
TABLE_MISS_PRIORITY = 0

#: Cookies outside the task-id range (task ids are positive and below 2**63).
TABLE_MISS_COOKIE = 0
BACKGROUND_COOKIE = 1 << 63
COOKIE_MASK_ALL = (1 << 64) - 1

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

    `out_port` None means drop (no instructions). `match` is a sorted tuple of (field, value) so
    that entries compare and hash by value.
    """

    dpid: int
    priority: int
    cookie: int
    match: Match
    out_port: int | None
    table_id: int = 0

    @property
    def match_dict(self) -> dict[str, MatchValue]:
        return dict(self.match)

    def key(self) -> tuple[int, int, int, int, Match, int | None]:
        """What makes two entries the same entry on a switch (counters aside)."""
        return (self.dpid, self.table_id, self.priority, self.cookie, self.match, self.out_port)

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
            "actions": [] if self.out_port is None else [{"type": "OUTPUT", "port": self.out_port}],
        }


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


def plan_graph(plan: EmulationPlan) -> nx.Graph:
    """The plan's sites and links as a graph (insertion order = the plan's order)."""
    g: nx.Graph = nx.Graph()
    g.add_nodes_from(sw.site for sw in plan.switches)
    g.add_edges_from((ln.a, ln.b) for ln in plan.links)
    return g


def shortest_site_path(plan: EmulationPlan, a: str, b: str) -> list[str]:
    """A fewest-hops path from site `a` to site `b` (deterministic for a given plan)."""
    try:
        return list(nx.shortest_path(plan_graph(plan), a, b))
    except (nx.NodeNotFound, nx.NetworkXNoPath) as e:
        raise FlowBuildError(f"no path between {a!r} and {b!r}: {e}") from e


def normalize_pairs(pairs: Iterable[Sequence[str]]) -> list[tuple[str, str]]:
    """Unordered host pairs as sorted tuples, deduplicated, in first-seen order."""
    out: dict[tuple[str, str], None] = {}
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(s, str) and s for s in pair):
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


def _int(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def parse_ofctl_line(dpid: int, line: str) -> FlowEntry | None:
    """One line of ``ovs-ofctl -O OpenFlow13 dump-flows`` as a `FlowEntry` (None for a non-flow line).

    Raises
    ------
    ValueError
        On an action other than a single output or drop (the project installs no others).
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
    actions = actions.strip()
    if actions == "drop" or actions == "":
        out_port = None
    else:
        m = _OUTPUT_RE.match(actions)
        if not m:
            raise ValueError(f"unexpected actions {actions!r} in {line!r}")
        out_port = int(m.group(1))
    return FlowEntry(
        dpid=dpid, priority=priority, cookie=cookie, match=make_match(**fields), out_port=out_port, table_id=table_id
    )


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
