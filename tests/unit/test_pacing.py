"""A paced copy (`workers.pacing`): each segment leaves when a link of the pacing rate would have
finished serializing it, never earlier; what comes due within the slack goes together; an idle link
starts from now, a busy one from where it left off. A fake clock makes the schedule exact."""

from __future__ import annotations

import pytest

from orchestrator.runtime.task_runner import pace_rates
from orchestrator.scheduling.schedule import OverlayEdge, Schedule
from topologies.shaping import BURST_FLOOR_BYTES, BURST_WINDOW_S, burst_bytes
from workers.config import AgentConfig, Peer
from workers.pacing import FRAME_OVERHEAD_BYTES, LEAD_MAX_MBPS, LEAD_SHARE, SLACK_S, Pacer


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


def paced(rate_mbps: float) -> tuple[FakeClock, FakeSocket, Pacer]:
    """A pacer on a fake clock and socket, one segment (a full frame) already sent on its link."""
    clock = FakeClock()
    sock = FakeSocket(clock)
    pacer = Pacer(rate_mbps, clock=clock, sleep=clock.sleep)
    pacer.send(sock, [bytes(1_448)], mss=1_448)  # type: ignore[arg-type]
    return clock, sock, pacer


RATE_MBPS = 10.0  # 1,250,000 bytes a second: a 1,514-byte frame every 1.21 ms (no lead: above LEAD_MAX_MBPS)
BPS = RATE_MBPS * 1e6 / 8


def test_each_segment_leaves_when_the_link_has_serialized_it_and_the_last_never_early() -> None:
    clock = FakeClock()
    sock = FakeSocket(clock)
    pacer = Pacer(RATE_MBPS, clock=clock, sleep=clock.sleep)

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
    pacer = Pacer(fast, clock=clock, sleep=clock.sleep)
    pacer.send(sock, [bytes(1_448 * 8)], mss=1_448)  # type: ignore[arg-type]
    assert sum(n for _t, n in sock.sent) == 1_448 * 8
    assert len(sock.sent) < 8  # batched
    frame_s = SLACK_S / 4
    for i, (t, _n) in enumerate(sock.sent):  # every write: its first segment due no later than now + slack
        assert t >= 100 + frame_s - SLACK_S - 1e-12, i


def test_on_a_link_whose_bucket_holds_one_frame_a_segment_behind_another_goes_half_a_frame_early() -> None:
    # At 1 Mbit/s htb's burst is one frame: the first segment after an idle gap goes when the link
    # has serialized it (it passes at once), each one behind it `LEAD_SHARE` of its own
    # serialization early, so that it waits in its class when the link frees.
    assert Pacer(1.0).lead and not Pacer(RATE_MBPS).lead
    clock = FakeClock()
    sock = FakeSocket(clock)
    pacer = Pacer(1.0, clock=clock, sleep=clock.sleep)
    frame_s = (1_448 + FRAME_OVERHEAD_BYTES) / 125_000
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


def test_the_lead_stops_where_htbs_burst_grows_beyond_one_frame() -> None:
    assert LEAD_MAX_MBPS == pytest.approx(BURST_FLOOR_BYTES * 8 / BURST_WINDOW_S / 1e6)
    assert burst_bytes(LEAD_MAX_MBPS * 0.999) == BURST_FLOOR_BYTES < burst_bytes(LEAD_MAX_MBPS * 1.01)


def test_a_rate_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="must be positive"):
        Pacer(0.0)


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
