"""Live load of every emulated link, split into AI (task) traffic and background, recorded over time.

`LinkLoadSampler.sample` reads the controller's port statistics (what each switch port sent, all
traffic classes, read from the switches at the sample: ``GET /stats/ports?read=now``) and flow
statistics (bytes per entry), and returns per directed link ``a -> b``: the port's rate (from the
change of its byte counter since the previous sample, over the time between the two reads; the
controller's rate over its last poll at the first sample or where a read is missing), the rate of
the task entries and of the background entries that output towards ``b`` (both from the change of
their byte counters since the previous sample, over the time between the two reads of those
counters: the entries' ``read_s``), the link's emulated capacity and whether it is up. An entry not
seen at the previous sample counts from zero over the time between the two samples (it was
installed in between); an entry that vanished (its task ended) is dropped. Rates are in emulated
Mbit/s, as the controller reports them. Traffic of neither class (e.g. best-effort connectivity) is
in ``rate_mbps`` only.

The counters' own read times matter: the answer to a read reaches the sampler some time after
the switches were read, by a delay that varies on a busy host, and a rate over the answers'
arrivals would carry that variation (docs/dashboard.md).

The entries count what they matched at the sending switch, which is what was offered to the link:
where the link's queue drops (a TCP flow filling its class), a class's rate exceeds what the link
carried, and ``rate_mbps`` (what the port sent) is the carried total.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from topologies.plan import EmulationPlan

#: The controller's entry kinds (``GET /flows``' ``kind``) that a link's load is split into; the
#: others (best-effort, table-miss) are in the port's total only.
KINDS = {"task": "ai", "background": "background"}


class LinkLoadSampler:
    """Per-link AI and background rates from successive counter reads of a `ControllerClient`."""

    def __init__(self, client: Any, plan: EmulationPlan, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.client = client
        self.plan = plan
        self.clock = clock
        #: (site, port) -> directed link (a, b) that port sends on.
        self._out: dict[tuple[str, int], tuple[str, str]] = {}
        self._capacity: dict[tuple[str, str], float] = {}
        for ln in plan.links:
            self._out[(ln.a, ln.port_a)] = (ln.a, ln.b)
            self._out[(ln.b, ln.port_b)] = (ln.b, ln.a)
            self._capacity[(ln.a, ln.b)] = self._capacity[(ln.b, ln.a)] = ln.emulated_mbps
        #: Entry key -> its byte counter and when it was read (``read_s``; None: not said) at the last sample.
        self._bytes: dict[str, tuple[int, float | None]] = {}
        #: Directed link -> its port's byte counter and when it was read, at the last sample.
        self._sent: dict[tuple[str, str], tuple[int, float | None]] = {}
        self._t: float | None = None

    @staticmethod
    def _out_port(actions: list[dict[str, Any]]) -> int | None:
        for a in actions:
            if a.get("type", "OUTPUT") == "OUTPUT" and "port" in a:
                return int(a["port"])
        return None

    def sample(self) -> list[dict[str, Any]]:
        """One reading of every directed link (see the module docstring); the first reading's
        class rates are zero (nothing to difference against)."""
        ports = self.client.link_stats(read_now=True)
        flows = self.client.flows()
        now = self.clock()
        dt = None if self._t is None else now - self._t
        split: dict[tuple[str, str], dict[str, float]] = {}
        seen: dict[str, tuple[int, float | None]] = {}
        for f in flows:
            kind = KINDS.get(str(f.get("kind")))
            actions = f.get("actions") or []
            port = self._out_port(actions)
            if kind is None or port is None or f.get("site") is None:
                continue
            link = self._out.get((str(f["site"]), port))
            if link is None:
                continue
            # one key per entry: its switch, priority, cookie, match and action
            key = json.dumps([f.get("switch"), f.get("priority"), f.get("cookie"), f.get("match"), actions],
                             sort_keys=True)
            seen[key] = _counter(f, "bytes")
            if dt:
                acc = split.setdefault(link, {"ai": 0.0, "background": 0.0})
                acc[kind] += _rate_bps(self._bytes.get(key), seen[key], dt) / 1e6
        self._bytes, self._t = seen, now
        rows = []
        sent: dict[tuple[str, str], tuple[int, float | None]] = {}
        for p in ports:
            try:
                a, b = (str(x) for x in p["link"])
            except (KeyError, TypeError, ValueError):
                continue
            sent[(a, b)] = _counter(p, "tx_bytes")
            rate = _port_rate_mbps(self._sent.get((a, b)), sent[(a, b)], float(p.get("rate_mbps", 0.0)))
            cls = split.get((a, b), {})
            rows.append({"a": a, "b": b, "tx_bytes": sent[(a, b)][0],
                         "rate_mbps": round(rate, 3),
                         "ai_mbps": round(cls.get("ai", 0.0), 3),
                         "background_mbps": round(cls.get("background", 0.0), 3),
                         "capacity_mbps": float(p.get("emulated_mbps", self._capacity.get((a, b), 0.0))),
                         "up": bool(p.get("up", True))})
        self._sent = sent
        return rows


def _read_span(before: tuple[int, float | None], now: tuple[int, float | None]) -> float | None:
    """The time between two reads of a counter, from their (bytes, read_s); None where either read
    time is unknown or the later is not after the earlier."""
    if before[1] is None or now[1] is None or now[1] <= before[1]:
        return None
    return now[1] - before[1]


def _rate_bps(before: tuple[int, float | None] | None, now: tuple[int, float | None], dt: float) -> float:
    """An entry's rate in bit/s from its (bytes, read_s) at two samples `dt` apart on the sampler's
    clock: over its two reads' times where both are known, else over `dt`; from zero if it is new."""
    if before is None:
        return now[0] * 8 / dt
    return max(0, now[0] - before[0]) * 8 / (_read_span(before, now) or dt)


def _counter(row: Mapping[str, Any], key: str) -> tuple[int, float | None]:
    """A byte counter of a controller's answer and when it was read (``read_s``; None: not said)."""
    read = row.get("read_s")
    return int(row.get(key, 0)), float(read) if isinstance(read, (int, float)) else None


def _port_rate_mbps(before: tuple[int, float | None] | None, now: tuple[int, float | None], polled: float) -> float:
    """A port's rate from its (bytes, read_s) at two samples, over the reads' times; `polled` (the
    controller's, over its last poll) where either read time is unknown, as at the first sample."""
    span = None if before is None else _read_span(before, now)
    if before is None or span is None:
        return polled
    return max(0, now[0] - before[0]) * 8 / span / 1e6
