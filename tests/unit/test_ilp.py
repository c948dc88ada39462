"""The exact optimum (`orchestrator.scheduling.ilp`): never above a heuristic, valid, known by hand."""

from __future__ import annotations

import random

import pytest
from hypothesis import assume, given

from orchestrator.errors import ConfigError
from orchestrator.scheduling import SCHEDULERS, NetworkState, get_scheduler
from orchestrator.scheduling.ilp import (
    Optimum,
    chain_latency_ms,
    front_bandwidth_at,
    pareto_front,
    solve_optimum,
)
from orchestrator.scheduling.state import EPS
from orchestrator.scheduling.tasks import Task
from tests.unit.test_scheduler_properties import SETTINGS, check_schedule, draw_task, networks
from tests.unit.test_schedulers import STAR_TASK, TASK, D, fig1, star
from topologies.model import NetworkModel

HEURISTICS = sorted(SCHEDULERS)


@SETTINGS
@given(data=networks())
def test_optimum_is_valid_and_never_above_a_heuristic(data: tuple[NetworkModel, random.Random]) -> None:
    model, rng = data
    task = draw_task(model, rng)
    assume(task is not None)
    assert task is not None
    state = NetworkState(model)

    opt = Optimum()
    best = opt.schedule(state, task)

    assert opt.last is not None and opt.last.proven_optimal
    assert not best.blocked
    check_schedule(model, state, task, best)  # also: only compute sites aggregate or relay
    for name in HEURISTICS:
        for weight in ("hops", "delay"):
            if name == "mst" and weight == "delay":
                continue
            s = get_scheduler(name, weight=weight).schedule(state, task)
            if not s.blocked:
                assert best.reserved_mbps_total <= s.reserved_mbps_total + EPS, (name, weight)


@SETTINGS
@given(data=networks(tight=True))
def test_under_accumulating_load_the_optimum_stays_valid_and_below_the_heuristics(
    data: tuple[NetworkModel, random.Random],
) -> None:
    model, rng = data
    state = NetworkState(model)
    for task_id in range(1, 5):
        task = draw_task(model, rng, task_id)
        assume(task is not None)
        assert task is not None

        best = Optimum().schedule(state, task)

        check_schedule(model, state, task, best)
        for name in HEURISTICS:
            s = get_scheduler(name).schedule(state, task)
            if not s.blocked:
                # a heuristic that fits proves the ILP feasible: it must find at most as much
                assert not best.blocked, best.reason
                assert best.reserved_mbps_total <= s.reserved_mbps_total + EPS, name
        if not best.blocked:
            state.admit(best)


def test_fig1_optimum_by_hand() -> None:
    # G-L1, G-L2, L2-L3 each way: 3 copies per procedure. The route to L3 through the switch X
    # would take 2 links instead of 1.
    model = fig1()
    result = solve_optimum(NetworkState(model), TASK)

    assert result.proven_optimal and result.status == "Optimal"
    s = result.schedule
    assert s.reserved_mbps_total == pytest.approx(6 * D)
    assert result.objective_mbps == pytest.approx(6 * D) and result.bound_mbps == pytest.approx(6 * D)
    assert dict(s.broadcast_parent) == {"L1": "G", "L2": "G", "L3": "L2"}
    assert dict(s.upload_parent) == {"L1": "G", "L2": "G", "L3": "L2"}
    assert s.aggregation_sites == {"G", "L2"}


@pytest.mark.parametrize(("hub_compute", "copies"), [(True, 8), (False, 12)])
def test_aggregation_only_at_compute_sites(hub_compute: bool, copies: int) -> None:
    # Star G, A, B, C around hub H. With compute, H replicates and aggregates: one copy on each of
    # the 4 links each way. Without, H only switches: 3 copies G-H (one per local) + 3 H-X.
    model = star(hub_compute)
    s = Optimum().schedule(NetworkState(model), STAR_TASK)

    assert s.reserved_mbps_total == pytest.approx(copies * D)
    assert ("H" in s.aggregation_sites) is hub_compute
    assert ("H" in s.relay_sites) is hub_compute
    for site in s.aggregation_sites:
        assert model.sites[site].has_compute
    check_schedule(model, NetworkState(model), STAR_TASK, s)


def test_infeasible_instance_is_blocked_with_a_clear_reason() -> None:
    model = fig1()
    state = NetworkState(model)
    full = model.link("G", "L1").capacity_mbps
    state.set_background({("G", "L1"): full, ("L1", "G"): full})  # L1 hangs off G only

    opt = Optimum()
    s = opt.schedule(state, TASK)

    assert s.blocked and not s.edges and not s.reservations
    assert s.reason.startswith("infeasible: no broadcast and upload trees fit the residual capacity")
    assert opt.last is not None and opt.last.status == "Infeasible" and not opt.last.proven_optimal


def test_latency_bound_too_tight_is_infeasible_and_named() -> None:
    s = Optimum(max_latency_ms=0.1).schedule(NetworkState(fig1()), TASK)
    assert s.blocked and "within a latency bound of 0.1 ms" in s.reason


def test_pareto_front_on_fig1_by_hand() -> None:
    # L3 through L2: 1 link more for nobody, chain 100 + 100 km = 1.0 ms; through X: one copy
    # more each way (G-X-L3 is 2 links), chain 100 + 90 km = 0.95 ms. L1 and L2 are at 0.5 ms.
    model = fig1()
    state = NetworkState(model)
    front = pareto_front(state, TASK)

    assert [(p.latency_ms, p.reserved_mbps) for p in front] == [
        pytest.approx((1.0, 6 * D)), pytest.approx((0.95, 8 * D))
    ]
    assert all(p.proven_optimal for p in front)
    assert all(p.lower_bound_ms > 0 for p in front)
    assert front_bandwidth_at(front, 0.97) == pytest.approx(8 * D)
    assert front_bandwidth_at(front, 2.0) == pytest.approx(6 * D)
    assert front_bandwidth_at(front, 0.9) is None
    # spff takes the shortest-delay path to every local: on the front's fast end, bandwidth above it
    spff = get_scheduler("spff").schedule(state, TASK)
    assert chain_latency_ms(model, spff) == pytest.approx(0.95)
    assert spff.reserved_mbps_total >= front_bandwidth_at(front, 0.95 + 1e-9)  # type: ignore[operator]


def test_a_latency_bound_is_met_by_the_schedule() -> None:
    model = fig1()
    s = Optimum(max_latency_ms=0.96).schedule(NetworkState(model), TASK)
    assert not s.blocked and chain_latency_ms(model, s) <= 0.96
    assert s.reserved_mbps_total == pytest.approx(8 * D)


def test_bad_options_and_names() -> None:
    for kw in ({"time_limit_s": 0}, {"mip_gap": -1}, {"max_latency_ms": float("nan")}, {"time_limit_s": True}):
        with pytest.raises(ConfigError, match="scheduler 'optimum'"):
            get_scheduler("optimum", **kw)
    assert "optimum" not in SCHEDULERS  # not in every default comparison: it solves an ILP per task
    assert isinstance(get_scheduler("optimum", time_limit_s=5), Optimum)
    with pytest.raises(ConfigError, match="unknown site"):
        Optimum().schedule(NetworkState(fig1()), Task(id=1, global_site="G", local_sites=("nowhere",)))
