"""What the emulation's shaper passes ahead of its rate, for the simulated twin of an emulated run.

The emulation shapes each link with htb (`controller.htb`): after an idle gap a class's bucket holds
its burst, which crosses the link at the port's speed; the rest goes at the rate, and a bucket
spent fills again at the rate. The burst is `topologies.shaping.burst_bytes` of the link's *dilated*
rate (6 ms of it, one frame to 16 KB), so in the emulated network's time it is worth more at a small
K: at K = 64 a 100 Mbit/s link passes one frame, about half of a 3 KB chunk, and at K = 1 its 16 KB
cap, most of a 19 KB model. Chunks relayed hop by hop meet idle links at every hop, so a deep tree
gains at each.

A `Bucket` models that per bottleneck link of a run (the link whose bucket sets an overlay edge's
pace; a faster link downstream passes what it gets; the edges of a run whose bottleneck is the same
link share it, as one task's copies share its htb class): `ahead` says how many of a segment's bytes
pass at once when it starts, the bucket's tokens, the rest crossing at the rate; `left` records when
it has left. This is the burst the per-hop floor leaves out (`orchestrator.lifecycle.fidelity`).
htb also sends the packet that empties its bucket whole; counting that frame too made the twin of
paper.yaml's faithful sweep 8-22 % fast on deep trees (docs/simulation.md, "The shaper's burst").
Bytes are the simulation's (TCP payload): the burst is counted at 1448 payload bytes a 1514-byte
frame. Used only where a run's spec says ``shaper_burst_k`` (the emulated run's K; 0: not modelled).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.scheduling.cost import TCP_PAYLOAD_SHARE
from topologies.shaping import burst_bytes


@dataclass
class Bucket:
    """An htb bucket of `burst` payload bytes filling at `rate` bytes per second (emulated time)."""

    burst: float
    rate: float
    tokens: float = 0.0
    at: float | None = None
    #: The segment in flight: the tokens once its burst passed, and its bytes left to send at the rate.
    pending: float = 0.0
    rest: float = 0.0

    @classmethod
    def for_link(cls, rate_bytes_s: float, time_dilation: float, payload_share: float = 1.0) -> Bucket:
        """The bucket of a link that carries `rate_bytes_s` of payload in emulated time, `payload_share`
        of its line rate (the run's ``tcp_efficiency``), shaped at K: the port shapes the line rate."""
        dilated_mbps = rate_bytes_s * 8 / 1e6 / payload_share / time_dilation
        burst = burst_bytes(dilated_mbps) * TCP_PAYLOAD_SHARE
        return cls(burst=burst, rate=rate_bytes_s, tokens=burst)

    def ahead(self, start: float, size: float) -> float:
        """The bytes of a segment of `size` starting at `start` that cross at once (0 if the bucket is
        in debt), the rest at the rate."""
        tokens = self.tokens if self.at is None else min(self.burst, self.tokens + self.rate * (start - self.at))
        passed = min(size, max(0.0, tokens))
        self.pending, self.rest, self.at, self.tokens = tokens - passed, size - passed, start, tokens
        return passed

    def left(self, end: float) -> None:
        """The segment left at `end`: the bucket filled at the rate meanwhile and paid for the rest
        (the same tokens as after its burst when it went at the rate; more, up to the burst, when a
        shared link slowed it)."""
        start = self.at if self.at is not None else end
        self.tokens = min(self.burst, self.pending + self.rate * (end - start) - self.rest)
        self.at = end


def give_buckets(edges: Iterable[Any], rates: Mapping[tuple[str, str], float], time_dilation: float,
                 payload_share: float = 1.0) -> None:
    """Give each overlay edge (its ``links``) the bucket of its bottleneck link in `rates` (payload
    bytes per second, `payload_share` of the line rate), one bucket per link of the run: one task's
    copies share its htb class there."""
    buckets: dict[tuple[str, str], Bucket] = {}
    for e in edges:
        neck = min(e.links, key=lambda ln: rates[ln])
        e.bucket = buckets.setdefault(neck, Bucket.for_link(rates[neck], time_dilation, payload_share))
