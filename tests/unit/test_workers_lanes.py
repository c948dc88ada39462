"""Lanes: copies of GLOBAL to children whose paths share a link go one after another.

`workers.round_parts.Lanes` with recording senders (what each child was sent, in order), and
`orchestrator.runtime.task_runner.broadcast_lanes` on hand-made schedules.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from orchestrator.runtime.task_runner import broadcast_lanes
from orchestrator.scheduling import OverlayEdge, Schedule
from workers.config import AgentConfig, Peer
from workers.framing import Buffer
from workers.round_parts import Lanes

#: The frames sent with ``drain`` (their `on_sent` waits until the copy has left: `Outbound.send`), in order.
DRAINED: list[tuple[str, int, str]] = []
#: The frames sent with ``last`` (a copy's final frame, whose last segment a pacer never leads), in order.
LAST: list[tuple[str, int, str]] = []


class Out:
    """A sender that records (child, round, frame) at once and keeps `on_sent` for `deliver`
    (the frame "leaves" when the test says so, as from a sender thread)."""

    def __init__(self, child: str, log: list[tuple[str, int, str]], pending: list[Callable[[], None]]) -> None:
        self.child, self.log, self.pending = child, log, pending

    paced_until: float | None = None  # not paced
    started_at: float | None = None  # not said: `forward_first` is logged when written

    def send(self, pieces: Sequence[Buffer], *, round: int, on_sent: Callable[[], None] | None = None,
             drain: bool = False, last: bool = False, ready_at: float | None = None) -> None:
        self.log.append((self.child, round, str(pieces[0])))
        if drain:
            DRAINED.append((self.child, round, str(pieces[0])))
        if last:
            LAST.append((self.child, round, str(pieces[0])))
        if on_sent is not None:
            self.pending.append(on_sent)


def lanes(spec: Sequence[Sequence[str]], children: Sequence[str]) -> tuple[Lanes, list[tuple[str, int, str]],
                                                                         list[Callable[[], None]]]:
    """A `Lanes` over recording senders; also the log of sends and the `on_sent` callbacks pending."""
    log: list[tuple[str, int, str]] = []
    pending: list[Callable[[], None]] = []
    outs = {c: Out(c, log, pending) for c in children}
    return Lanes(spec, outs, lambda r, child: log.append((child, r, "copy_sent"))), log, pending


def broadcast(ln: Lanes, r: int, children: Sequence[str], chunks: int) -> None:
    """Send `chunks` chunks of round `r`'s GLOBAL to every child, chunk by chunk (as G and relays do)."""
    for k in range(chunks):
        for c in children:
            ln.send(c, [f"r{r}k{k}"], r, None, k == chunks - 1)


def deliver(pending: list[Callable[[], None]]) -> None:
    """Let every frame sent so far leave, and those its leaving lets out, until none is left."""
    while pending:
        pending.pop(0)()


def sends(log: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    return [e for e in log if e[2] != "copy_sent"]


def test_a_lane_sends_each_copy_whole_before_the_next_and_others_at_once() -> None:
    # Prepare: A, B, C share a link, in that order; D is in no lane.
    ln, log, pending = lanes([("A", "B", "C")], "ABCD")
    LAST.clear()

    # Execute
    broadcast(ln, 1, "ABCD", chunks=3)
    before = list(log)
    deliver(pending)

    # Every child's final frame, and only it, is marked last, whether it waited in a lane or not
    assert sorted(LAST) == [(c, 1, "r1k2") for c in "ABCD"]

    # Assert: at first, A's whole copy and D's; then B's whole, then C's, each after the last left
    assert before == [(c, 1, f"r1k{k}") for k in range(3) for c in "AD"]
    assert log[len(before):] == [("A", 1, "copy_sent"), *[("B", 1, f"r1k{k}") for k in range(3)],
                                 ("B", 1, "copy_sent"), *[("C", 1, f"r1k{k}") for k in range(3)],
                                 ("C", 1, "copy_sent")]


def test_a_lost_child_does_not_hold_up_its_lane_and_is_skipped_until_it_is_back() -> None:
    # Prepare: A's copy went to its sender, but A's connection breaks before it leaves
    ln, log, pending = lanes([("A", "B", "C")], "ABC")
    broadcast(ln, 1, "ABC", chunks=2)
    pending.clear()

    # Execute: A lost; B's copy leaves; then round 2 with B down at its turn
    ln.lost("A")
    sent_after_loss = sends(log)
    deliver(pending)
    ln.lost("B")
    log.clear()
    broadcast(ln, 2, "ABC", chunks=2)

    # Assert
    assert [c for c, _, _ in sent_after_loss] == ["A", "A", "B", "B"]
    assert [c for c, _, _ in sends(log)] == ["A", "B", "C", "A", "B", "C"], "both down: C goes at once"

    # Execute: A and B come back: round 3 is serial again
    ln.back("A")
    ln.back("B")
    pending.clear()
    log.clear()
    broadcast(ln, 3, "ABC", chunks=2)

    # Assert
    assert [c for c, _, _ in sends(log)] == ["A", "A"]


def test_a_new_round_drops_the_copies_of_the_last_one_that_never_started() -> None:
    # Prepare: round 1 never completes at A (its last chunk never leaves): B and C still wait
    ln, log, _ = lanes([("A", "B", "C")], "ABC")
    broadcast(ln, 1, "ABC", chunks=2)
    log.clear()

    # Execute
    broadcast(ln, 2, "ABC", chunks=1)

    # Assert: no stale round-1 model goes to B or C; round 2 starts with A
    assert sends(log) == [("A", 2, "r2k0")]
    assert ln.dropped == 4


def test_past_the_deadline_what_waits_goes_out_at_once() -> None:
    # Prepare: A hangs (its copy never leaves, its connection does not break)
    ln, log, _ = lanes([("A", "B", "C")], "ABC")
    broadcast(ln, 1, "ABC", chunks=2)
    log.clear()

    # Execute
    ln.late(1)
    ln.send("B", ["r1k2"], 1, None, False)  # a relay's later chunk, after the deadline

    # Assert
    assert [c for c, _, _ in sends(log)] == ["B", "B", "C", "C", "B"]


def test_the_role_ending_drops_what_waits() -> None:
    ln, log, _ = lanes([("A", "B")], "AB")
    broadcast(ln, 1, "AB", chunks=2)

    ln.drop()

    assert [c for c, _, _ in sends(log)] == ["A", "A"] and ln.dropped == 2


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


def test_a_lane_copy_has_left_once_its_last_chunk_was_drained_and_only_then() -> None:
    # Prepare: A and B share a link; D is in no lane. Two rounds of 3 chunks each.
    DRAINED.clear()
    ln, log, pending = lanes([("A", "B")], "ABD")

    # Execute
    for r in (1, 2):
        broadcast(ln, r, "ABD", chunks=3)
        deliver(pending)

    # Assert: only each lane copy's last chunk is sent with drain (it waits until it has left), in lane order;
    # D's copy and the other chunks count as sent once written
    assert DRAINED == [("A", 1, "r1k2"), ("B", 1, "r1k2"), ("A", 2, "r2k2"), ("B", 2, "r2k2")]
    assert [e for e in log if e[2] == "copy_sent"] == [("A", 1, "copy_sent"), ("B", 1, "copy_sent"),
                                                       ("A", 2, "copy_sent"), ("B", 2, "copy_sent")]
