"""Lanes: copies of GLOBAL to children whose paths share a link go one after another.

`workers.rounds._Lanes` with recording senders (what each child was sent, in order), and
`orchestrator.runtime.task_runner.broadcast_lanes` on hand-made schedules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from orchestrator.runtime.task_runner import broadcast_lanes
from orchestrator.scheduling import OverlayEdge, Schedule
from workers.config import AgentConfig, Peer
from workers.framing import Buffer
from workers.rounds import _Lanes


class Out:
    """A sender that sends at once: records (child, round, frame) and runs `on_sent`."""

    def __init__(self, child: str, log: list[tuple[str, int, str]]) -> None:
        self.child, self.log = child, log

    def send(self, pieces: Sequence[Buffer], *, round: int, on_sent: Callable[[], None] | None = None) -> None:
        self.log.append((self.child, round, str(pieces[0])))
        if on_sent is not None:
            on_sent()


def lanes(spec: Sequence[Sequence[str]], children: Sequence[str]) -> tuple[_Lanes, list[tuple[str, int, str]],
                                                                         list[tuple[str, int, str]]]:
    """A `_Lanes` over recording senders; also the log of sends and of posted events."""
    log: list[tuple[str, int, str]] = []
    posted: list[tuple[str, int, str]] = []
    outs = {c: Out(c, log) for c in children}
    return _Lanes(spec, outs, lambda *e: posted.append(e)), log, posted


def broadcast(ln: _Lanes, r: int, children: Sequence[str], chunks: int) -> None:
    """Send `chunks` chunks of round `r`'s GLOBAL to every child, chunk by chunk (as G and relays do)."""
    for k in range(chunks):
        for c in children:
            ln.send(c, [f"r{r}k{k}"], r, None, k == chunks - 1)


def deliver(ln: _Lanes, posted: list[tuple[str, int, str]]) -> None:
    """Hand the posted ``copy_sent`` events to the lanes (as the engine's loop does), until none is left."""
    while posted:
        event, r, child = posted.pop(0)
        assert event == "copy_sent"
        ln.sent(r, child)


def test_a_lane_sends_each_copy_whole_before_the_next_and_others_at_once() -> None:
    # Prepare: A, B, C share a link, in that order; D is in no lane.
    ln, log, posted = lanes([("A", "B", "C")], "ABCD")

    # Execute
    broadcast(ln, 1, "ABCD", chunks=3)
    before = list(log)
    deliver(ln, posted)

    # Assert: at first, A's whole copy and D's; then B's whole, then C's
    assert before == [(c, 1, f"r1k{k}") for k in range(3) for c in "AD"]
    assert log[len(before):] == [(c, 1, f"r1k{k}") for c in "BC" for k in range(3)]


def test_a_lost_child_does_not_hold_up_its_lane_and_is_skipped_until_it_is_back() -> None:
    # Prepare
    ln, log, posted = lanes([("A", "B", "C")], "ABC")
    broadcast(ln, 1, "ABC", chunks=2)
    posted.clear()  # A's copy "left", but its connection breaks before the engine hears of it

    # Execute: A lost; B's copy leaves; then round 2 with B down at its turn
    ln.lost("A")
    sent_after_loss = list(log)
    deliver(ln, posted)
    ln.lost("B")
    log.clear()
    broadcast(ln, 2, "ABC", chunks=2)

    # Assert
    assert [c for c, _, _ in sent_after_loss] == ["A", "A", "B", "B"]
    assert [c for c, _, _ in log] == ["A", "B", "C", "A", "B", "C"], "both down: C goes at once"

    # Execute: A and B come back: round 3 is serial again
    ln.back("A")
    ln.back("B")
    posted.clear()
    log.clear()
    broadcast(ln, 3, "ABC", chunks=2)

    # Assert
    assert [c for c, _, _ in log] == ["A", "A"]


def test_a_new_round_first_lets_out_what_waits_of_the_last_one_in_order() -> None:
    # Prepare: round 1 never completes at A (no copy_sent delivered): B and C still wait
    ln, log, _ = lanes([("A", "B", "C")], "ABC")
    broadcast(ln, 1, "ABC", chunks=2)
    log.clear()

    # Execute
    broadcast(ln, 2, "ABC", chunks=1)

    # Assert: B's and C's round-1 frames leave before anything of round 2 on their connections
    assert [(c, r) for c, r, _ in log] == [("B", 1), ("B", 1), ("C", 1), ("C", 1), ("A", 2)]


def test_release_lets_everything_out() -> None:
    ln, log, _ = lanes([("A", "B")], "AB")
    broadcast(ln, 1, "AB", chunks=2)

    ln.release()

    assert [c for c, _, _ in log] == ["A", "A", "B", "B"]


def test_children_whose_paths_share_a_link_are_in_one_lane_most_locals_first() -> None:
    # Prepare: G's edges to A and B share G-X; C shares X-Y with B's edge (so C joins their
    # lane); D goes its own way. B feeds local E below it, so B (2 locals) goes before A and C.
    edges = [
        OverlayEdge("broadcast", "G", "A", ("G", "X", "A")),
        OverlayEdge("broadcast", "G", "B", ("G", "X", "Y", "B")),
        OverlayEdge("broadcast", "G", "C", ("G", "Z", "X", "Y", "C")),
        OverlayEdge("broadcast", "G", "D", ("G", "D")),
        OverlayEdge("broadcast", "B", "E", ("B", "E")),
    ]
    s = Schedule(task_id=1, scheduler="hand", global_site="G", local_sites=("A", "B", "C", "D", "E"),
                 demand_mbps=1, broadcast_parent={e.dst: e.src for e in edges}, edges=tuple(edges))

    # Execute and assert
    assert broadcast_lanes(s, "G") == (("B", "A", "C"),)
    assert broadcast_lanes(s, "B") == ()


def test_an_agent_config_names_only_its_own_broadcast_children_in_lanes_once() -> None:
    # Prepare
    base = AgentConfig(task=1, site="G", host="10.0.0.1", broadcast_port=1, upload_port=2, rounds=1, is_global=True,
                       broadcast_children=(Peer(site="A", host="10.0.0.2"), Peer(site="B", host="10.0.0.3")),
                       upload_children=(Peer(site="A", host="10.0.0.2"),)).to_dict()

    # Execute and assert
    assert AgentConfig.from_dict({**base, "broadcast_lanes": [["B", "A"]]}).broadcast_lanes == (("B", "A"),)
    for bad in ([["A", "C"]], [["A", "B"], ["A"]], [["A", "A"]], "AB", [[1, 2]]):
        with pytest.raises(ValueError, match="broadcast_lanes"):
            AgentConfig.from_dict({**base, "broadcast_lanes": bad})
