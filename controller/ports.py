"""What the controller knows of the switches' ports: their names in the plan, their state and their rates.

`PortBook` keeps the port-status changes the switches report (for ``/topology``) and the port
counters the app polls (for ``/stats/links``: bytes so far, current rate, utilisation of the
shaped rate). The functions name a datapath id or a port the way the API shows them (switch name,
site, the link a port belongs to), from the plan alone.

It holds no lock: `controller.core.ControllerCore` calls it under its own. It must not import the
OpenFlow framework.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.southbound import PortStat
from topologies.plan import HOST_PORT, EmulationPlan

#: How many port-status events the controller keeps for the API.
PORT_EVENT_HISTORY = 1000


def switch_name(plan: EmulationPlan, dpid: int) -> str:
    for sw in plan.switches:
        if sw.dpid == dpid:
            return sw.name
    return f"dpid{dpid}"


def site_name(plan: EmulationPlan, dpid: int) -> str | None:
    for sw in plan.switches:
        if sw.dpid == dpid:
            return sw.site
    return None


def link_of(plan: EmulationPlan, dpid: int, port: int) -> list[str] | None:
    """[this site, the far site] of the link on `port` of switch `dpid` ([site, "host"] for the host port)."""
    site = site_name(plan, dpid)
    if site is None:
        return None
    if port == HOST_PORT:
        return [site, "host"]
    for ln in plan.links:
        if ln.a == site and ln.port_a == port:
            return [ln.a, ln.b]
        if ln.b == site and ln.port_b == port:
            return [ln.b, ln.a]
    return None


@dataclass
class _PortSample:
    t_s: float
    tx_bytes: int
    rx_bytes: int


@dataclass
class _PortCounters:
    last: _PortSample | None = None
    rate_tx_mbps: float = 0.0
    rate_rx_mbps: float = 0.0


class PortBook:
    """Port states (from port-status events) and counters (from port stats) of one plan's switches."""

    def __init__(self, plan: EmulationPlan) -> None:
        self.plan = plan
        self.up: dict[tuple[int, int], bool] = {}
        self.events: deque[dict[str, Any]] = deque(maxlen=PORT_EVENT_HISTORY)
        self._counters: dict[tuple[int, int], _PortCounters] = {}

    def record_status(self, t_s: float, dpid: int, port_no: int, reason: str, link_down: bool) -> None:
        """Keep a port-status change (added/deleted/modified, link up/down) at `t_s` for the API."""
        up = reason != "delete" and not link_down
        self.up[(dpid, port_no)] = up
        self.events.append(
            {
                "t_s": t_s,
                "dpid": dpid,
                "switch": switch_name(self.plan, dpid),
                "port": port_no,
                "reason": reason,
                "up": up,
                "link": link_of(self.plan, dpid, port_no),
            }
        )

    def record_stats(self, dpid: int, stats: Iterable[PortStat], now: float) -> None:
        """Update port counters and current rates (from the previous sample of each port)."""
        for st in stats:
            c = self._counters.setdefault((dpid, st.port_no), _PortCounters())
            sample = _PortSample(t_s=now, tx_bytes=st.tx_bytes, rx_bytes=st.rx_bytes)
            if c.last is not None and now > c.last.t_s:
                dt = now - c.last.t_s
                c.rate_tx_mbps = max(0, st.tx_bytes - c.last.tx_bytes) * 8 / dt / 1e6
                c.rate_rx_mbps = max(0, st.rx_bytes - c.last.rx_bytes) * 8 / dt / 1e6
            c.last = sample

    def link_stats(self, fresh: Mapping[tuple[int, int], tuple[int, float]] | None = None) -> list[dict[str, Any]]:
        """Per directed link: bytes sent so far (``tx_bytes``) and when they were read (``read_s``; None:
        never), current rate and utilisation of the shaped rate. `fresh`: (dpid, port) -> (bytes, read
        time) just read, in place of the last poll's bytes (the rates stay the polls')."""
        rows = []
        for ln in self.plan.links:
            for src, dst, port in ((ln.a, ln.b, ln.port_a), (ln.b, ln.a, ln.port_b)):
                dpid = self.plan.switch(src).dpid
                c = self._counters.get((dpid, port))
                rate = c.rate_tx_mbps if c else 0.0
                polled = (c.last.tx_bytes, c.last.t_s) if c and c.last else (0, None)
                tx_bytes, read_s = (fresh or {}).get((dpid, port), polled)
                rows.append(
                    {
                        "link": [src, dst],
                        "switch": switch_name(self.plan, dpid),
                        "port": port,
                        "tx_bytes": tx_bytes,
                        "read_s": read_s,
                        "rate_mbps": round(rate, 3),
                        "emulated_mbps": ln.emulated_mbps,
                        "utilisation": round(rate / ln.emulated_mbps, 4) if ln.emulated_mbps else 0.0,
                        "up": self.up.get((dpid, port), True),
                    }
                )
        return rows

    def ports_down(self) -> list[dict[str, Any]]:
        return [
            {"switch": switch_name(self.plan, d), "port": p, "link": link_of(self.plan, d, p)}
            for (d, p), up in sorted(self.up.items())
            if not up
        ]
