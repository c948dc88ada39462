"""A paced copy (`workers.pacing`): each segment leaves when a link of the pacing rate would have
finished serializing it, never earlier; what comes due within the slack goes together; an idle link
starts from now, a busy one from where it left off; a copy's final segment is never led. A fake
clock makes the schedule exact."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from orchestrator.runtime.task_runner import pace_rates
from orchestrator.scheduling.schedule import OverlayEdge, Schedule
from workers.config import AgentConfig, Peer
from workers.framing import Buffer
from workers.pacing import FRAME_OVERHEAD_BYTES, LEAD_SHARE, SLACK_S, Pacer
from workers.transport import Outbound


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


class FakeSocket:
    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.sent: list[tuple[float, int]] = []

    def sendmsg(self, views: list[memoryview]) -> int:
        n = sum(v.nbytes for v in views)
        self.sent.append((self.clock.now, n))
        return n


def paced(rate_mbps: float, lead_share: float = 0.0) -> tuple[FakeClock, FakeSocket, Pacer]:
    """A pacer on a fake clock and socket, one segment (a full frame) already sent on its link;
    without a lead unless `lead_share` says (the schedule the lead is taken from)."""
    clock = FakeClock()
    sock = FakeSocket(clock)
    pacer = Pacer(rate_mbps, clock=clock, sleep=clock.sleep, lead_share=lead_share)
    pacer.send(sock, [bytes(1_448)], mss=1_448)  # type: ignore[arg-type]
    return clock, sock, pacer


RATE_MBPS = 10.0  # 1,250,000 bytes a second: a 1,514-byte frame every 1.21 ms
BPS = RATE_MBPS * 1e6 / 8


def test_each_segment_leaves_when_the_link_has_serialized_it_and_the_last_never_early() -> None:
    clock = FakeClock()
    sock = FakeSocket(clock)
    pacer = Pacer(RATE_MBPS, clock=clock, sleep=clock.sleep, lead_share=0.0)

    sent = pacer.send(sock, [b"h" * 100, bytearray(3_000)], mss=1_448)  # type: ignore[arg-type]

    frame_s = (1_448 + FRAME_OVERHEAD_BYTES) / BPS
    assert sent == 3_100
    # Three segments: 1448, 1448 and 204 bytes, each at the end of its own serialization.
    assert [n for _t, n in sock.sent] == [1_448, 1_448, 204]
    due = [100 + frame_s, 100 + 2 * frame_s, 100 + 2 * frame_s + (204 + FRAME_OVERHEAD_BYTES) / BPS]
    assert [t for t, _n in sock.sent] == pytest.approx(due)
    assert all(t >= d - 1e-12 for (t, _n), d in zip(sock.sent, due, strict=True))
    assert pacer.free_at == pytest.approx(due[-1])


def test_a_frame_right_behind_goes_on_from_where_the_link_left_off_and_an_idle_link_from_now() -> None:
    clock, sock, pacer = paced(RATE_MBPS)
    first_end = pacer.free_at
    clock.now = first_end - 0.005  # the next frame is queued before the link is free (the clock is back)
    pacer.send(sock, [bytes(1_448)], mss=1_448)  # type: ignore[arg-type]
    assert sock.sent[-1][0] == pytest.approx(first_end + (1_448 + FRAME_OVERHEAD_BYTES) / BPS)
    clock.now = pacer.free_at + 10.0  # long idle: starts now, not at the last end
    pacer.send(sock, [bytes(1_448)], mss=1_448)  # type: ignore[arg-type]
    assert sock.sent[-1][0] == pytest.approx(clock.now)
    assert sock.sent[-1][0] == pytest.approx(pacer.free_at)


def test_a_frame_queued_while_the_link_was_busy_keeps_the_links_schedule_when_the_thread_is_late() -> None:
    # The sender thread reaches the second frame half a frame's time after the link finished the
    # first (its sleep overran): the frame was queued before that, so it starts where the link left
    # off, and a segment already due goes at once.
    clock, sock, pacer = paced(RATE_MBPS)
    first_end = pacer.free_at
    frame_s = (1_448 + FRAME_OVERHEAD_BYTES) / BPS
    clock.now = first_end + 0.5 * frame_s
    pacer.send(sock, [bytes(2 * 1_448)], mss=1_448, ready_at=first_end - 0.5 * frame_s)  # type: ignore[arg-type]
    assert [t for t, _n in sock.sent[1:]] == pytest.approx([first_end + frame_s, first_end + 2 * frame_s])
    # Late by more than a segment: the segments due go together at once, the rest on the schedule.
    clock.now = pacer.free_at + 1.5 * frame_s
    before = pacer.free_at
    pacer.send(sock, [bytes(2 * 1_448)], mss=1_448, ready_at=before)  # type: ignore[arg-type]
    (t1, n1), (t2, n2) = sock.sent[-2:]
    assert (n1, n2) == (1_448, 1_448)
    assert t1 == pytest.approx(before + 1.5 * frame_s)  # the first, due, at once
    assert t2 == pytest.approx(before + 2 * frame_s) == pytest.approx(pacer.free_at)  # the second on time
    # Queued after the link went idle: it starts when it was queued.
    pacer.send(sock, [bytes(1_448)], mss=1_448, ready_at=pacer.free_at + 1.0)  # type: ignore[arg-type]
    assert pacer.free_at == pytest.approx(before + 2 * frame_s + 1.0 + frame_s)


def test_segments_due_within_the_slack_go_in_one_write() -> None:
    clock = FakeClock()
    sock = FakeSocket(clock)
    fast = (1_448 + FRAME_OVERHEAD_BYTES) * 8 / 1e6 / (SLACK_S / 4)  # four segments fit in the slack
    pacer = Pacer(fast, clock=clock, sleep=clock.sleep, lead_share=0.0)
    pacer.send(sock, [bytes(1_448 * 8)], mss=1_448)  # type: ignore[arg-type]
    assert sum(n for _t, n in sock.sent) == 1_448 * 8
    assert len(sock.sent) < 8  # batched
    frame_s = SLACK_S / 4
    for i, (t, _n) in enumerate(sock.sent):  # every write: its first segment due no later than now + slack
        assert t >= 100 + frame_s - SLACK_S - 1e-12, i


@pytest.mark.parametrize("rate_mbps", [1.0, RATE_MBPS])
def test_a_segment_behind_another_goes_half_a_frame_early_at_every_rate(rate_mbps: float) -> None:
    # The first segment after an idle gap goes when the link has serialized it (htb's bucket lets
    # it through at once), each one behind it `LEAD_SHARE` of its own serialization early, so that
    # it waits in its class when the link frees; the same at 1 Mbit/s (htb's bucket one frame) and
    # at 10 (several).
    assert Pacer(rate_mbps).lead_share == LEAD_SHARE
    clock = FakeClock()
    sock = FakeSocket(clock)
    pacer = Pacer(rate_mbps, clock=clock, sleep=clock.sleep)
    frame_s = (1_448 + FRAME_OVERHEAD_BYTES) / (rate_mbps * 1e6 / 8)
    lead_s = LEAD_SHARE * frame_s
    pacer.send(sock, [bytes(3 * 1_448)], mss=1_448)  # type: ignore[arg-type]
    assert [t for t, _n in sock.sent] == pytest.approx(
        [100 + frame_s, 100 + 2 * frame_s - lead_s, 100 + 3 * frame_s - lead_s])
    assert pacer.free_at == pytest.approx(100 + 3 * frame_s)  # the link's schedule is unchanged
    # A frame queued while the link still carries the last segment: its first goes early too.
    clock.now = pacer.free_at - 0.001
    pacer.send(sock, [bytes(1_448)], mss=1_448, ready_at=clock.now)  # type: ignore[arg-type]
    assert sock.sent[-1][0] == pytest.approx(100 + 4 * frame_s - lead_s)
    # After an idle gap the first segment waits for its own serialization again.
    clock.now = pacer.free_at + 1.0
    start = clock.now
    pacer.send(sock, [bytes(1_448)], mss=1_448)  # type: ignore[arg-type]
    assert sock.sent[-1][0] == pytest.approx(start + frame_s)


def test_the_final_segment_of_a_copy_is_never_led_so_the_copy_is_not_whole_before_its_link_allows() -> None:
    # htb sends whenever its class has tokens, and after an idle gap its bucket has them: a led
    # segment passes that much early. The segments inside a copy may (the copy is whole only with its last),
    # but the copy's final segment goes at its time, so the child holds it no earlier than the link
    # has serialized every byte; the frames before it (`last` not set) keep their lead.
    clock, sock, pacer = paced(1.0, lead_share=LEAD_SHARE)
    frame_s = (1_448 + FRAME_OVERHEAD_BYTES) / 125_000
    lead_s = LEAD_SHARE * frame_s
    start = pacer.free_at
    clock.now = start - 0.001  # queued right behind the first: every segment would be led
    pacer.send(sock, [bytes(2 * 1_448)], mss=1_448, ready_at=clock.now)  # type: ignore[arg-type]
    pacer.send(sock, [bytes(2 * 1_448)], mss=1_448, ready_at=clock.now, last=True)  # type: ignore[arg-type]
    times = [t for t, _n in sock.sent[1:]]
    assert times == pytest.approx([start + (i + 1) * frame_s - lead_s for i in range(3)] + [start + 4 * frame_s])
    assert times[-1] >= pacer.free_at - 1e-12  # the copy's end: not before the link's schedule
    # A copy of one segment, right behind: that segment is its final one, so it is not led either.
    clock.now = pacer.free_at - 0.001
    pacer.send(sock, [bytes(1_448)], mss=1_448, ready_at=clock.now, last=True)  # type: ignore[arg-type]
    assert sock.sent[-1][0] == pytest.approx(pacer.free_at) == pytest.approx(start + 5 * frame_s)


def test_a_rate_that_is_not_positive_or_a_lead_of_a_segment_or_more_is_refused() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        Pacer(0.0)
    for share in (-0.1, 1.0):
        with pytest.raises(ValueError, match="at least 0 and less than a segment"):
            Pacer(1.0, lead_share=share)


def _schedule() -> Schedule:
    edges = (OverlayEdge("broadcast", "G", "A", ("G", "X", "A")), OverlayEdge("broadcast", "A", "B", ("A", "B")),
             OverlayEdge("upload", "B", "A", ("B", "A")), OverlayEdge("upload", "A", "G", ("A", "X", "G")))
    return Schedule(task_id=1, scheduler="mst", global_site="G", local_sites=("A", "B"), demand_mbps=1.0, edges=edges)


def test_each_edge_is_paced_at_its_bottleneck_link() -> None:
    rates = {frozenset("GX"): 3.125, frozenset("XA"): 1.5, frozenset("AB"): 3.125}
    paces = pace_rates(_schedule(), lambda u, v: rates[frozenset((u, v))])
    assert paces == {"G": {"broadcast:A": 1.5}, "A": {"broadcast:B": 3.125, "upload:G": 1.5},
                     "B": {"upload:A": 3.125}}


@pytest.mark.parametrize("pace, match", [({"broadcast:Z": 1.0}, "not one of its outbound connections"),
                                         ({"upload:G": 0}, "must be a finite number > 0"),
                                         ({"upload:G": float("inf")}, "must be a finite number > 0"),
                                         ({"upload:G": True}, "must be a finite number > 0")])
def test_an_agent_config_with_a_bad_pace_is_refused(pace: dict[str, object], match: str) -> None:
    good = AgentConfig(task=1, site="A", host="10.0.0.2", broadcast_port=5001, upload_port=5002,
                       broadcast_parent=Peer(site="G", host="10.0.0.1"), upload_parent=Peer(site="G", host="10.0.0.1"),
                       part_index=0, pace_mbps={"upload:G": 2.5})
    assert AgentConfig.from_dict(good.to_dict()).pace_mbps == {"upload:G": 2.5}
    with pytest.raises(ValueError, match=match):
        AgentConfig.from_dict({**good.to_dict(), "pace_mbps": pace})


@contextlib.contextmanager
def loopback_outbound(pace_mbps: float) -> Iterator[Outbound]:
    """A started `Outbound` to a plain server on loopback that reads everything; closed after."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def drain() -> None:
        conn, _ = server.accept()
        with conn:
            while conn.recv(1 << 16):
                pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out = Outbound(peer="Q", peer_host="127.0.0.1", port=server.getsockname()[1], local_host="127.0.0.1", task=3,
                   site="P", connect_timeout_s=5.0, on_lost=lambda *_: None, on_connect=lambda *_: None,
                   pace_mbps=pace_mbps)
    try:
        yield out
    finally:
        assert out.flush_and_close(5.0)
        server.close()
        reader.join(5.0)


def test_an_outbound_connection_hands_each_frames_last_flag_to_its_pacer() -> None:
    # A real connection on loopback: the sender thread passes `last` from `Outbound.send` to the
    # pacer, so a copy's final frame is sent unled.
    class Recording(Pacer):
        def __init__(self) -> None:
            super().__init__(1_000.0)
            self.lasts: list[bool] = []

        def send(self, sock: socket.socket, pieces: Sequence[Buffer], *, mss: int | None = None,
                 ready_at: float | None = None, last: bool = False) -> int:
            self.lasts.append(last)
            return super().send(sock, pieces, mss=mss, ready_at=ready_at, last=last)

    sent = threading.Event()
    recording = Recording()
    with loopback_outbound(1_000.0) as out:
        out.pacer = recording
        out.start()
        out.send([b"a" * 3_000], round=1)
        out.send([b"b" * 3_000], round=1, last=True, on_sent=sent.set)
        assert sent.wait(5.0)
    assert recording.lasts == [False, True]


def test_a_frames_start_on_its_link_is_when_it_was_ready_or_when_the_link_was_free() -> None:
    clock, sock, pacer = paced(RATE_MBPS)  # an idle link: the first frame started when it was given
    assert pacer.started_at == 100.0
    first_end = pacer.free_at
    pacer.send(sock, [bytes(1_448)], mss=1_448, ready_at=first_end - 0.004)  # type: ignore[arg-type]
    assert pacer.started_at == first_end  # queued while the link was busy: where it left off
    clock.now = pacer.free_at + 1.0
    pacer.send(sock, [bytes(1_448)], mss=1_448, ready_at=clock.now - 0.5)  # type: ignore[arg-type]
    assert pacer.started_at == clock.now - 0.5  # ready during an idle gap, sent late: when it was ready


@pytest.mark.parametrize("pace_mbps", [1.0, 0.0], ids=["paced", "unpaced"])
def test_an_outbound_connection_says_when_the_frame_it_reports_started_on_its_link(pace_mbps: float) -> None:
    # What a copy's `forward_first` is logged at (`workers.rounds`): the start of its first chunk on
    # the link, not the end of its write. Paced at 1 Mbit/s, 3,000 bytes (one segment: loopback's MSS
    # is 64 KB) take 24.5 ms to serialize, and the write ends once they have (within the slack).
    got: list[tuple[float | None, float]] = []
    with loopback_outbound(pace_mbps) as out:
        out.start()
        given = time.monotonic()
        out.send([b"c" * 3_000], round=1, last=True, on_sent=lambda: got.append((out.started_at, time.monotonic())))
        deadline = time.monotonic() + 5.0
        while not got and time.monotonic() < deadline:
            time.sleep(0.01)  # poll interval for the sender thread's callback
    ((started, reported),) = got
    assert started is not None and given <= started <= reported
    if pace_mbps:
        assert reported - started >= (3_000 + FRAME_OVERHEAD_BYTES) / (pace_mbps * 1e6 / 8) - SLACK_S
