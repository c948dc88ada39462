"""A copy sent as its link would carry it: each TCP segment released when the emulated link would
have finished serializing it (docs/fidelity.md, "Shaping").

The emulation's links are htb classes on veth pairs, which have no serialization time: a frame that
htb lets through arrives at once, and after an idle gap htb lets its burst through at the port's
speed. So a copy crossed an idle link ahead of its rate: by its whole burst at a small K (up to 16
KB), by one frame at least, every time a relay forwards. A chunk of a few KB relayed hop by hop
then gained that at every hop, and a deep tree's rounds ran faster than the configured network
allows them (the simulated twin with and without the burst: mst / spff 0.685 against 0.806 at 8
locals).

`Pacer` paces one connection at its link's rate instead: segment i of what it sends goes out at
``start + (w_1 + ... + w_i) / rate``, w the segment's bytes on the wire (payload + `FRAME_OVERHEAD_BYTES`),
``start`` the later of when the frame was handed to the sender (``ready_at``, default now) and when
the link finished the previous segment. Its last byte then arrives when a link of that rate would
have delivered it, never earlier, whatever htb's burst; the htb class behind it still enforces the
reservation (paced at its rate, a copy finds the bucket full and passes), and shares a link when
several copies meet on it. A segment is never sent before its time (with the lead below: before
the link would start serializing it); one due within `SLACK_S` of now goes with those due before
it, so that a fast link is paced in batches of a fraction of a millisecond, not by a sleep per
segment (at K = 32, 0.2 ms of wall time is 6 us of the emulated network's: a twentieth of a frame
at 100 Mbit/s).

The schedule is the link's, not the sender thread's: a sleep that overran (the thread woke late on
a busy host) delays the segments it held, not the ones after. A frame queued while the previous one
was still being paced starts where the link left off, even if the thread reaches it later, and its
segments already due go at once; htb's burst (6 ms of the rate) lets such a late segment catch up.
Before, each frame started when the thread got to it, so the overruns of a copy's frames (eight
at a 3 KB chunk size) added up at every hop. The same holds across a relay: a forwarded chunk is
ready when the kernel received it (`ready_at`, `workers.round_parts.CutThrough`), not when the
relay's reader, checks and sender got to it, so that time is made up on its link too, while what
the emulated links added before it arrived is kept.

A segment behind another (in the same frame, or in a frame queued while the link still carried
the one before) goes half its serialization time early (`LEAD_SHARE`), so that it already waits in
the task's htb class when the link frees. Sent only once due, each segment found the class empty a
moment before it came, and a backlogged background, which htb serves whenever a task's class is
empty, took that gap: on paper.yaml's claim point at K = 64 the copies' links that carried
background delivered a median 0.92 of their rate, the others 0.97 (flights from the first chunk's
write, about 0.03 above their start on the link); with the lead 0.95 and 0.99,
and the relay chains' share of a round fell from 2.6-3.2 % to 1.5-1.7 % (docs/fidelity.md,
"Shaping"). The first segment after an idle gap still goes only once serialized (the bucket would
let it through at once).

A led segment passes early wherever its class has tokens (htb sends whenever they are at least 0):
on paper.yaml's whole sweep at K = 64, 38-73 % of the relay hops were shorter than their links'
rate allows. So the final segment of a copy or an update (the frame sent with ``last``) is never
led: the segments inside it may pass up to `LEAD_SHARE` of a frame early, but the copy is whole, and
a relay can forward its end, no earlier than the link has serialized every byte. That holds
whatever htb's bucket, so the lead is the same at every rate and every K (it was once kept to the
links whose bucket holds one frame, K >= 47 for 100 Mbit/s links; at K = 32 the claim point's mst
was then NOT faithful, its relay chains at 5.1 % of a round, and with the lead 3.0 %).

`rate_mbps` is the link's rate in wall time (under time dilation K, the emulated rate / K), in
megabits of wire bytes per second, as the shaper counts them.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Sequence

from workers.framing import Buffer

#: Bytes a TCP segment adds on the wire to its payload: Ethernet (14), IPv4 (20), TCP with the
#: timestamps option (32); htb counts the frame from its Ethernet header.
FRAME_OVERHEAD_BYTES = 66
#: The payload of one segment where the connection's MSS cannot be read (1500-byte MTU, timestamps).
DEFAULT_MSS = 1448
#: A segment due within this many wall seconds goes out with the segments due before it.
SLACK_S = 0.2e-3
#: At most this many buffers go to one sendmsg (IOV_MAX is 1024 on Linux).
MAX_IOV = 512
#: How much of its own serialization time before its time a segment behind another goes (see the
#: module docstring; never a copy's final segment).
LEAD_SHARE = 0.5


class Pacer:
    """Sends what a connection writes at `rate_mbps` (see the module docstring). Not thread-safe: one
    per connection, used by its sender thread."""

    def __init__(self, rate_mbps: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, lead_share: float = LEAD_SHARE) -> None:
        if not rate_mbps > 0:
            raise ValueError(f"a pacing rate must be positive, got {rate_mbps!r}")
        if not 0 <= lead_share < 1:
            raise ValueError(f"a lead must be at least 0 and less than a segment, got {lead_share!r}")
        self.bytes_per_s = rate_mbps * 1e6 / 8
        self.clock = clock
        self.sleep = sleep
        #: When the link finishes the last segment sent so far (the clock's time).
        self.free_at = float("-inf")
        #: The share of its serialization a segment behind another goes early (`LEAD_SHARE`).
        self.lead_share = lead_share
        #: When the link started serializing the last frame `send` was given, by its schedule (the
        #: clock's time): the later of when it was ready and when the link finished the one before.
        self.started_at = float("-inf")

    def segments(self, pieces: Sequence[Buffer], mss: int) -> list[list[memoryview]]:
        """`pieces` cut into segments of at most `mss` payload bytes, each a list of views."""
        out: list[list[memoryview]] = []
        current: list[memoryview] = []
        room = mss
        for piece in pieces:
            view = memoryview(piece).cast("B")
            while view.nbytes:
                take = view[:room]
                current.append(take)
                room -= take.nbytes
                view = view[take.nbytes:]
                if room == 0:
                    out.append(current)
                    current, room = [], mss
        if current:
            out.append(current)
        return out

    def send(self, sock: socket.socket, pieces: Sequence[Buffer], *, mss: int | None = None,
             ready_at: float | None = None, last: bool = False) -> int:
        """Send every buffer, each segment at its time; the bytes sent. `ready_at`: when the frame
        was handed to the sender (the clock's time; default now): it starts then, or when the link
        is free, whichever is later. `last`: the frame ends a copy (or an update), whose final
        segment then goes at its time, never led, so that the copy is whole no earlier than its link
        allows."""
        segs = self.segments(pieces, mss or segment_size(sock))
        due: list[float] = []
        ready = self.clock() if ready_at is None else ready_at
        at = max(ready, self.free_at)
        self.started_at = at
        behind = ready <= self.free_at  # queued while the link still carried our last segment
        for i, seg in enumerate(segs):
            wire_s = (sum(v.nbytes for v in seg) + FRAME_OVERHEAD_BYTES) / self.bytes_per_s
            at += wire_s
            led = (i > 0 or behind) and not (last and i == len(segs) - 1)
            due.append(at - self.lead_share * wire_s if led else at)
        self.free_at = at if segs else self.free_at
        total, i = 0, 0
        while i < len(segs):
            now = self.clock()
            if due[i] > now + SLACK_S:
                self.sleep(due[i] - now)
                continue
            j = i
            while j < len(segs) and due[j] <= now + SLACK_S:
                j += 1
            total += send_views(sock, [v for seg in segs[i:j] for v in seg])
            i = j
        return total


def segment_size(sock: socket.socket) -> int:
    """The connection's MSS (payload bytes of a full segment), else `DEFAULT_MSS`."""
    try:
        mss = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
    except OSError:
        return DEFAULT_MSS
    return mss if 0 < mss <= 65_535 else DEFAULT_MSS


def send_views(sock: socket.socket, views: list[memoryview]) -> int:
    """Write every view with as few system calls as the kernel allows (scatter/gather, `MAX_IOV`
    at a time), taking up partial writes; the bytes written. `views` is consumed."""
    total = sum(v.nbytes for v in views)
    while views:
        sent = sock.sendmsg(views[:MAX_IOV])
        while sent:
            if sent >= views[0].nbytes:
                sent -= views[0].nbytes
                views.pop(0)
            else:
                views[0] = views[0][sent:]
                sent = 0
    return total
