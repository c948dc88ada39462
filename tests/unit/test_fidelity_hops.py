"""Per-hop figures of the broadcast tree (`orchestrator.lifecycle.fidelity.hop_rows`): a hop's floor
is the emulated network's, and its overhead is what the instrument added."""

from __future__ import annotations

import pytest

from orchestrator.lifecycle.fidelity import hop_rows
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
