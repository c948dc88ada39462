"""Which rounds a recorded lower bound counts the joint bound in (`task_manager.round_bound`)."""

from __future__ import annotations

from typing import Any

import pytest

from orchestrator.lifecycle.recorder import round_bound
from orchestrator.runtime.summaries import summarize
from orchestrator.scheduling.cost import round_figures
from tests.unit.test_scheduling_bounds import MB_12_5, shared_access


def events(extra_g: list[dict[str, Any]], trained: tuple[str, ...] = ("A", "B")) -> dict[str, list[dict[str, Any]]]:
    """One round's events: G starts at 0 and completes at 5; the locals in `trained` train 0.2 s."""
    g = [{"event": "round_start", "round": 1, "t": 0.0}, *extra_g,
         {"event": "aggregated", "round": 1, "t": 5.0},
         {"event": "round_complete", "round": 1, "t": 5.0, "accuracy": 0.5, "loss": 1.0, "num_examples": 10}]
    out = {"G": g}
    for i, site in enumerate(("A", "B")):
        evs = [{"event": "global_received", "round": 1, "t": 1.0 + i}]
        if site in trained:
            evs += [{"event": "train_start", "round": 1, "t": 1.0 + i}, {"event": "train_end", "round": 1, "t": 1.2 + i}]
        out[site] = evs
    return out


@pytest.mark.parametrize(("extra_g", "trained", "joint", "left_out"), [
    ([], ("A", "B"), True, ()),
    ([{"event": "rejected", "round": 1, "t": 3.0, "child": "A", "detail": "UPDATE chunk 3, expected 2"}],
     ("A", "B"), False, ("A (rejected)",)),
    ([{"event": "child_timeout", "round": 1, "t": 4.0, "child": "B"}], ("A", "B"), False, ("B",)),
    ([], ("A",), False, ()),
], ids=["all", "rejected", "timeout", "one-trained"])
def test_the_joint_bound_counts_only_when_every_local_trained_and_none_was_left_out(
        extra_g: list[dict[str, Any]], trained: tuple[str, ...], joint: bool, left_out: tuple[str, ...]) -> None:
    # Prepare
    model, s = shared_access()
    figures = round_figures(model, s, MB_12_5)

    # Execute
    (r,) = summarize(s, events(extra_g, trained), rounds=1)
    bound = round_bound(figures, s, r)

    # Assert
    assert r.stragglers == left_out
    assert bound.train_s == pytest.approx(0.2)
    assert bound.joint_s == (figures.joint_s if joint else 0.0)
    assert figures.joint_s > max(figures.broadcast.pipelined_s, figures.upload.pipelined_s)
