"""The relay-chain check of the fidelity verdict (`orchestrator.results.hop_chains`): what the
instrument adds along a round's deepest broadcast chain, as a share of the round, flips the verdict
past `CHAIN_SHARE` even where each hop stays within its own allowance."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from orchestrator.results.db import ResultsDB
from orchestrator.results.fidelity import CHAIN_SHARE, run_verdicts, verdict
from orchestrator.results.hop_chains import chain_overhead, chain_shares
from orchestrator.scheduling.tasks import Task

CHUNK_S = 0.25e-3


def test_the_deepest_chain_sums_its_hops_and_a_shallow_branch_does_not_count() -> None:
    # A -> B -> C -> D (0.1 ms each) and A -> E (0.25 ms): the chain to D adds 0.3 ms.
    tree = {"B": ("A", 0.1e-3), "C": ("B", 0.1e-3), "D": ("C", 0.1e-3), "E": ("A", 0.25e-3)}
    assert chain_overhead(tree) == pytest.approx(0.3e-3)
    assert chain_overhead({"B": ("A", -0.05e-3)}) == 0.0  # a hop under its floor adds nothing
    assert chain_overhead({"B": ("C", 1.0), "C": ("B", 1.0)}) == pytest.approx(64.0)  # a cycle stops


def test_a_points_share_is_the_mean_over_its_rounds() -> None:
    rows = [{"scheduler": "mst", "n_locals": 8, "task_id": 1, "round": r, "parent": "A", "child": "B",
             "overhead_s": over, "latency_s": 0.01} for r, over in ((1, 0.001), (2, 0.003))]
    assert chain_shares(rows) == {("mst", 8): pytest.approx(0.2)}


def _deep_run(tmp_path: Path, over_s: float, depth: int = 5) -> tuple[ResultsDB, int]:
    """One round of 10 ms whose broadcast relays `depth` hops deep, each hop `over_s` over one chunk."""
    db = ResultsDB(tmp_path / "results.db")
    run_id = db.start_run("t", {}, {"mode": "sequential", "compute_timing": "modeled"})
    sites = [f"S{i}" for i in range(depth + 1)]
    db.record_task(run_id, "mst", Task(5, sites[0], tuple(sites[1:]), rounds=1))
    db.record_round(run_id, "mst", 5, 1, latency_s=0.01, broadcast_s=0.003, train_s=0.004, upload_s=0.003,
                    accuracy=0.5, lower_bound_s=0.009)
    hops = [{"round": 1, "parent": p, "child": c, "hop_s": CHUNK_S + over_s, "chunk_s": CHUNK_S, "floor_s": CHUNK_S,
             "overhead_s": over_s} for p, c in itertools.pairwise(sites)]
    db.record_fidelity(run_id, "mst", 5, hops=hops, overruns=[])
    db.set_task_state(run_id, "mst", 5, "done")
    db.finish_run(run_id, "completed")
    return db, run_id


@pytest.mark.parametrize("over_s, faithful", [(0.08e-3, True), (0.3e-3, False)])
def test_a_deep_chain_of_hops_each_within_its_allowance_can_flip_the_verdict(tmp_path: Path, over_s: float,
                                                                             faithful: bool) -> None:
    # Five relays adding 0.08 ms each are 4 % of a 10 ms round; 0.3 ms each, 15 %. Either is far within
    # one hop's allowance (one chunk + 0.5 ms).
    db, run_id = _deep_run(tmp_path, over_s)
    (v,) = run_verdicts(db, run_id, [("mst", 5)], compute_modelled=True)
    assert v.chain_share == pytest.approx(5 * over_s / 0.01)
    assert v.faithful is faithful
    if not faithful:
        assert v.reasons == (f"relay chains: the instrument adds 15.0% of a round's latency (mean) along its deepest "
                             f"broadcast chain (allowed {CHAIN_SHARE:.0%}): what the host adds at each overlay hop "
                             "(the sites' software time; beside background, the gaps between a copy's segments that "
                             "the background takes), paid at every hop of a deep tree",)


def test_an_unknown_chain_share_is_no_reason() -> None:
    assert verdict("mst", 8, [], [], 8, compute_modelled=True, chain_share=None).faithful
    assert not verdict("mst", 8, [], [], 8, compute_modelled=True, chain_share=CHAIN_SHARE + 0.01).faithful
