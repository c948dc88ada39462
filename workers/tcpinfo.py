"""What the kernel's TCP said about one connection: its data bytes sent and retransmitted.

Read from ``getsockopt(IPPROTO_TCP, TCP_INFO)`` (``struct tcp_info`` of linux/tcp.h). The offsets
below were checked against the header with ``offsetof`` (Linux 6.x headers; the struct only grows
at its end, and both u64 byte counters exist since Linux 4.19):

- ``tcpi_total_retrans`` u32 at 100: segments retransmitted over the connection's life;
- ``tcpi_bytes_sent`` u64 at 200: data bytes sent, retransmissions included
  (RFC 4898 tcpEStatsPerfHCDataOctetsOut);
- ``tcpi_bytes_retrans`` u64 at 208: data bytes retransmitted (tcpEStatsPerfOctetsRetrans).

A kernel that returns a shorter struct has not measured a figure: it is None, never 0.
No torch, no network: `parse_tcp_info` is a pure function of the returned bytes.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: How many bytes of ``struct tcp_info`` to ask for (the kernel returns at most its own size).
TCP_INFO_REQUEST = 256
TOTAL_RETRANS_OFFSET = 100
BYTES_SENT_OFFSET = 200
BYTES_RETRANS_OFFSET = 208
#: Between two reads of a closing socket's unacknowledged bytes.
ACK_POLL_S = 0.005


@dataclass(frozen=True)
class TcpBytes:
    """One connection's (or a sum of connections') figures; None: not measured."""

    sent_bytes: int | None
    retrans_bytes: int | None
    retrans_segments: int | None

    def __add__(self, other: TcpBytes) -> TcpBytes:
        def add(a: int | None, b: int | None) -> int | None:
            return None if a is None or b is None else a + b
        return TcpBytes(add(self.sent_bytes, other.sent_bytes), add(self.retrans_bytes, other.retrans_bytes),
                        add(self.retrans_segments, other.retrans_segments))


#: Nothing measured (no connection, or TCP_INFO unavailable).
UNMEASURED = TcpBytes(None, None, None)
#: The sum of no connection at all: nothing was sent.
ZERO = TcpBytes(0, 0, 0)


def _field(buf: bytes, offset: int, fmt: str) -> int | None:
    size = struct.calcsize(fmt)
    if len(buf) < offset + size:
        return None
    return int(struct.unpack_from(fmt, buf, offset)[0])


def parse_tcp_info(buf: bytes) -> TcpBytes:
    """The figures in a ``struct tcp_info`` as the kernel returned it (native byte order); a field
    the buffer is too short for is None."""
    return TcpBytes(sent_bytes=_field(buf, BYTES_SENT_OFFSET, "=Q"),
                    retrans_bytes=_field(buf, BYTES_RETRANS_OFFSET, "=Q"),
                    retrans_segments=_field(buf, TOTAL_RETRANS_OFFSET, "=I"))


def read_tcp_bytes(sock: socket.socket) -> TcpBytes:
    """`parse_tcp_info` of the socket's TCP_INFO now; `UNMEASURED` if the kernel would not say."""
    try:
        return parse_tcp_info(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCP_INFO_REQUEST))
    except (OSError, AttributeError):  # not a TCP socket, closed, or no TCP_INFO on this platform
        return UNMEASURED


#: SIOCOUTQ (== TIOCOUTQ on Linux): the bytes a TCP socket holds that its peer has not acknowledged.
SIOCOUTQ = termios.TIOCOUTQ
#: SIOCOUTQNSD (linux/sockios.h): the bytes a TCP socket holds that it has not sent yet.
SIOCOUTQNSD = 0x894B


def _queued(sock: socket.socket, request: int) -> int | None:
    """The byte count the socket ioctl `request` returns; None if unknown (closed, not TCP)."""
    try:
        buf = fcntl.ioctl(sock.fileno(), request, b"\0\0\0\0")
    except (OSError, ValueError):
        return None
    return int(struct.unpack("=i", buf)[0])


def unacked_bytes(sock: socket.socket) -> int | None:
    """Bytes the socket holds that its peer has not acknowledged (SIOCOUTQ); None if unknown."""
    return _queued(sock, SIOCOUTQ)


def unsent_bytes(sock: socket.socket) -> int | None:
    """Bytes the socket holds that it has not sent yet (SIOCOUTQNSD); None if unknown."""
    return _queued(sock, SIOCOUTQNSD)


def wait_acked(sock: socket.socket, within_s: float, *, poll_s: float = ACK_POLL_S,
               stop: threading.Event | None = None, idle: bool = False,
               held: Callable[[socket.socket], int | None] = unacked_bytes) -> bool:
    """Wait until the peer acknowledged everything sent (so that the figures read next include any
    retransmission of the connection's last bytes, or an unpaced lane's copy has left whole): at
    most `within_s`, or with `idle` at most `within_s` without any progress; `stop` set ends the
    wait. `held`: the count waited for to reach 0 (`unsent_bytes`: until the socket has sent
    everything, without waiting for the peer). True if it did."""
    deadline, last = time.monotonic() + within_s, None
    while True:
        left = held(sock)
        if left is None or left <= 0:
            return left == 0
        now = time.monotonic()
        if idle and left != last:
            last, deadline = left, now + within_s
        if now >= deadline:
            return False
        if stop is None:
            time.sleep(poll_s)  # polling a kernel counter, bounded by the deadline
        elif stop.wait(poll_s):
            return False
