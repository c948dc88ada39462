"""The chunk-size model and derived timeouts (orchestrator.runtime.timing), and the paired
comparison with its bootstrap interval (orchestrator.results.stats)."""

from __future__ import annotations

import pytest

from orchestrator.results.stats import bootstrap_ci, paired_ratio
from orchestrator.results.summary import TaskSummary
from orchestrator.runtime.timing import (
    MAX_CHUNK_BYTES,
    MIN_CHUNK_BYTES,
    optimal_chunk_bytes,
    pipelined_time_s,
    task_timing,
)
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.tasks import Task
from topologies.loaders import load


@pytest.mark.parametrize(("model_bytes", "stages", "rate_mbps"), [(3_000_000, 4, 20.0), (42_000_000, 3, 100.0),
                                                                  (42_000_000, 8, 1000.0)])
def test_the_chosen_chunk_minimises_the_pipeline_model(model_bytes: int, stages: int, rate_mbps: float) -> None:
    c = optimal_chunk_bytes(model_bytes, stages, rate_mbps)

    best = pipelined_time_s(model_bytes, c, stages, rate_mbps)
    for other in (c // 2, c * 2, c - 1024, c + 1024):
        if MIN_CHUNK_BYTES <= other <= MAX_CHUNK_BYTES:
            assert best <= pipelined_time_s(model_bytes, other, stages, rate_mbps) + 1e-12


def test_chunk_size_is_clamped_to_the_bounds() -> None:
    assert MIN_CHUNK_BYTES <= optimal_chunk_bytes(10**7, 50, 1.0)
    assert optimal_chunk_bytes(10**9, 2, 10_000.0) <= MAX_CHUNK_BYTES
    assert optimal_chunk_bytes(500, 4, 100.0) == 500  # below the smallest chunk: one chunk
    with pytest.raises(ValueError):
        optimal_chunk_bytes(0, 2, 10.0)


def test_a_small_model_on_a_three_hop_chain_is_pipelined_in_several_chunks() -> None:
    # the default mlp (19,240 bytes) down a chain of 3 hops at 100 Mbit/s: 4 stages
    model_bytes, stages, rate_mbps = 19_240, 4, 100.0

    c = optimal_chunk_bytes(model_bytes, stages, rate_mbps)

    chunks = -(-model_bytes // c)
    assert chunks >= 3, "store-and-forward per hop: T(c) says the chain should pipeline"
    assert pipelined_time_s(model_bytes, c, stages, rate_mbps) < 0.7 * pipelined_time_s(
        model_bytes, model_bytes, stages, rate_mbps)
    # no other chunk count does better
    for n in range(1, 20):
        other = -(-model_bytes // n)
        assert pipelined_time_s(model_bytes, c, stages, rate_mbps) <= pipelined_time_s(
            model_bytes, other, stages, rate_mbps) + 1e-12


def test_one_stage_sends_one_chunk_and_more_stages_smaller_ones() -> None:
    sizes = [optimal_chunk_bytes(19_240, h, 100.0) for h in (1, 2, 4, 8)]

    assert sizes[0] == 19_240
    assert sizes == sorted(sizes, reverse=True) and sizes[1] < sizes[0] and sizes[3] < sizes[1]


def test_timeouts_grow_with_the_subtree_and_the_store_and_forward_round() -> None:
    model = load("ring:8")
    sites = model.site_names
    task = Task(id=1, global_site=sites[0], local_sites=tuple(sites[2:6]), model="mlp", rounds=1,
                demand_mbps=10.0, model_bytes=10**6)
    sched = get_scheduler("mst").schedule(NetworkState(model), task)
    rate = lambda u, v: 10.0  # noqa: E731 -- 10 Mbit/s everywhere: transfers well above the floor

    small = task_timing(model, sched, 10**6, rate=rate, train_allowance_s=1.0)
    big = task_timing(model, sched, 10**9, rate=rate, train_allowance_s=1.0)

    g = sched.global_site
    assert big.store_and_forward_s > small.store_and_forward_s > 0
    assert big.child_timeout_s[g] > small.child_timeout_s[g]
    assert all(small.child_timeout_s[g] >= t for t in small.child_timeout_s.values())
    assert small.global_timeout_s > max(small.child_timeout_s.values())


def _task(sched: str, task_id: int, latency: float) -> TaskSummary:
    return TaskSummary(scheduler=sched, task_id=task_id, n_locals=8, state="done", reserved_mbps=1.0,
                      carried_bytes=1, rounds=3, mean_latency_s=latency, mean_ratio_to_bound=None,
                      final_accuracy=None)


def test_paired_ratio_compares_the_same_tasks_and_its_interval_holds_the_mean() -> None:
    tasks = [_task("spff", i, 2.0 + i) for i in range(6)] + [_task("mst", i, (2.0 + i) * (0.5 + 0.02 * i))
                                                             for i in range(6)]
    tasks.append(_task("mst", 99, 10.0))  # no spff twin: left out

    pr = paired_ratio(tasks, n_locals=8, numerator="mst", denominator="spff")

    assert pr is not None and pr.tasks == 6 and pr.rounds == 36
    assert pr.mean == pytest.approx(sum(0.5 + 0.02 * i for i in range(6)) / 6)
    assert pr.low <= pr.mean <= pr.high and pr.high - pr.low < 0.1
    assert paired_ratio(tasks, n_locals=2, numerator="mst", denominator="spff") is None


def test_bootstrap_interval_is_reproducible_and_degenerate_for_equal_values() -> None:
    assert bootstrap_ci([1.0, 2.0, 3.0, 4.0]) == bootstrap_ci([1.0, 2.0, 3.0, 4.0])
    assert bootstrap_ci([0.7] * 5) == pytest.approx((0.7, 0.7))
