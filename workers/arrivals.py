"""When the kernel received what a connection reads: its software receive stamps (SO_TIMESTAMPNS),
as this host's CLOCK_MONOTONIC. A relay forwards a chunk ready when it arrived
(`workers.round_parts.CutThrough`, docs/data-plane.md, "A relay's chunk, ready when it arrived").
No torch imported here.
"""

from __future__ import annotations

import socket
import struct
import time

#: ``tcpi_rcv_ooopack`` (u32, Linux 5.4+): segments the connection received out of order, at this
#: offset of ``struct tcp_info`` (checked with ``offsetof`` against linux/tcp.h).
RCV_OOOPACK_OFFSET = 224
#: A stamp further from the reader's clock than this is not an arrival's (a clock step, a send time).
MAX_STAMP_AGE_S = 1.0

#: SO_TIMESTAMPNS (linux/asm-generic/socket.h; Python's socket module does not name it): the kernel
#: stamps each segment as it comes in (CLOCK_REALTIME, a struct timespec), and a TCP recvmsg returns
#: the stamp of the last segment it read.
SO_TIMESTAMPNS = 35
_TIMESPEC = struct.Struct("@qq")
#: The ancillary buffer a stamped recvmsg needs.
STAMP_SPACE = socket.CMSG_SPACE(_TIMESPEC.size)


def stamp_arrivals(sock: socket.socket) -> bool:
    """Have the kernel stamp what `sock` receives (`stamp_in`; an accepted connection takes its
    listener's flag); whether it will."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def out_of_order(sock: socket.socket) -> int | None:
    """How many segments the connection has received out of order so far; None where the kernel
    does not say. A TCP read stamps what it returns with its last segment in sequence, which after a
    loss arrived before the retransmission that completed it: such a read's stamp is not taken."""
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, RCV_OOOPACK_OFFSET + 4)
    except OSError:
        return None
    return struct.unpack_from("I", raw, RCV_OOOPACK_OFFSET)[0] if len(raw) >= RCV_OOOPACK_OFFSET + 4 else None


def stamp_in(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    """The receive stamp in a recvmsg's ancillary data (CLOCK_REALTIME seconds), if there is one."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            return seconds + nanoseconds * 1e-9
    return None


def arrival(sock: socket.socket, stamp: float | None, gaps: int | None) -> tuple[float | None, int | None]:
    """When the kernel received what a read of `sock` returned with `stamp` (`stamp_in` of its last
    recvmsg), as this host's CLOCK_MONOTONIC: None without a stamp, where a segment came out of order
    since the count `gaps` (`out_of_order`, read when the read began), or where the stamp is not a
    recent arrival's (`MAX_STAMP_AGE_S`); and the connection's out-of-order count now, the next
    read's `gaps` (one TCP_INFO read a frame)."""
    gaps_now = out_of_order(sock)
    if stamp is None or gaps is None or gaps_now != gaps:
        return None, gaps_now
    before, now, after = time.time(), time.monotonic(), time.time()  # the clocks' offset, read closely
    age = (before + after) / 2 - stamp
    return (now - age if 0.0 <= age <= MAX_STAMP_AGE_S else None), gaps_now
