"""Per-hop figures of the broadcast tree (`orchestrator.lifecycle.fidelity.hop_rows`): a hop's floor
is the emulated network's, and its overhead is what the instrument added."""

from __future__ import annotations

import pytest

from orchestrator.lifecycle.fidelity import (
    SATURATING_BURSTS,
    SATURATING_FLOOR_BYTES,
    copy_rows,
    hop_rows,
    link_rate_rows,
)
from orchestrator.scheduling import Schedule
from orchestrator.scheduling.schedule import OverlayEdge
from tests.unit.controller_fakes import handmade_schedule
from topologies.loaders import load
from topologies.plan import EmulationPlan

MBPS = 100.0


def _rows(received: dict[tuple[str, int], float]) -> list[dict[str, object]]:
    return [{"site": s, "round": r, "received_s": t} for (s, r), t in received.items()]


def test_a_relay_chain_hop_has_one_chunk_as_its_floor() -> None:
    model = load("triangle")
    schedule = handmade_schedule(EmulationPlan.from_model(model))  # broadcast A -> B -> C
    chunk, whole = 12_500, 125_000  # 1 ms and 10 ms at 100 Mbit/s
    # A starts at 0; B holds the model at 10.2 ms; C at 12.0 ms: 1.8 ms after B for a 1 ms chunk.
    rows = hop_rows(model, schedule, _rows({("A", 1): 0.0, ("B", 1): 0.0102, ("C", 1): 0.0120}),
                    chunk_bytes=chunk, model_bytes=whole, rate=lambda a, b: MBPS, propagation=False)
    by_child = {r["child"]: r for r in rows}
    assert set(by_child) == {"B", "C"}
    # G's edge: the whole model must cross it since the round started (10 ms)
    assert by_child["B"]["floor_s"] == pytest.approx(0.010)
    assert by_child["B"]["overhead_s"] == pytest.approx(0.0002)
    # the relay's edge: one chunk after B (1 ms), the whole model since the start being no later
    assert by_child["C"]["chunk_s"] == pytest.approx(0.001)
    assert by_child["C"]["floor_s"] == pytest.approx(0.001)
    assert by_child["C"]["hop_s"] == pytest.approx(0.0018)
    assert by_child["C"]["overhead_s"] == pytest.approx(0.0008)


def test_the_whole_models_floor_counts_the_copys_frame_bytes_at_the_transports_share_of_the_rate() -> None:
    model = load("triangle")
    schedule = handmade_schedule(EmulationPlan.from_model(model))  # broadcast A -> B -> C
    # B's copy: 130,000 frame bytes (the model's 125,000 and its chunks' headers) at 0.95 of 100 Mbit/s
    # is 10.947 ms; B holds the model 11.0 ms after the start: the instrument added 0.053 ms, not 1 ms.
    received = _rows({("A", 1): 0.0, ("B", 1): 0.0110, ("C", 1): 0.0125})
    copies = {(1, "B"): {"bytes": 130_000}}  # C's copy logged no bytes: the model's

    rows = hop_rows(model, schedule, received, chunk_bytes=12_500, model_bytes=125_000, rate=lambda a, b: MBPS,
                    propagation=False, copies=copies, payload_share=0.95)
    bare = hop_rows(model, schedule, received, chunk_bytes=12_500, model_bytes=125_000, rate=lambda a, b: MBPS,
                    propagation=False)

    b, c = (next(r for r in rows if r["child"] == x) for x in ("B", "C"))
    with_framing = hop_rows(model, schedule, received, chunk_bytes=12_500, model_bytes=125_000,
                            rate=lambda a, b: MBPS, propagation=False, copies={(1, "C"): {"bytes": 130_000}},
                            payload_share=0.95)
    # C's last chunk alone carries its share of the copy's framing too: 500 of the 5,000 bytes of 10 chunks.
    assert next(r for r in with_framing if r["child"] == "C")["floor_s"] == pytest.approx(13_000 * 8 / 0.95 / 100e6)
    assert b["floor_s"] == pytest.approx(130_000 * 8 / 0.95 / 100e6)
    assert b["overhead_s"] == pytest.approx(0.011 - 130_000 * 8 / 0.95 / 100e6, abs=1e-7)
    assert b["chunk_s"] == pytest.approx(0.001)  # the allowance stays one chunk's payload
    assert c["floor_s"] == pytest.approx(0.001 / 0.95)  # the relay's floor: one chunk's frames at the rate
    assert next(r for r in bare if r["child"] == "B")["overhead_s"] == pytest.approx(0.001)  # payload at the rate


def test_a_slow_downstream_link_raises_the_floor_to_the_whole_model() -> None:
    model = load("triangle")
    schedule = handmade_schedule(EmulationPlan.from_model(model))

    def rate(a: str, b: str) -> float:
        return 10.0 if (a, b) == ("B", "C") else MBPS  # B -> C ten times slower than A -> B

    rows = hop_rows(model, schedule, _rows({("A", 1): 0.0, ("B", 1): 0.010, ("C", 1): 0.101}),
                    chunk_bytes=12_500, model_bytes=125_000, rate=rate, propagation=False)
    c = next(r for r in rows if r["child"] == "C")
    assert c["floor_s"] == pytest.approx(0.100 - 0.010)  # 100 ms of model on B -> C since the start
    assert c["overhead_s"] == pytest.approx(0.001)


def test_a_node_that_logged_nothing_gives_no_hop_and_store_and_forward_counts_the_model() -> None:
    model = load("triangle")
    schedule = handmade_schedule(EmulationPlan.from_model(model))
    rows = hop_rows(model, schedule, _rows({("A", 1): 0.0, ("B", 1): 0.011, ("A", 2): 1.0}),
                    chunk_bytes=0, model_bytes=125_000, rate=lambda a, b: MBPS, propagation=False)
    assert [(r["round"], r["child"]) for r in rows] == [(1, "B")]
    assert rows[0]["chunk_s"] == pytest.approx(0.010)  # no chunks: the whole model is one


def _unicast_schedule() -> Schedule:
    """spff-like on the triangle: G=A sends to B directly and to C through B, both copies on A->B."""
    edges = (OverlayEdge("broadcast", "A", "B", ("A", "B")), OverlayEdge("broadcast", "A", "C", ("A", "B", "C")),
             OverlayEdge("upload", "B", "A", ("B", "A")), OverlayEdge("upload", "C", "A", ("C", "A")))
    return Schedule(task_id=7, scheduler="handmade", global_site="A", local_sites=("B", "C"), demand_mbps=10.0,
                    broadcast_parent={"B": "A", "C": "A"}, upload_parent={"B": "A", "C": "A"}, edges=edges)


def test_a_saturated_link_rate_is_its_copies_at_the_configured_rate_over_the_time_they_took() -> None:
    model = load("triangle")
    whole = 125_000  # 10 ms at 100 Mbit/s; two copies share A -> B: 250 KB, 20 ms
    # round 1: the last child behind A -> B holds the model 25 ms after the start: 0.8 of the rate
    received = {("A", 1): 1.0, ("B", 1): 1.012, ("C", 1): 1.025, ("A", 2): 2.0, ("B", 2): 2.010, ("C", 2): 2.021}
    rows = link_rate_rows(model, _unicast_schedule(), _rows(received), model_bytes=whole,
                          rate=lambda a, b: MBPS, propagation=False)
    assert [(r["round"], r["a"], r["b"], r["bytes"]) for r in rows] == [(1, "A", "B", 2 * whole), (2, "A", "B", 2 * whole)]
    assert rows[0]["expected_s"] == pytest.approx(0.020)
    assert rows[0]["measured_s"] == pytest.approx(0.025) and rows[0]["rate_share"] == pytest.approx(0.8)
    assert rows[1]["rate_share"] == pytest.approx(0.020 / 0.021)


@pytest.mark.parametrize("burst", [0, 1600, 6250])
def test_a_link_carrying_less_than_ten_bursts_gives_no_rate(burst: int) -> None:
    """A link counts once a round's copies on it are `SATURATING_BURSTS` times its burst (and at least
    `SATURATING_FLOOR_BYTES`); one byte less and it has no rate figure."""
    model = load("triangle")
    schedule = handmade_schedule(EmulationPlan.from_model(model))  # one copy on A -> B
    enough = max(SATURATING_FLOOR_BYTES, SATURATING_BURSTS * burst)
    received = {("A", 1): 0.0, ("B", 1): 0.002, ("C", 1): 0.004}
    assert link_rate_rows(model, schedule, _rows(received), model_bytes=enough - 1, rate=lambda a, b: MBPS,
                          propagation=False, burst_bytes=lambda a, b: burst) == []
    late = _rows(received | {("B", 1): 0.0125})
    rows = link_rate_rows(model, schedule, late, model_bytes=enough, rate=lambda a, b: MBPS, propagation=False,
                          burst_bytes=lambda a, b: burst)
    assert [(r["a"], r["b"]) for r in rows] == [("A", "B")]  # only G's edges: B -> C is a relay's
    assert rows[0]["rate_share"] == pytest.approx(enough * 8 / 100e6 / 0.0125)


def test_one_copy_of_the_default_mlp_counts_on_an_emulated_link() -> None:
    """The emulation's burst is one frame (1,600 B) up to 2.13 Mbit/s (a 100 Mbit/s link from K = 47):
    one 19 KB copy is ten of them, so a small model's broadcast has a rate figure there, which with a
    15 KB burst it never had."""
    from controller.htb import burst_bytes

    model = load("triangle")
    schedule = handmade_schedule(EmulationPlan.from_model(model))
    rows = link_rate_rows(model, schedule, _rows({("A", 1): 0.0, ("B", 1): 0.0016, ("C", 1): 0.003}),
                          model_bytes=19_000, rate=lambda a, b: MBPS, propagation=False,
                          burst_bytes=lambda a, b: burst_bytes(MBPS / 64))
    assert [(r["a"], r["b"]) for r in rows] == [("A", "B")]


# -- the link's busy time: copies in flight from their sender's first chunk to their child's receipt --
WHOLE = 125_000  # 10 ms at 100 Mbit/s; the two copies of `_unicast_schedule` cross A -> B


def _copies(flights: dict[str, tuple[float, float]], nbytes: int | None = None) -> tuple[list[dict[str, object]],
                                                                                        dict[str, list[dict[str, object]]]]:
    """Round 1 (G=A starts at 1.0) with each child's copy in flight (start, receipt), as node rows and as
    the roles' events (the sender's ``forward_first`` naming the child, the child's ``global_received``)."""
    extra = {} if nbytes is None else {"nbytes": nbytes}
    events: dict[str, list[dict[str, object]]] = {"A": [{"event": "round_start", "round": 1, "t": 1.0}]}
    for child, (start, end) in flights.items():
        events["A"].append({"event": "forward_first", "round": 1, "t": start, "peer": child})
        events[child] = [{"event": "global_received", "round": 1, "t": end, **extra}]
    return _rows({("A", 1): 1.0} | {(c, 1): end for c, (_, end) in flights.items()}), events


def _share(flights: dict[str, tuple[float, float]], nbytes: int | None = None, *, logged: bool = True) -> float:
    rows, events = _copies(flights, nbytes)
    (row,) = link_rate_rows(load("triangle"), _unicast_schedule(), rows, model_bytes=WHOLE, rate=lambda a, b: MBPS,
                            propagation=False, copies=copy_rows(events) if logged else None)
    return float(row["rate_share"])


def test_back_to_back_copies_at_the_configured_rate_get_all_of_it() -> None:
    assert _share({"B": (1.000, 1.010), "C": (1.010, 1.020)}) == pytest.approx(1.0)
    assert _share({"B": (1.000, 1.020), "C": (1.000, 1.020)}) == pytest.approx(1.0)  # sent together, shared


def test_gaps_between_copies_at_the_sender_are_not_charged_to_the_link() -> None:
    # the sender starts C's copy 8 ms after B's arrived: the link idles, then carries C at its rate
    gaps = {"B": (1.000, 1.010), "C": (1.018, 1.028)}
    assert _share(gaps) == pytest.approx(1.0)
    assert _share(gaps, logged=False) == pytest.approx(0.020 / 0.028)  # from the round's start: below 0.8


def test_a_link_that_delivers_half_its_rate_while_busy_stays_below_the_verdict() -> None:
    assert _share({"B": (1.000, 1.020), "C": (1.028, 1.048)}) == pytest.approx(0.5)  # gap or not
    assert _share({"B": (1.000, 1.040), "C": (1.000, 1.040)}) == pytest.approx(0.5)


def test_a_copy_counts_the_frame_bytes_its_child_received() -> None:
    # 12.5 % of chunk headers: at the configured rate each copy takes 11.25 ms, not the model's 10 ms
    rows, events = _copies({"B": (1.000, 1.01125), "C": (1.01125, 1.0225)}, nbytes=WHOLE * 9 // 8)
    (row,) = link_rate_rows(load("triangle"), _unicast_schedule(), rows, model_bytes=WHOLE, rate=lambda a, b: MBPS,
                            propagation=False, copies=copy_rows(events))
    assert row["bytes"] == 2 * WHOLE * 9 // 8 and row["rate_share"] == pytest.approx(1.0)
    assert _share({"B": (1.000, 1.01125), "C": (1.01125, 1.0225)}) == pytest.approx(0.020 / 0.0225)  # model bytes


def test_copy_rows_reads_each_copy_s_start_and_bytes_through_the_clock() -> None:
    events = {"A": [{"event": "forward_first", "round": 2, "t": 10.0, "peer": "B"},
                    {"event": "forward_first", "round": 2, "t": 11.0, "peer": "B"},  # the first counts
                    {"event": "copy_sent", "round": 2, "t": 10.5, "peer": "B"}],
              "B": [{"event": "global_received", "round": 2, "t": 12.0, "nbytes": 900},
                    {"event": "forward_first", "round": 2, "t": 12.5, "peer": "C"}],
              "C": [{"event": "global_received", "round": 2, "t": 13.0}]}  # an engine that frames nothing
    assert copy_rows(events, lambda t: t / 2) == {(2, "B"): {"start_s": 5.0, "bytes": 900}, (2, "C"): {"start_s": 6.25}}


def _spff_on_triangle() -> Schedule:
    """G=A sends B's copy and C's copy down the one link A->B (C's path is A, B, C)."""
    edges = (
        OverlayEdge("broadcast", "A", "B", ("A", "B")),
        OverlayEdge("broadcast", "A", "C", ("A", "B", "C")),
        OverlayEdge("upload", "B", "A", ("B", "A")),
        OverlayEdge("upload", "C", "A", ("C", "B", "A")),
    )
    return Schedule(task_id=7, scheduler="handmade", global_site="A", local_sites=("B", "C"), demand_mbps=10.0,
                    broadcast_parent={"B": "A", "C": "A"}, upload_parent={"B": "A", "C": "A"}, edges=edges)


@pytest.mark.parametrize("first", ["B", "C"])
def test_copies_sent_in_turn_down_one_link_each_have_a_floor_they_reach(first: str) -> None:
    """An ideal sender that sends the two copies one after the other at the link's rate (10 ms each)
    adds nothing: neither copy's overhead is negative (the floor of the first is one copy, of the
    second two), whichever it sends first."""
    model = load("triangle")
    second = "C" if first == "B" else "B"
    rows = hop_rows(model, _spff_on_triangle(), _rows({("A", 1): 0.0, (first, 1): 0.010, (second, 1): 0.020}),
                    chunk_bytes=0, model_bytes=125_000, rate=lambda a, b: MBPS, propagation=False)
    by_child = {r["child"]: r for r in rows}
    assert by_child[first]["floor_s"] == pytest.approx(0.010)
    assert by_child[second]["floor_s"] == pytest.approx(0.020)
    assert all(r["overhead_s"] == pytest.approx(0.0, abs=1e-12) for r in rows)


def test_copies_sharing_a_link_fairly_show_the_wait_of_the_early_finisher_only() -> None:
    """Both copies interleaved, both whole at 20 ms: the one ranked first had a floor of one copy
    (10 ms) and shows 10 ms, the one ranked second none; no overhead is ever below zero."""
    model = load("triangle")
    rows = hop_rows(model, _spff_on_triangle(), _rows({("A", 1): 0.0, ("B", 1): 0.0199, ("C", 1): 0.020}),
                    chunk_bytes=0, model_bytes=125_000, rate=lambda a, b: MBPS, propagation=False)
    by_child = {r["child"]: r for r in rows}
    assert by_child["B"]["overhead_s"] == pytest.approx(0.0099)
    assert by_child["C"]["overhead_s"] == pytest.approx(0.0)
    assert min(r["overhead_s"] for r in rows) >= 0


def test_a_copy_faster_than_the_link_allows_shows_a_negative_overhead() -> None:
    """The check can fail: a copy whole before its bytes could cross the link (a burst passing it
    unshaped) gives a negative overhead, which the verdict judges."""
    model = load("triangle")
    rows = hop_rows(model, _spff_on_triangle(), _rows({("A", 1): 0.0, ("B", 1): 0.004, ("C", 1): 0.020}),
                    chunk_bytes=0, model_bytes=125_000, rate=lambda a, b: MBPS, propagation=False)
    assert next(r for r in rows if r["child"] == "B")["overhead_s"] == pytest.approx(-0.006)


def test_the_floor_leaves_out_the_burst_each_link_passes_ahead_of_its_rate() -> None:
    """With a 1,600 B burst at 100 Mbit/s (0.128 ms), the copy's floor is its bytes less the burst at
    the rate: an ideal hop on the shaped link reaches it, and is not below it."""
    model = load("triangle")
    rows = hop_rows(model, _spff_on_triangle(), _rows({("A", 1): 0.0, ("B", 1): 0.010 - 0.000128,
                                                       ("C", 1): 0.020 - 0.000128}),
                    chunk_bytes=0, model_bytes=125_000, rate=lambda a, b: MBPS, propagation=False,
                    burst_bytes=lambda a, b: 1600)
    by_child = {r["child"]: r for r in rows}
    assert by_child["B"]["floor_s"] == pytest.approx(0.010 - 0.000128)
    assert by_child["C"]["floor_s"] == pytest.approx(0.020 - 0.000128)
    assert all(r["overhead_s"] == pytest.approx(0.0, abs=1e-12) for r in rows)
