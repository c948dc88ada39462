"""Pure builders of the tc datapath: `FlowEntry` values as ``tc`` filters, and filters read back.

Where the kernel has no openvswitch module, a switch can forward in the kernel with no Open vSwitch
at all: each switch is its ports (veths, in the namespace the controller runs in), whose ingress
qdiscs share one filter block, numbered by the switch's datapath id (``tc qdisc add dev PORT
ingress_block DPID ingress``). A flow entry is one ``u32`` filter in that block: its match (IPv4
source and destination, IP protocol, TCP ports) as u32 keys, its output as ``mirred egress redirect``
to the port's interface, its cookie as the action's cookie. The filters of one cookie share one
preference (`pref_of`), so removing a task is one ``tc filter del block DPID pref P``, and a higher
OpenFlow priority is a lower preference: tasks (`TASK_PREFS`), then background (`BACKGROUND_PREF`),
then best-effort connectivity (`BEST_EFFORT_PREF`).

What differs from OpenFlow, by what this kernel has (``act_mirred`` but no ``act_gact``, ``act_pedit``
or ``act_skbedit``):

- **Drop.** A packet no filter redirects goes on into the switch ports' own namespace, where it is
  addressed to no interface (its destination MAC is an emulated host's) and is dropped: the table-miss
  entry is the datapath's default, not a filter, and has no counters (`installable`).
- **Lower Effort.** Best-effort entries cannot rewrite the DSCP. Their packets go to the links'
  lowest class all the same: on the tc datapath the htb default class is best effort
  (`controller.htb.BEST_EFFORT_CLASS`), and the background's packets, which OpenFlow leaves to the
  default, are classified by a filter per host pair on each link they leave by
  (`background_class_filter`, preference `controller.htb.BACKGROUND_FILTER_PRIO`, after every task's).
  Read back, a best-effort entry has no DSCP rewrite: it is what the kernel holds.

This module does no I/O; `controller.tc_datapath` runs the commands.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from controller.flows import (
    BACKGROUND_PRIORITY,
    BEST_EFFORT_PRIORITY,
    ETH_TYPE_IPV4,
    TASK_PRIORITY,
    FlowEntry,
    MatchValue,
    make_match,
)
from controller.htb import BACKGROUND_CLASS, BACKGROUND_FILTER_PRIO, ROOT_MAJOR, classid, interface_switch
from controller.southbound import FlowStat

#: The preferences of tasks' filters (one per task, the same on every switch), then the background's
#: and best-effort connectivity's: a lower preference is looked at first.
TASK_PREFS = range(0x100, 0xF000)
BACKGROUND_PREF = 0xF000
BEST_EFFORT_PREF = 0xF800

#: u32 keys: (offset in the IP header, mask) of each match field.
_U32_FIELDS = {
    "ipv4_src": (12, 0xFFFFFFFF),
    "ipv4_dst": (16, 0xFFFFFFFF),
    "ip_proto": (8, 0x00FF0000),
    "tcp_src": (20, 0xFFFF0000),
    "tcp_dst": (20, 0x0000FFFF),
}


class TcFlowError(ValueError):
    """An entry the tc datapath cannot hold (a match field or a priority it has no filter for)."""


def installable(entry: FlowEntry) -> bool:
    """Whether `entry` becomes a filter: every entry with an output. A drop (the table-miss entry)
    is the datapath's default (see the module docstring)."""
    return entry.out_port is not None


def port_device(switch: str, port: int) -> str:
    """The interface of a switch port: Mininet's ``<switch>-eth<port>``."""
    return f"{switch}-eth{port}"


def device_port(switch: str, device: str) -> int | None:
    """The port number of `device` on `switch` (None if it is not one of its ports)."""
    head, sep, tail = device.rpartition("-eth")
    return int(tail) if sep and head == switch and tail.isdigit() else None


def cookie_hex(cookie: int) -> str:
    """An entry's cookie as a tc action cookie (8 bytes, hex)."""
    return f"{cookie:016x}"


def fixed_pref(priority: int) -> int | None:
    """The preference of entries of `priority` that all share one (background, best effort); None
    for tasks, whose preference is allocated per cookie (`PrefBook`)."""
    if priority == TASK_PRIORITY:
        return None
    if priority == BACKGROUND_PRIORITY:
        return BACKGROUND_PREF
    if priority == BEST_EFFORT_PRIORITY:
        return BEST_EFFORT_PREF
    raise TcFlowError(f"the tc datapath has no preference for OpenFlow priority {priority}")


def priority_of_pref(pref: int) -> int:
    """The OpenFlow priority a filter's preference stands for (the inverse of `fixed_pref`/`PrefBook`)."""
    if pref == BACKGROUND_PREF:
        return BACKGROUND_PRIORITY
    if pref == BEST_EFFORT_PREF:
        return BEST_EFFORT_PRIORITY
    if pref in TASK_PREFS:
        return TASK_PRIORITY
    raise TcFlowError(f"preference {pref:#x} is not one the tc datapath gives")


class PrefBook:
    """Which preference each cookie's filters have: fixed for background and best effort, the lowest
    free one in `TASK_PREFS` for a task (the same on every switch, freed when no switch holds it)."""

    def __init__(self) -> None:
        self._task: dict[int, int] = {}
        self._holders: dict[int, set[int]] = {}

    def pref(self, entry: FlowEntry) -> int:
        fixed = fixed_pref(entry.priority)
        if fixed is not None:
            return fixed
        pref = self._task.get(entry.cookie)
        if pref is None:
            used = set(self._task.values())
            pref = next((p for p in TASK_PREFS if p not in used), None)
            if pref is None:
                raise TcFlowError(f"no free filter preference for task {entry.cookie}")
            self._task[entry.cookie] = pref
        self._holders.setdefault(entry.cookie, set()).add(entry.dpid)
        return pref

    def task_pref(self, cookie: int) -> int | None:
        return self._task.get(cookie)

    def release(self, dpid: int, cookie: int) -> None:
        holders = self._holders.get(cookie)
        if holders is None:
            return
        holders.discard(dpid)
        if not holders:
            del self._holders[cookie]
            self._task.pop(cookie, None)

    def release_switch(self, dpid: int) -> None:
        for cookie in list(self._holders):
            self.release(dpid, cookie)


def match_args(entry: FlowEntry) -> list[str]:
    """The u32 keys of an entry's match (IPv4 only: the project matches nothing else)."""
    m = entry.match_dict
    if m.get("eth_type", ETH_TYPE_IPV4) != ETH_TYPE_IPV4:
        raise TcFlowError(f"the tc datapath matches IPv4 only, not {m}")
    unknown = set(m) - {"eth_type", *_U32_FIELDS}
    if unknown:
        raise TcFlowError(f"the tc datapath cannot match {sorted(unknown)}")
    args: list[str] = []
    for name, word in (("ipv4_src", "src"), ("ipv4_dst", "dst")):
        if name in m:
            args += ["match", "ip", word, f"{m[name]}/32"]
    if "ip_proto" in m:
        args += ["match", "ip", "protocol", str(m["ip_proto"]), "0xff"]
    for name, word in (("tcp_src", "sport"), ("tcp_dst", "dport")):
        if name in m:
            args += ["match", "ip", word, str(m[name]), "0xffff"]
    return args or ["match", "u32", "0", "0"]


def filter_add(block: int, pref: int, entry: FlowEntry, out_device: str) -> list[str]:
    """``tc filter add`` (without ``tc``) of one entry in switch block `block`."""
    return ["filter", "add", "block", str(block), "protocol", "ip", "pref", str(pref), "u32", *match_args(entry),
            "action", "mirred", "egress", "redirect", "dev", out_device, "cookie", cookie_hex(entry.cookie)]


def filter_del(block: int, pref: int) -> list[str]:
    """Remove every filter of preference `pref` from block `block`."""
    return ["filter", "del", "block", str(block), "protocol", "ip", "pref", str(pref)]


def block_flush(block: int) -> list[str]:
    return ["filter", "del", "block", str(block)]


def background_class_filter(device: str, entry: FlowEntry) -> list[str]:
    """The egress filter that puts a background entry's packets in the background class on the
    shaped link they leave by (see the module docstring)."""
    m = entry.match_dict
    return ["filter", "add", "dev", device, "parent", f"{ROOT_MAJOR}:0", "protocol", "ip", "pref",
            str(BACKGROUND_FILTER_PRIO), "u32", "match", "ip", "src", f"{m['ipv4_src']}/32", "match", "ip", "dst",
            f"{m['ipv4_dst']}/32", "flowid", classid(BACKGROUND_CLASS)]


def background_class_del(device: str) -> list[str]:
    return ["filter", "del", "dev", device, "parent", f"{ROOT_MAJOR}:0", "protocol", "ip", "pref",
            str(BACKGROUND_FILTER_PRIO)]


# -- reading back ---------------------------------------------------------------------------------
_HEAD_RE = re.compile(r"^filter .*?(?:\bpref (\d+) )?u32 .*\bfh ([0-9a-f]+:[0-9a-f]*:[0-9a-f]+)\b")
_KEY_RE = re.compile(r"^match ([0-9a-f]{8})/([0-9a-f]{8}) at (\d+)$")
_DEV_RE = re.compile(r"mirred \(Egress Redirect to device (\S+)\)")
_SENT_RE = re.compile(r"^Sent (\d+) bytes (\d+) pkt")
_INSTALLED_RE = re.compile(r"installed (\d+) sec")
_COOKIE_RE = re.compile(r"^cookie ([0-9a-f]+)$")


@dataclass
class _Filter:
    pref: int
    keys: list[tuple[int, int, int]]
    device: str | None = None
    bytes: int = 0
    packets: int = 0
    installed_s: float = 0.0
    cookie: int | None = None


def _filters(text: str, pref: int | None = None) -> list[_Filter]:
    """The u32 filter nodes (not hash-table headers) of ``tc -s filter show`` text (shown for one
    preference, `pref`, tc leaves it out of each line)."""
    out: list[_Filter] = []
    cur: _Filter | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("filter "):
            head = _HEAD_RE.match(line)
            shown = int(head.group(1)) if head and head.group(1) else pref
            cur = _Filter(pref=shown, keys=[]) if head and shown is not None else None
            if cur is not None:
                out.append(cur)
            continue
        if cur is None:
            continue
        if k := _KEY_RE.match(line):
            cur.keys.append((int(k.group(1), 16), int(k.group(2), 16), int(k.group(3))))
        elif d := _DEV_RE.search(line):
            cur.device = d.group(1)
        elif s := _SENT_RE.match(line):
            cur.bytes, cur.packets = int(s.group(1)), int(s.group(2))
        elif c := _COOKIE_RE.match(line):
            cur.cookie = int(c.group(1), 16)
        if i := _INSTALLED_RE.search(line):
            cur.installed_s = float(i.group(1))
    return out


def _ipv4(word: int) -> str:
    return ".".join(str((word >> s) & 0xFF) for s in (24, 16, 8, 0))


def match_of_keys(keys: Iterable[tuple[int, int, int]]) -> dict[str, MatchValue]:
    """Match fields from u32 keys (value, mask, offset); unknown keys raise `TcFlowError`."""
    fields: dict[str, MatchValue] = {"eth_type": ETH_TYPE_IPV4}
    for value, mask, off in keys:
        if mask == 0:
            continue
        found = False
        for name, (f_off, f_mask) in _U32_FIELDS.items():
            if off == f_off and mask & f_mask:
                if mask & f_mask != f_mask:
                    raise TcFlowError(f"partial u32 key {value:08x}/{mask:08x} at {off}")
                shift = (f_mask & -f_mask).bit_length() - 1
                v = (value & f_mask) >> shift
                fields[name] = _ipv4(v) if name.startswith("ipv4") else v
                found = True
        if not found:
            raise TcFlowError(f"u32 key {value:08x}/{mask:08x} at {off} is no field the project matches")
    return fields


def parse_block(dpid: int, switch: str, text: str, cookie: int | None = None, *,
                pref: int | None = None) -> list[FlowStat]:
    """The entries of switch `switch` (block `dpid`) as ``tc -s filter show block DPID [pref P]``
    lists them (`pref`: the P shown), with their counters; only those of `cookie` when given. A
    filter that redirects elsewhere than one of the switch's ports raises `TcFlowError`."""
    return parse_blocks({switch: dpid}, text, cookie, pref=pref)[dpid]


def parse_blocks(dpids: dict[str, int], text: str, cookie: int | None = None, *,
                 pref: int | None = None, read_s: float | None = None) -> dict[int, list[FlowStat]]:
    """`parse_block` of several switches' blocks shown one after another (``tc -s -batch`` of one
    ``filter show block N [pref P]`` each): every filter goes to the switch `dpids` (name -> datapath
    id) whose port it redirects to, its counters stamped `read_s` (`FlowStat.read_s`). A filter
    redirecting to no such switch's port raises `TcFlowError`."""
    out: dict[int, list[FlowStat]] = {dpid: [] for dpid in dpids.values()}
    for f in _filters(text, pref):
        if f.cookie is None or (cookie is not None and f.cookie != cookie):
            continue
        switch = interface_switch(f.device or "")
        port = device_port(switch, f.device or "")
        if switch not in dpids or port is None:
            raise TcFlowError(f"a filter redirects to {f.device!r}, not one of its ports: no port of the "
                              f"switches read ({', '.join(dpids)})")
        entry = FlowEntry(dpid=dpids[switch], priority=priority_of_pref(f.pref), cookie=f.cookie,
                          match=make_match(**match_of_keys(f.keys)), out_port=port)
        out[dpids[switch]].append(FlowStat(entry=entry, packets=f.packets, bytes=f.bytes, duration_s=f.installed_s,
                                               read_s=read_s))
    return {d: sorted(v, key=lambda s: s.entry.sort_key()) for d, v in out.items()}


def as_installed(entry: FlowEntry) -> FlowEntry | None:
    """What reading `entry` back from the tc datapath gives: None for a drop, no DSCP rewrite."""
    if not installable(entry):
        return None
    return FlowEntry(dpid=entry.dpid, priority=entry.priority, cookie=entry.cookie, match=entry.match,
                     out_port=entry.out_port, table_id=entry.table_id)



#: The environment variable the emulation starts the controller with to name its southbound:
#: ``openflow`` (the default: Open vSwitch over OpenFlow) or ``tc`` (this datapath).
ENV_DATAPATH = "NETAI_DATAPATH"
OPENFLOW = "openflow"
TC = "tc"
SOUTHBOUNDS = (OPENFLOW, TC)
