"""Socket I/O of one agent: one persistent TCP connection per overlay edge, set up before round 1.

- `Outbound`: a connection this node opens (to a broadcast child's broadcast port, to its upload
  parent's upload port), with its own sender thread. Connects and reconnects retry with
  exponential backoff up to a deadline; TCP_NODELAY is set; frames go out as scatter/gather writes
  of the header and the tensors' memory. The first frame is HELLO (who is sending).
- `Listener`: the node's listening socket on one port, bound to its own host address. It accepts a
  connection only from a peer it expects on that port, from that peer's address, whose first frame
  is a HELLO naming it; anything else is logged as rejected and closed. A peer that reconnects
  replaces its earlier connection. At most one connection per expected peer is kept.
- `read_frame`: one frame from a connection, its payload received in place into a bytearray and
  checked against its digest (`workers.framing`).

Every thread this module starts is a network-path thread: it raises itself first
(`workers.priority.enter_transfer`), so that it never waits behind training.

A broken connection is reported to the caller (``on_lost``) with the error, so the round logic can
go on without that peer; this module decides nothing about rounds.

What this module must never do: bind a wildcard address, unpickle, or open a connection during a
round except to replace a broken one.
"""

from __future__ import annotations

import contextlib
import math
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from workers import priority
from workers.arrivals import STAMP_SPACE, arrival, out_of_order, stamp_arrivals, stamp_in
from workers.config import WILDCARD_ADDRESSES
from workers.framing import (
    FIXED,
    FIXED_LEN,
    MAGIC,
    MAX_HEADER_BYTES,
    VERSION,
    Buffer,
    FrameError,
    Header,
    encode_frame,
    verify_payload,
)
from workers.pacing import Pacer, send_views
from workers.tcpinfo import ZERO, TcpBytes, read_tcp_bytes, unacked_bytes, unsent_bytes, wait_acked

#: First and largest pause between connect attempts (doubling in between).
BACKOFF_FIRST_S = 0.02
BACKOFF_MAX_S = 1.0
#: Once a reconnect has failed for good, what is queued for the peer is dropped, and a single
#: connect attempt of at most `RETRY_CONNECT_S` is made at most every `RETRY_EVERY_S` (a dead peer
#: must not hold up the node's sending, nor its end).
RETRY_EVERY_S = 2.0
RETRY_CONNECT_S = 1.0
#: How long an accepted connection may take to say HELLO.
HELLO_TIMEOUT_S = 10.0
#: Connections a listener holds before they said HELLO, beyond the peers it expects.
MAX_UNIDENTIFIED = 4
#: How long a closing outbound connection waits for its last bytes to be acknowledged before its
#: TCP figures are read (a retransmission of them then counts).
ACK_WAIT_S = 2.0
#: A frame sent with ``drain`` (a lane's copy, `workers.round_parts.Lanes`) counts as sent once it has
#: left: on a connection that is not paced once the peer acknowledged every byte the socket held (its
#: kernel buffer and the links' queues emptied), on a paced one once the socket sent every byte (see
#: `Outbound.send`); polled every `DRAIN_POLL_S`, the wait gives up once nothing moved for
#: `DRAIN_STALL_S` (a peer gone without a reset: the lane then goes on, as it did before copies were
#: waited for), whatever the link's rate or the time dilation.
DRAIN_POLL_S = 0.0005
DRAIN_STALL_S = 2.0


# -- frames on sockets ----------------------------------------------------------------------------
def sendmsg_all(sock: socket.socket, buffers: Sequence[Buffer]) -> int:
    """Send every buffer with as few system calls as the kernel allows (scatter/gather)."""
    return send_views(sock, [memoryview(b).cast("B") for b in buffers if len(b)])


def ack_now(sock: socket.socket) -> None:
    """Acknowledge what was read at once (TCP_QUICKACK), rather than after the delayed-ACK timer
    (up to 40 ms of wall time, over a millisecond of the emulated network's at K = 32): a sender
    that waits for its peer's acknowledgement (an unpaced lane's ``drain``, a closing connection's
    figures) waits for the link, not for the timer."""
    with contextlib.suppress(OSError):  # the connection is going: its reader sees it next
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)


def _recv_into(sock: socket.socket, view: memoryview, what: str, *, stamped: bool = False) -> float | None:
    """Fill `view` from the connection. MSG_WAITALL lets the kernel return once the whole view is
    in (one system call, and one hand-back of the interpreter lock, per chunk rather than per
    segment); it may still return less (a signal, a timeout), which the loop takes up. `stamped`:
    read with recvmsg, and return the receive stamp of the last read (`arrivals.stamp_in`), if any."""
    got, n, stamp = 0, view.nbytes, None
    while got < n:
        if stamped:
            k, ancillary, _flags, _address = sock.recvmsg_into([view[got:]], STAMP_SPACE, socket.MSG_WAITALL)
            stamp = stamp_in(ancillary)
        else:
            k = sock.recv_into(view[got:], n - got, socket.MSG_WAITALL)
        if k == 0:
            raise FrameError("truncated", f"connection closed after {got} of {n} bytes of {what}")
        got += k
    return stamp


def read_frame(sock: socket.socket, *, max_payload_bytes: int) -> tuple[Header, bytearray] | None:
    """One frame, its payload checked against the digest; None on a clean end of stream
    (`read_frame_at` without the arrival time)."""
    got = read_frame_at(sock, max_payload_bytes=max_payload_bytes)
    return None if got is None else (got[0], got[1])


def read_frame_at(sock: socket.socket, *, max_payload_bytes: int,
                  gaps: int | None = None) -> tuple[Header, bytearray, float | None, int | None] | None:
    """One frame, its payload checked against the digest, when the kernel received its last byte
    (CLOCK_MONOTONIC; None where the socket does not stamp arrivals, `stamp_arrivals`, where the
    frame has no payload, or where a segment came out of order since `gaps`: `arrivals.arrival`),
    and the connection's out-of-order count after it (the next frame's `gaps`); None on a clean end
    of stream.

    Raises
    ------
    FrameError
        Bad magic or version, an oversized header or payload (checked before it is read), a header
        that does not parse or disagrees with the fixed header, a truncated frame, a digest mismatch.
    OSError
        The connection broke.
    """
    fixed = bytearray(FIXED_LEN)
    first = sock.recv_into(fixed, FIXED_LEN)
    if first == 0:
        return None
    if first < FIXED_LEN:
        _recv_into(sock, memoryview(fixed)[first:], "fixed header")
    magic, version, _flags, _reserved, header_len, payload_len = FIXED.unpack(fixed)
    if magic != MAGIC:
        raise FrameError("bad_magic", f"frame starts with {bytes(magic)!r}, not {MAGIC!r}")
    if version != VERSION:
        raise FrameError("bad_version", f"frame version {version}, this agent speaks {VERSION}")
    if header_len > MAX_HEADER_BYTES:
        raise FrameError("oversized", f"JSON header of {header_len} bytes exceeds {MAX_HEADER_BYTES}")
    if payload_len > max_payload_bytes:
        raise FrameError("oversized", f"payload of {payload_len} bytes exceeds the limit {max_payload_bytes}")
    raw = bytearray(header_len)
    _recv_into(sock, memoryview(raw), "JSON header")
    header = Header.from_json(bytes(raw))
    if header.nbytes != payload_len:
        raise FrameError("bad_header", f"header says {header.nbytes} payload bytes, frame says {payload_len}", header)
    payload = bytearray(payload_len)
    try:
        gaps = out_of_order(sock) if gaps is None and payload_len else gaps
        stamp = _recv_into(sock, memoryview(payload), "payload", stamped=True) if payload_len else None
    except FrameError as e:
        e.header = header
        raise
    verify_payload(header, payload)
    return header, payload, *arrival(sock, stamp, gaps)


def hello(task: int, site: str) -> list[Buffer]:
    return encode_frame(Header("HELLO", task, 0, site), b"")


# -- outbound connections -------------------------------------------------------------------------
@dataclass
class _Item:
    pieces: Sequence[Buffer]
    round: int
    on_sent: Callable[[], None] | None
    drain: bool = False
    #: When it was queued (`time.monotonic`): a paced frame starts then at the earliest.
    queued_at: float = 0.0
    #: It ends a copy or an update (`Outbound.send`).
    last: bool = False


class Outbound:
    """One connection this node opens to `peer_host:port`, with a sender thread (see the module
    docstring). `send` queues a frame; `on_lost(error)` is called (from the sender thread) when a
    write fails; the thread then reconnects, bounded by `connect_timeout_s`, and drops what was
    queued for the round that broke (its receiver has dropped that message too). If that reconnect
    fails, the peer counts as gone: frames for it are dropped, with one short connect attempt at
    most every `RETRY_EVERY_S` (a peer that comes back gets the frames queued after it did).

    Before each socket closes, the kernel's TCP figures of it (`workers.tcpinfo`) are added to
    `tcp`; `flush_and_close` hands the totals over all its connections to `on_tcp(peer, totals,
    connections)`. With `pace_mbps` > 0 frames go out paced at that rate (`workers.pacing`): each
    segment when the emulated link would have finished serializing it."""

    def __init__(
        self,
        *,
        peer: str,
        peer_host: str,
        port: int,
        local_host: str,
        task: int,
        site: str,
        connect_timeout_s: float,
        on_lost: Callable[[str, BaseException], None],
        on_connect: Callable[[str, float, int], None],
        on_tcp: Callable[[str, TcpBytes, int], None] | None = None,
        pace_mbps: float = 0.0,
    ) -> None:
        self.peer = peer
        self.pacer = Pacer(pace_mbps) if pace_mbps > 0 else None
        self.address = (peer_host, port)
        self.local_host = local_host
        self.task = task
        self.site = site
        self.connect_timeout_s = connect_timeout_s
        self.on_lost = on_lost
        self.on_connect = on_connect
        self.on_tcp = on_tcp
        self.sock: socket.socket | None = None
        #: When the frame whose `on_sent` runs (on the sender thread) started on its link
        #: (`time.monotonic`): paced, by its schedule (`Pacer.started_at`); unpaced, when its write began.
        self.started_at: float | None = None
        #: TCP figures summed over the connections closed so far, and how many there were.
        self.tcp: TcpBytes = ZERO
        self.connections = 0
        self._queue: queue.Queue[_Item | None] = queue.Queue()
        self._stopping = threading.Event()
        self._broken_round: int | None = None
        #: When the last reconnect failed for good (monotonic), or None while the peer counts as there.
        self._gone_since: float | None = None
        self._last_try = 0.0
        self._thread = threading.Thread(target=self._run, name=f"send-{peer}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def send(self, pieces: Sequence[Buffer], *, round: int, on_sent: Callable[[], None] | None = None,
             drain: bool = False, last: bool = False, ready_at: float | None = None) -> None:
        """Queue a frame; `on_sent` runs (on the sender thread) once it was written, or with `drain`
        once it has left: on a paced connection once the socket sent it all, its last segment
        written when the emulated link would have finished serializing it (the next copy of a lane
        then goes as in the configured network, and as the simulated twin has it); unpaced once the
        peer also acknowledged it (`DRAIN_POLL_S`, `DRAIN_STALL_S`). `last` (implied by `drain`):
        the frame ends a copy or an update (paced, its final segment is never led:
        `workers.pacing.Pacer.send`). `ready_at` (paced only): when the frame was ready, if before
        now (a relay's chunk: when the kernel received it, `read_frame_at`)."""
        ready = time.monotonic() if ready_at is None else ready_at
        self._queue.put(_Item(pieces, round, on_sent, drain, ready, last or drain))

    @property
    def paced_until(self) -> float | None:
        """When the link finishes serializing what was sent, by the pacing schedule; None unpaced."""
        return self.pacer.free_at if self.pacer is not None and math.isfinite(self.pacer.free_at) else None

    def flush_and_close(self, timeout_s: float) -> bool:
        """Send what is queued, then close. False if that did not finish within `timeout_s`."""
        self._queue.put(None)
        self._thread.join(timeout=timeout_s)
        done = not self._thread.is_alive()
        self._stopping.set()
        if done and self.sock is not None:
            wait_acked(self.sock, ACK_WAIT_S)
        self._close_socket()
        if self.on_tcp is not None:
            self.on_tcp(self.peer, self.tcp, self.connections)
        return done

    def _connect(self, within_s: float | None = None) -> None:
        """Connect (and say HELLO), retrying with backoff until the deadline (`within_s`, default
        `connect_timeout_s`); raises the last error."""
        deadline = time.monotonic() + (self.connect_timeout_s if within_s is None else within_s)
        pause, attempts, t0 = BACKOFF_FIRST_S, 0, time.monotonic()
        while True:
            attempts += 1
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.bind((self.local_host, 0))
                s.settimeout(max(0.1, deadline - time.monotonic()))
                s.connect(self.address)
                s.settimeout(None)
                sendmsg_all(s, hello(self.task, self.site))
            except OSError as e:
                s.close()
                if time.monotonic() + pause > deadline or self._stopping.is_set():
                    raise OSError(f"could not connect to {self.peer} at {self.address[0]}:{self.address[1]} "
                                  f"within {self.connect_timeout_s:.0f} s ({attempts} attempts): {e}") from e
                self._stopping.wait(pause)  # backoff between attempts, bounded by the deadline
                pause = min(BACKOFF_MAX_S, pause * 2)
                continue
            self.sock = s
            self.on_connect(self.peer, time.monotonic() - t0, attempts)
            return

    def _close_socket(self) -> None:
        if self.sock is not None:
            self.tcp = self.tcp + read_tcp_bytes(self.sock)
            self.connections += 1
            with contextlib.suppress(OSError):  # already broken: nothing to shut down
                self.sock.shutdown(socket.SHUT_RDWR)
            self.sock.close()
            self.sock = None

    def _run(self) -> None:
        priority.enter_transfer()
        try:
            self._connect()
        except OSError as e:
            self.on_lost(self.peer, e)
            return
        while True:
            item = self._queue.get()
            if item is None:
                return
            if self._broken_round is not None and item.round <= self._broken_round:
                continue  # the rest of a message whose stream broke: its receiver dropped it
            if self.sock is None and self._gone_since is not None:
                now = time.monotonic()
                if now - self._last_try < RETRY_EVERY_S:
                    continue  # the peer is gone: drop, do not wait for it
                self._last_try = now
            try:
                if self.sock is None:
                    self._connect(None if self._gone_since is None else RETRY_CONNECT_S)
                    self._gone_since = None
                assert self.sock is not None
                if self.pacer is None:
                    self.started_at = time.monotonic()
                    sendmsg_all(self.sock, item.pieces)
                else:
                    self.pacer.send(self.sock, item.pieces, ready_at=item.queued_at, last=item.last)
                    self.started_at = self.pacer.started_at
            except OSError as e:
                self._broken_round = item.round
                if self.sock is None and self._gone_since is None:
                    self._gone_since = self._last_try = time.monotonic()
                self._close_socket()
                self.on_lost(self.peer, e)
                if self._stopping.is_set():
                    return
                continue
            if item.drain:
                self._drain()
            if item.on_sent is not None:
                item.on_sent()

    def _drain(self) -> bool:
        """Wait until the peer acknowledged everything written (on a paced connection until the
        socket has sent everything: the pacer wrote the last segment when the emulated link would
        have serialized it, within `SLACK_S`, and the kernel may only hold it back behind its
        congestion window), the node stops, or nothing moved for `DRAIN_STALL_S`; whether it did."""
        held = unsent_bytes if self.pacer is not None else unacked_bytes
        return self.sock is not None and wait_acked(self.sock, DRAIN_STALL_S, poll_s=DRAIN_POLL_S,
                                                    stop=self._stopping, idle=True, held=held)


# -- inbound connections --------------------------------------------------------------------------
#: ``on_frame(peer, header, payload, arrived)``: `arrived` is when the kernel received the frame's
#: last byte (`read_frame_at`), or None.
FrameHandler = Callable[[str, Header, bytearray, float | None], None]
LostHandler = Callable[[str, BaseException | None], None]


class Listener:
    """Accepts the connections of the peers expected on one port (see the module docstring).

    Parameters
    ----------
    expected
        Peer site -> its host address: who may connect here.
    on_frame
        Called from the connection's reader thread with (peer site, header, checked payload) for
        every frame after HELLO whose sender is that peer.
    on_lost
        Called when a connection ends: (peer, None) at a clean end of stream, else the error.
    on_accept
        Called with the peer's site once its HELLO was accepted.
    """

    def __init__(
        self,
        *,
        host: str,
        port: int,
        task: int,
        kind: str,
        expected: Mapping[str, str],
        max_payload_bytes: int,
        on_frame: FrameHandler,
        on_lost: LostHandler,
        on_accept: Callable[[str], None],
        on_reject: Callable[[str, FrameError | OSError, str], None],
    ) -> None:
        if host in WILDCARD_ADDRESSES:
            raise ValueError("an agent listens on its own host address only, not a wildcard")
        self.host, self.port, self.task, self.kind = host, port, task, kind
        self.expected = dict(expected)
        self.max_payload_bytes = max_payload_bytes
        self.on_frame, self.on_lost, self.on_accept, self.on_reject = on_frame, on_lost, on_accept, on_reject
        self.live: dict[str, socket.socket] = {}
        self._lock = threading.Lock()
        self._unidentified = threading.Semaphore(len(self.expected) + MAX_UNIDENTIFIED)
        self._stopping = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # what its connections receive is stamped from their first byte (an accepted socket takes its
        # listener's flags): a relay forwards a chunk ready when it arrived (`round_parts.CutThrough`)
        stamp_arrivals(self.sock)
        self.sock.bind((host, port))
        self.sock.listen(len(self.expected) + MAX_UNIDENTIFIED)
        self._thread = threading.Thread(target=self._accept_loop, name=f"accept-{kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        """Stop accepting and close every connection (shutdown wakes the blocked threads)."""
        self._stopping.set()
        for s in (self.sock, *self.live.values()):
            with contextlib.suppress(OSError):  # not connected: nothing to wake up
                s.shutdown(socket.SHUT_RDWR)
            s.close()
        self._thread.join(timeout=2.0)

    def _accept_loop(self) -> None:
        priority.enter_transfer()
        while not self._stopping.is_set():
            try:
                conn, addr = self.sock.accept()
            except OSError:
                return
            if not self._unidentified.acquire(blocking=False):
                self.on_reject(addr[0], OSError("too many connections waiting to say HELLO"), self.kind)
                conn.close()
                continue
            threading.Thread(target=self._serve, args=(conn, addr[0]), name=f"recv-{self.kind}", daemon=True).start()

    def _identify(self, conn: socket.socket, peer_ip: str) -> str:
        conn.settimeout(HELLO_TIMEOUT_S)
        got = read_frame(conn, max_payload_bytes=0)
        if got is None:
            raise FrameError("no_hello", "the connection closed before HELLO")
        h = got[0]
        if h.type != "HELLO":
            raise FrameError("no_hello", f"first frame is {h.type}, not HELLO", h)
        if h.task != self.task:
            raise FrameError("wrong_task", f"HELLO of task {h.task}, this agent runs task {self.task}")
        if h.sender not in self.expected:
            raise FrameError("unknown_sender", f"{h.sender!r} is not expected on the {self.kind} port", h)
        if self.expected[h.sender] != peer_ip:
            raise FrameError("unknown_sender", f"{h.sender!r} connected from {peer_ip}, "
                             f"expected {self.expected[h.sender]}", h)
        conn.settimeout(None)
        return h.sender

    def _serve(self, conn: socket.socket, peer_ip: str) -> None:
        priority.enter_transfer()
        try:
            peer = self._identify(conn, peer_ip)
        except (FrameError, OSError) as e:
            self.on_reject(peer_ip, e, self.kind)
            conn.close()
            return
        finally:
            self._unidentified.release()
        with self._lock:
            old = self.live.get(peer)
            self.live[peer] = conn
        if old is not None:
            old.close()  # a reconnect replaces the earlier connection
        self.on_accept(peer)
        error: BaseException | None = None
        try:
            gaps = out_of_order(conn)  # segments out of order so far: a frame with one more is not stamped
            while not self._stopping.is_set():
                got = read_frame_at(conn, max_payload_bytes=self.max_payload_bytes, gaps=gaps)
                if got is None:
                    break
                header, payload, arrived, gaps = got
                ack_now(conn)
                if header.sender != peer or header.task != self.task:
                    raise FrameError("wrong_sender", f"frame says it is from {header.sender!r} of task "
                                     f"{header.task} on {peer}'s connection", header)
                self.on_frame(peer, header, payload, arrived)
        except FrameError as e:
            error = e
            self.on_reject(peer_ip, e, self.kind)  # the stream position is unknown: drop the connection
        except OSError as e:
            error = e
        finally:
            with self._lock:
                mine = self.live.get(peer) is conn
                if mine:
                    del self.live[peer]
            conn.close()
        if mine and not self._stopping.is_set():
            self.on_lost(peer, error)
