"""A relay's forward of the broadcast (docs/data-plane.md, "A relay's chunk, ready when it arrived"):
the reader that checked a GLOBAL chunk forwards it (`workers.round_parts.CutThrough`) exactly as
the round loop accepts it, ready when the kernel received it (`workers.transport.read_frame_at`),
so a paced link makes up the relay's own time; a lane's next copy is ready when the link finished
the one before by its schedule. Recording senders and fake clocks make it exact; the arrival stamps
are read off a real loopback connection."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence

import pytest

from tests.unit.test_pacing import FakeClock, FakeSocket
from workers.arrivals import out_of_order, stamp_arrivals
from workers.framing import FIXED, FIXED_LEN, Buffer, Header, encode_frame
from workers.pacing import FRAME_OVERHEAD_BYTES, Pacer
from workers.round_parts import CutThrough, Lanes
from workers.transport import read_frame_at

RATE_MBPS = 10.0
BPS = RATE_MBPS * 1e6 / 8


def wire_s(payload: int) -> float:
    return (payload + FRAME_OVERHEAD_BYTES) / BPS


# -- when a chunk arrived ---------------------------------------------------------------------------
def _pair() -> tuple[socket.socket, socket.socket]:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname())
    conn, _ = server.accept()
    server.close()
    return client, conn


def test_a_stamped_connection_says_when_the_kernel_received_each_frame() -> None:
    client, conn = _pair()
    with client, conn:
        assert stamp_arrivals(conn)
        time.sleep(0.05)  # the kernel turns its receive stamps on a moment later when none were on
        before = time.monotonic()
        client.sendall(b"".join(bytes(p) for p in encode_frame(Header("GLOBAL", 7, 1, "P"), bytes(5_000))))
        time.sleep(0.1)  # read well after it arrived: the stamp is the arrival's, not the read's
        header, payload, arrived, _gaps = read_frame_at(conn, max_payload_bytes=1 << 16)  # type: ignore[misc]
        read = time.monotonic()
        assert header.type == "GLOBAL" and len(payload) == 5_000
        assert arrived is not None and before - 0.02 <= arrived <= read - 0.05
        client.sendall(b"".join(bytes(p) for p in encode_frame(Header("STOP", 7, 1, "P"), b"")))
        assert read_frame_at(conn, max_payload_bytes=1 << 16)[2] is None  # type: ignore[index]  # nothing to stamp


def test_a_frame_with_a_segment_out_of_order_since_it_began_gives_no_arrival() -> None:
    # A TCP read's stamp is its last in-sequence segment's, which after a loss came before the
    # retransmission that completed the read: the reader counts out-of-order segments around it.
    client, conn = _pair()
    with client, conn:
        assert stamp_arrivals(conn)
        time.sleep(0.05)
        frame = b"".join(bytes(p) for p in encode_frame(Header("GLOBAL", 7, 1, "P"), bytes(100)))
        client.sendall(frame)
        time.sleep(0.02)
        gaps = out_of_order(conn)
        assert gaps is not None
        first = read_frame_at(conn, max_payload_bytes=1 << 16, gaps=gaps - 1)
        assert first is not None and first[2] is None
        assert first[3] == gaps, "the count after the frame: the next frame's baseline"
        client.sendall(frame)
        time.sleep(0.02)
        assert read_frame_at(conn, max_payload_bytes=1 << 16, gaps=first[3])[2] is not None  # type: ignore[index]


def test_a_connection_not_stamped_gives_no_arrival() -> None:
    client, conn = _pair()
    with client, conn:
        client.sendall(b"".join(bytes(p) for p in encode_frame(Header("GLOBAL", 7, 1, "P"), bytes(100))))
        got = read_frame_at(conn, max_payload_bytes=1 << 16)
        assert got is not None and got[2] is None


# -- the pacer, from a frame's arrival --------------------------------------------------------------
def test_a_frame_ready_before_now_makes_up_the_delay_and_never_runs_ahead() -> None:
    clock = FakeClock()
    sock = FakeSocket(clock)
    pacer = Pacer(RATE_MBPS, clock=clock, sleep=clock.sleep, lead_share=0.0)
    # Arrived 2 ms ago, three segments of 1.21 ms each on the link: the first was due 0.79 ms ago and
    # goes at once, the others at their time, the last never before the link has carried it all.
    pacer.send(sock, [bytes(3 * 1_448)], mss=1_448, ready_at=clock.now - 2e-3, last=True)  # type: ignore[arg-type]
    one = wire_s(1_448)
    assert [round(t - 100.0, 6) for t, _ in sock.sent] == [0.0, round(2 * one - 2e-3, 6), round(3 * one - 2e-3, 6)]
    assert [n for _, n in sock.sent] == [1_448] * 3
    assert pacer.free_at == pytest.approx(100.0 - 2e-3 + 3 * one)


# -- the relay's forward ----------------------------------------------------------------------------
class Recorder:
    """A `Lanes` stand-in: what the relay forwards (child, round, chunk, last, ready_at, first callback)."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, int, bool, float | None, bool]] = []

    def send(self, child: str, frame: Sequence[Buffer], r: int, on_sent: Callable[[], None] | None, last: bool,
             ready_at: float | None = None) -> None:
        _m, _v, _f, _r, hlen, _p = FIXED.unpack_from(bytes(frame[0]), 0)
        header = Header.from_json(bytes(frame[0])[FIXED_LEN:FIXED_LEN + hlen])
        assert header.sender == "R" and bytes(frame[1]) == bytes(4)  # its own header, the payload as received
        self.sent.append((child, r, header.chunk, last, ready_at, on_sent is not None))


def _relay(children: Sequence[str] = ("B", "A")) -> tuple[CutThrough, Recorder, set[int], list[tuple[int, str, bool]]]:
    rec, finished, firsts = Recorder(), set(), []

    def on_first(r: int, child: str, on_arrival: bool) -> Callable[[], None]:
        firsts.append((r, child, on_arrival))
        return lambda: None

    return CutThrough("R", 3, list(children), rec, finished, on_first), rec, finished, firsts  # type: ignore[arg-type]


def chunk(cut: CutThrough, r: int, k: int, arrived: float | None = 50.0) -> bool:
    return cut.take(Header("GLOBAL", 7, r, "P", chunk=k, chunks=3, nbytes=4), bytearray(4), arrived)


def test_a_relay_forwards_each_chunk_once_in_order_ready_when_it_arrived() -> None:
    cut, rec, _, firsts = _relay()
    assert chunk(cut, 1, 1) is False  # not the next one: chunk 0 comes first
    assert chunk(cut, 1, 0) and chunk(cut, 1, 0) is False  # once
    assert chunk(cut, 1, 1, arrived=None) and chunk(cut, 1, 2, arrived=51.0)
    assert chunk(cut, 1, 2) is False  # the copy is whole
    assert rec.sent == [("A", 1, 0, False, 50.0, True), ("B", 1, 0, False, 50.0, True),
                        ("A", 1, 1, False, None, False), ("B", 1, 1, False, None, False),
                        ("A", 1, 2, True, 51.0, False), ("B", 1, 2, True, 51.0, False)]
    assert firsts == [(1, "A", True), (1, "B", True)]


def test_a_relay_forwards_nothing_the_round_loop_would_reject() -> None:
    cut, rec, finished, _ = _relay()
    assert chunk(cut, 2, 0)
    assert chunk(cut, 1, 0) is False  # an older round than one begun: the loop gave it up
    cut.abandon(2)  # given up here (no GLOBAL by the deadline, its parent lost)
    assert chunk(cut, 2, 1) is False
    finished.add(3)
    assert chunk(cut, 3, 0) is False  # finished here
    assert chunk(cut, 4, 0) and [s[:3] for s in rec.sent] == [("A", 2, 0), ("B", 2, 0), ("A", 4, 0), ("B", 4, 0)]
    cut.abandon(5)  # given up before any of it came (the parent lost, an upload child's chunk began it)
    assert chunk(cut, 5, 0) is False
    leaf, leaf_rec, _, _ = _relay(children=())
    assert chunk(leaf, 1, 0) is False and leaf_rec.sent == []  # a leaf has nothing to forward


# -- lanes ------------------------------------------------------------------------------------------
class PacedOut:
    """A sender on a paced link: records each frame's ready time; `paced_until` as the test sets it."""

    def __init__(self, child: str, log: list[tuple[str, float | None]], pending: list[Callable[[], None]]) -> None:
        self.child, self.log, self.pending = child, log, pending
        self.paced_until: float | None = None

    def send(self, pieces: Sequence[Buffer], *, round: int, on_sent: Callable[[], None] | None = None,
             drain: bool = False, last: bool = False, ready_at: float | None = None) -> None:
        self.log.append((self.child, ready_at))
        if on_sent is not None:
            self.pending.append(on_sent)


def _lane() -> tuple[Lanes, dict[str, PacedOut], list[tuple[str, float | None]], list[Callable[[], None]]]:
    log: list[tuple[str, float | None]] = []
    pending: list[Callable[[], None]] = []
    outs = {c: PacedOut(c, log, pending) for c in "AB"}
    lanes = Lanes([("A", "B")], outs, lambda r, child: None)  # type: ignore[arg-type]
    lanes.send("A", [b"a0"], 1, None, False, ready_at=10.0)
    lanes.send("B", [b"b0"], 1, None, False, ready_at=10.0)  # held: B's turn comes after A's copy
    lanes.send("A", [b"a1"], 1, None, True, ready_at=10.5)
    lanes.send("B", [b"b1"], 1, None, True, ready_at=12.5)
    return lanes, outs, log, pending


def test_a_lanes_next_copy_is_ready_when_the_link_finished_the_one_before_by_its_schedule() -> None:
    _, outs, log, pending = _lane()
    assert log == [("A", 10.0), ("A", 10.5)]
    outs["A"].paced_until = 12.0  # A's copy ends on the link at 12.0 by its schedule
    while pending:
        pending.pop(0)()
    assert log[2:] == [("B", 12.0), ("B", 12.5)]  # no earlier than A's end, nor than each arrived


@pytest.mark.parametrize("event", ["lost", "late"])
def test_after_a_lost_child_or_a_missed_deadline_what_waited_is_ready_now(event: str) -> None:
    # The link's schedule is not known then: the copies waiting start from now, not from when they arrived.
    lanes, _, log, _ = _lane()
    lanes.lost("A") if event == "lost" else lanes.late(1)
    assert log[2:] == [("B", None), ("B", None)]


def test_the_listener_hands_each_frame_its_arrival() -> None:
    from workers.transport import Listener, Outbound

    got: list[tuple[str, float | None]] = []
    done = threading.Event()

    def on_frame(peer: str, header: Header, payload: bytearray, arrived: float | None) -> None:
        got.append((header.type, arrived))
        done.set()

    accepted = threading.Event()
    listener = Listener(host="127.0.0.1", port=0, task=7, kind="broadcast", expected={"P": "127.0.0.1"},
                        max_payload_bytes=1 << 16, on_frame=on_frame, on_lost=lambda *_: None,
                        on_accept=lambda *_: accepted.set(), on_reject=lambda *_: None)
    listener.start()
    out = Outbound(peer="R", peer_host="127.0.0.1", port=listener.sock.getsockname()[1], local_host="127.0.0.1",
                   task=7, site="P", connect_timeout_s=5.0, on_lost=lambda *_: None, on_connect=lambda *_: None)
    out.start()
    try:
        assert accepted.wait(5.0)
        time.sleep(0.05)  # as a task's first GLOBAL comes after its set-up: the stamps are on by then
        out.send(encode_frame(Header("GLOBAL", 7, 1, "P"), bytes(64)), round=1)
        assert done.wait(5.0)
    finally:
        out.flush_and_close(5.0)
        listener.close()
    assert got[0][0] == "GLOBAL" and got[0][1] is not None and got[0][1] <= time.monotonic()
