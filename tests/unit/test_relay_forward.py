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
from typing import Any

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
        self.started_at: float | None = None

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


# -- the relay's training, after its forward --------------------------------------------------------
def test_a_copy_counts_from_its_last_chunks_hand_over_until_it_was_written() -> None:
    from workers.round_parts import Forwards

    fw = Forwards()
    done_a, done_b = fw.sending(1, "A"), fw.sending(1, "B")
    assert fw.wait(1, 0.0) is False  # both still being forwarded
    done_a()
    done_a()  # a second call changes nothing
    assert fw.wait(1, 0.04) is False  # waited a quarter of a modelled 0.04 s
    t = threading.Timer(0.05, done_b)
    t.start()
    assert fw.wait(1, 20.0) is True and not t.is_alive()
    assert fw.wait(2, 0.0) is True  # nothing of round 2 was handed over: nothing to wait for
    fw.sending(3, "A")  # a child lost mid-copy: its callback never runs
    assert fw.wait(4, 0.0) is True and fw.wait(3, 0.0) is True  # a later round forgets it


def test_a_relay_counts_each_childs_copy_with_its_last_chunk() -> None:
    from workers.round_parts import Forwards

    class Calls(Recorder):
        def __init__(self) -> None:
            super().__init__()
            self.callbacks: list[Callable[[], None]] = []

        def send(self, child: str, frame: Sequence[Buffer], r: int, on_sent: Callable[[], None] | None, last: bool,
                 ready_at: float | None = None) -> None:
            super().send(child, frame, r, on_sent, last, ready_at)
            if last and on_sent is not None:
                self.callbacks.append(on_sent)

    rec, fw, firsts = Calls(), Forwards(), []
    cut = CutThrough("R", 3, ["A", "B"], rec, set(), lambda r, c, a: lambda: firsts.append((r, c)), fw)  # type: ignore[arg-type]
    assert chunk(cut, 1, 0) and chunk(cut, 1, 1)
    assert fw.wait(1, 0.0) is True  # not counted before the last chunk is handed over
    assert chunk(cut, 1, 2) and [s[:4] for s in rec.sent[-2:]] == [("A", 1, 2, True), ("B", 1, 2, True)]
    assert fw.wait(1, 0.0) is False and len(rec.callbacks) == 2
    for cb in rec.callbacks:
        cb()
    assert fw.wait(1, 0.0) is True
    one = CutThrough("R", 1, ["A"], rec, set(), lambda r, c, a: lambda: firsts.append((r, c)), fw)  # type: ignore[arg-type]
    rec.callbacks.clear()
    assert one.take(Header("GLOBAL", 7, 1, "P", chunk=0, chunks=1, nbytes=4), bytearray(4), 50.0)
    assert fw.wait(1, 0.0) is False
    rec.callbacks[0]()  # a one-chunk copy: its first and last chunk's callbacks both run
    assert fw.wait(1, 0.0) is True and firsts == [(1, "A")]


#: Each UPDATE chunk sent in `_chain`: (sender, round, chunk, its ``ready_at``, the arrival stamp
#: its receiver was given).
UPLOADS: list[tuple[str, int, int, float | None, float | None]] = []


def _chain(rounds: int, forward_s: float | None, train_s_per_round: float,
           arrived_ago_s: float | None = None) -> tuple[dict[str, Any], list[float], list[float]]:
    """G -> R -> L in process (`Wire`), R's copy to L written `forward_s` after it was handed over
    (None: never: a child lost mid-copy), each GLOBAL frame from G and each UPDATE frame stamped as
    arrived in its receiver's kernel `arrived_ago_s` before its reader took it (None: not stamped;
    `UPLOADS` records the UPDATEs); each role's events, when R's trainings began work, and when
    R's copies to L were written."""
    import dataclasses
    import io
    import json

    from orchestrator.runtime.task_runner import FLOptions, agent_configs
    from orchestrator.scheduling.schedule import Schedule
    from tests.unit.test_workers_selection import Recording, Wire, run_connected
    from workers.events import EventLog
    from workers.framing import chunk_layout
    from workers.rounds import RoundEngine

    worked: list[float] = []
    left: list[float] = []

    class Timed(Recording):
        def train(self) -> int:
            worked.append(time.monotonic())
            return super().train()

    class Paced(Wire):
        def send(self, pieces: Sequence[Buffer], *, round: int, on_sent: Callable[[], None] | None = None,
                 last: bool = False, ready_at: float | None = None) -> None:
            super().send(pieces, round=round, on_sent=None if last else on_sent)
            if last and on_sent is not None and forward_s is not None:
                def written(on_sent: Callable[[], None] = on_sent) -> None:
                    left.append(time.monotonic())
                    on_sent()
                threading.Timer(forward_s, written).start()  # its last segment leaves later, paced

    class Stamped(Wire):
        def send(self, pieces: Sequence[Buffer], *, round: int, on_sent: Callable[[], None] | None = None,
                 last: bool = False, ready_at: float | None = None) -> None:
            data = b"".join(bytes(p) for p in pieces)
            _m, _v, _f, _r, hlen, _p = FIXED.unpack_from(data, 0)
            header = Header.from_json(data[FIXED_LEN:FIXED_LEN + hlen])
            stamp = None if arrived_ago_s is None else time.monotonic() - arrived_ago_s
            if header.type == "UPDATE":
                UPLOADS.append((self.src, header.round, header.chunk, ready_at, stamp))
            if stamp is None:
                return super().send(pieces, round=round, on_sent=on_sent)
            self.dst().receive(self.kind, self.src, header, bytearray(data[FIXED_LEN + hlen:]), stamp)
            if on_sent is not None:
                on_sent()

    edge = {"G": Stamped, "R": Paced}
    sched = Schedule(task_id=3, scheduler="hand", global_site="G", local_sites=("R", "L"), demand_mbps=1.0,
                     broadcast_parent={"R": "G", "L": "R"}, upload_parent={"R": "G", "L": "R"})
    addrs = {n: f"127.0.0.{i + 1}" for i, n in enumerate(sched.overlay_nodes)}
    cfgs = {n: dataclasses.replace(c, train_s_per_round=train_s_per_round) for n, c in agent_configs(
        sched, addresses=addrs, options=FLOptions(rounds=rounds, local_epochs=1, max_chunk_bytes=4096,
                                                  child_timeout_s=60)).items()}
    learners = {n: (Timed if n == "R" else Recording)(c) for n, c in cfgs.items()}
    layout = chunk_layout(learners["G"].template, cfgs["G"].max_chunk_bytes)
    engines: dict[str, RoundEngine] = {}
    logs = {n: io.StringIO() for n in cfgs}
    sent: list[tuple[str, Any, int]] = []
    for n, c in cfgs.items():
        engines[n] = RoundEngine(c, learners[n], layout, EventLog(c, logs[n]),
                                 broadcast_out={p.site: edge.get(n, Wire)(
                                     n, "broadcast", lambda p=p: engines[p.site], sent) for p in c.broadcast_children},
                                 upload_out=None if c.upload_parent is None else Stamped(
                                     n, "upload", lambda up=c.upload_parent: engines[up.site], sent))
    UPLOADS.clear()
    run_connected(cfgs, engines)
    return {n: [json.loads(line) for line in logs[n].getvalue().splitlines()] for n in cfgs}, worked, left


def _at(events: list[dict[str, Any]], name: str) -> list[float]:
    return [e["t"] for e in events if e["event"] == name]


def test_a_relays_training_works_once_its_forward_left_and_its_time_runs_from_the_arrival() -> None:
    # Its modelled round is 2 s; the copy to L leaves 0.15 s after the relay handed it over, well before
    # the relay's wait for it ends (a quarter of its modelled time: with 1 s, a timer late by 0.1 s on
    # a loaded host let the work begin first).
    events, worked, left = _chain(2, 0.15, 2.0)
    starts, ends = _at(events["R"], "train_start"), _at(events["R"], "train_end")
    assert len(worked) == len(starts) == len(left) == 2
    for began, written, work, end in zip(starts, left, worked, ends, strict=True):
        assert written <= work, "the work began once the copy had left"
        # held to its modelled time from the arrival (from the work's start it would end 0.15 s later)
        assert end - began == pytest.approx(2.0, abs=0.1)
    assert all(e["event"] != "train_overrun" for e in events["R"])


def test_a_relays_training_waits_at_most_a_quarter_of_its_modelled_time() -> None:
    from workers.round_parts import FORWARD_WAIT_SHARE

    events, worked, _ = _chain(1, None, 0.4)  # L's copy never reports leaving
    began = _at(events["R"], "train_start")[0]
    assert FORWARD_WAIT_SHARE * 0.4 - 1e-3 <= worked[0] - began <= 0.4


def test_a_node_holds_the_global_model_from_its_arrival_and_trains_from_then() -> None:
    # R's reader takes each GLOBAL frame 0.1 s after the kernel received it; R's modelled round is 0.5 s.
    from workers.events import of_monotonic

    before = time.monotonic()
    events, _, _ = _chain(1, 0.0, 0.5, arrived_ago_s=0.1)
    received, began = _at(events["R"], "global_received"), _at(events["R"], "train_start")
    ended = _at(events["R"], "train_end")
    assert received == began, "training starts, as modelled, when the node holds the model"
    # the stamp, not the moment R's loop logged it: L (not stamped) got its copy from R right after
    assert of_monotonic(before) - 0.1 <= received[0] <= _at(events["L"], "global_received")[0] - 0.09
    assert ended[0] - began[0] == pytest.approx(0.5, abs=0.05)


def test_an_aggregate_is_ready_when_its_last_contribution_was_and_the_round_ends_there() -> None:
    # Each UPDATE frame reaches its reader 0.1 s after its kernel received it. Each chunk of R's
    # aggregate is ready when the later of its two contributions was: L's chunk when it arrived,
    # R's own at its training's modelled end (0.4 s after R held the model).
    from workers.events import of_monotonic

    events, _, _ = _chain(2, 0.0, 0.4, arrived_ago_s=0.1)
    assert not [e for e in events["R"] if e["event"] == "train_overrun"]
    from_l = {(r, k): stamp for src, r, k, _, stamp in UPLOADS if src == "L"}
    from_r = {(r, k): (ready, stamp) for src, r, k, ready, stamp in UPLOADS if src == "R"}
    own_end = dict(zip((1, 2), (t + 0.4 for t in _at(events["R"], "train_start")), strict=True))
    assert from_l and set(from_l) == set(from_r)
    for (r, k), (ready, _) in from_r.items():
        assert ready is not None and from_l[(r, k)] is not None
        assert of_monotonic(ready) == pytest.approx(max(of_monotonic(from_l[(r, k)]), own_end[r]), abs=2e-3)
    assert all(ready is None or ready <= stamp + 0.1 for src, _, _, ready, stamp in UPLOADS if src == "L")
    last = max(k for _, k in from_r)
    for r, t in zip((1, 2), _at(events["G"], "aggregated"), strict=True):
        assert t == pytest.approx(of_monotonic(from_r[(r, last)][1]), abs=1e-9), "the round ends as R's last chunk arrived"
    late = [e["t"] for e in events["G"] if e["event"] == "round_complete"]
    assert all(t > a + 0.09 for t, a in zip(late, _at(events["G"], "aggregated"), strict=True))


def test_a_trainings_update_is_ready_at_its_modelled_end() -> None:
    from workers.compute import ready_since
    from workers.events import now

    t = time.monotonic()
    started = now() - 0.3  # modelled 0.2 s: it ended 0.1 s ago, the hold woke up late
    assert ready_since(started, 0.2, 0.0) == pytest.approx(t - 0.1, abs=0.01)
    assert ready_since(started, 0.5, 0.0) == pytest.approx(time.monotonic(), abs=0.01)  # not yet over: now
    assert ready_since(started, 0.2, 0.1) == pytest.approx(time.monotonic(), abs=0.01)  # overran: now
    assert ready_since(started, None, 0.0) == pytest.approx(time.monotonic(), abs=0.01)  # not modelled
