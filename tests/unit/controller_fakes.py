"""A fake OpenFlow network for controller unit tests: flow tables that forward simulated packets.

`FakeSwitches` implements `controller.southbound.FlowSender`: `install` behaves like OFPFC_ADD (an entry
with the same priority and match replaces the old one), `remove_cookie` like a strict-cookie
OFPFC_DELETE, and `send` walks a packet through the tables hop by hop (using the plan's ports),
counting packets and bytes per entry like a switch does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from controller.errors import Unavailable
from controller.flows import FlowEntry
from controller.southbound import FlowStat, PortStat
from orchestrator.scheduling.schedule import OverlayEdge, Schedule
from topologies.plan import HOST_PORT, EmulationPlan


@dataclass
class _Slot:
    entry: FlowEntry
    packets: int = 0
    bytes: int = 0


@dataclass
class FakeSwitches:
    plan: EmulationPlan
    connected: set[int] = field(default_factory=set)
    tables: dict[int, list[_Slot]] = field(default_factory=dict)
    calls: list[tuple[str, int]] = field(default_factory=list)
    #: (dpid, port) -> the bytes that port has sent (what `port_stats` reports).
    port_bytes: dict[tuple[int, int], int] = field(default_factory=dict)

    def connect_all(self) -> None:
        self.connected = {sw.dpid for sw in self.plan.switches}

    def _check(self, dpid: int) -> None:
        if dpid not in self.connected:
            raise Unavailable(f"dpid {dpid} not connected")

    # -- FlowSender ------------------------------------------------------------------------------
    def install(self, dpid: int, entries: Sequence[FlowEntry]) -> None:
        self._check(dpid)
        self.calls.append(("install", dpid))
        table = self.tables.setdefault(dpid, [])
        for e in entries:
            table[:] = [s for s in table if (s.entry.priority, s.entry.match) != (e.priority, e.match)]
            table.append(_Slot(e))

    def remove_cookie(self, dpid: int, cookie: int) -> None:
        self._check(dpid)
        self.calls.append(("remove", dpid))
        self.tables[dpid] = [s for s in self.tables.get(dpid, []) if s.entry.cookie != cookie]

    def flow_stats(self, dpid: int, cookie: int | None) -> list[FlowStat]:
        self._check(dpid)
        return [
            FlowStat(entry=s.entry, packets=s.packets, bytes=s.bytes, duration_s=1.0)
            for s in self.tables.get(dpid, [])
            if cookie is None or s.entry.cookie == cookie
        ]

    def port_stats(self, dpid: int) -> list[PortStat]:
        self._check(dpid)
        return [PortStat(port_no=port, rx_bytes=0, tx_bytes=n, rx_packets=0, tx_packets=0)
                for (d, port), n in sorted(self.port_bytes.items()) if d == dpid]

    # -- simulation ------------------------------------------------------------------------------
    def entries(self, dpid: int) -> list[FlowEntry]:
        return sorted((s.entry for s in self.tables.get(dpid, [])), key=FlowEntry.sort_key)

    def send(
        self, src_site: str, dst_ip: str, *, tcp_src: int, tcp_dst: int, nbytes: int = 100
    ) -> list[str] | None:
        """Sites a TCP packet from `src_site`'s host visits until a host port; None if dropped."""
        packet = {
            "eth_type": 0x0800,
            "ip_proto": 6,
            "ipv4_src": self.plan.host(src_site).ip,
            "ipv4_dst": dst_ip,
            "tcp_src": tcp_src,
            "tcp_dst": tcp_dst,
        }
        site, visited = src_site, [src_site]
        for _ in range(len(self.plan.switches) + 1):
            dpid = self.plan.switch(site).dpid
            hits = [s for s in self.tables.get(dpid, []) if all(packet.get(k) == v for k, v in s.entry.match)]
            if not hits:
                return None
            slot = max(hits, key=lambda s: s.entry.priority)
            slot.packets += 1
            slot.bytes += nbytes
            port = slot.entry.out_port
            if port is None:
                return None
            if port == HOST_PORT:
                return visited
            site = next(
                (ln.b if ln.a == site else ln.a)
                for ln in self.plan.links
                if (ln.a == site and ln.port_a == port) or (ln.b == site and ln.port_b == port)
            )
            visited.append(site)
        raise AssertionError(f"forwarding loop from {src_site}: {visited}")


def handmade_schedule(plan: EmulationPlan, task_id: int = 7) -> Schedule:
    """A two-local tree on the triangle A, B, C: G=A; broadcast A->B->C; upload C->A, B->A.

    The broadcast edge B->C and the upload edge C->A take different physical paths (B-C direct,
    and C->B->A) to exercise port-based matching.
    """
    edges = (
        OverlayEdge("broadcast", "A", "B", ("A", "B")),
        OverlayEdge("broadcast", "B", "C", ("B", "C")),
        OverlayEdge("upload", "C", "A", ("C", "B", "A")),
        OverlayEdge("upload", "B", "A", ("B", "A")),
    )
    return Schedule(
        task_id=task_id,
        scheduler="handmade",
        global_site="A",
        local_sites=("B", "C"),
        demand_mbps=10.0,
        broadcast_parent={"B": "A", "C": "B"},
        upload_parent={"C": "A", "B": "A"},
        edges=edges,
    )
