"""Per-hop figures of the broadcast tree (`orchestrator.lifecycle.fidelity.hop_rows`): a hop's floor
is the emulated network's, and its overhead is what the instrument added."""

from __future__ import annotations

import pytest

from orchestrator.lifecycle.fidelity import SATURATING_BYTES, hop_rows, link_rate_rows
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


def test_a_link_carrying_less_than_the_saturating_bytes_gives_no_rate() -> None:
    model = load("triangle")
    schedule = handmade_schedule(EmulationPlan.from_model(model))  # one copy on A -> B
    received = {("A", 1): 0.0, ("B", 1): 0.002, ("C", 1): 0.004}
    assert link_rate_rows(model, schedule, _rows(received), model_bytes=SATURATING_BYTES - 1,
                          rate=lambda a, b: MBPS, propagation=False) == []
    rows = link_rate_rows(model, schedule, _rows(received | {("B", 1): 0.0125}), model_bytes=SATURATING_BYTES,
                          rate=lambda a, b: MBPS, propagation=False)
    assert [(r["a"], r["b"]) for r in rows] == [("A", "B")]  # only G's edges: B -> C is a relay's
    assert rows[0]["rate_share"] == pytest.approx(0.012 / 0.0125)
