"""Properties every scheduler must keep, on random connected graphs (hypothesis): the registered
ones and the example plugin (examples/schedulers/widest_path.py), loaded from its file spec."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from orchestrator.scheduling import NetworkState, Schedule, get_scheduler
from orchestrator.scheduling.state import EPS
from orchestrator.scheduling.tasks import Task
from tests.unit.plugin_schedulers import ALL_SCHEDULERS, make_scheduler
from topologies.model import NetworkModel

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def networks(draw: st.DrawFn, *, tight: bool = False) -> tuple[NetworkModel, random.Random]:
    n = draw(st.integers(min_value=3, max_value=10))
    seed = draw(st.integers(min_value=0, max_value=2**31))
    rng = random.Random(seed)
    names = [f"v{i}" for i in range(n)]
    edges: set[tuple[int, int]] = set()
    for k in range(1, n):
        j = rng.randrange(k)
        edges.add((j, k))
    for _ in range(draw(st.integers(min_value=0, max_value=n))):
        a, b = rng.sample(range(n), 2)
        edges.add((min(a, b), max(a, b)))
    no_compute = {i for i in range(n) if rng.random() < 0.3}
    sites = [{"name": names[i], "has_compute": i not in no_compute} for i in range(n)]
    links = [
        {
            "a": names[a],
            "b": names[b],
            "length_km": rng.choice([50, 100, 150, 400]),
            "wavelengths": rng.randint(1, 3) if tight else 8,
            "wavelength_mbps": rng.choice([1000, 2000, 3000]) if tight else 10_000,
        }
        for a, b in sorted(edges)
    ]
    return NetworkModel.build("random", sites, links), rng


def draw_task(model: NetworkModel, rng: random.Random, task_id: int = 1) -> Task | None:
    compute = model.compute_sites
    if len(compute) < 2:
        return None
    chosen = rng.sample(compute, rng.randint(2, len(compute)))
    return Task(id=task_id, global_site=chosen[0], local_sites=tuple(chosen[1:]), demand_mbps=1000.0)


def check_tree(parent: dict[str, str], root: str, must_span: set[str]) -> None:
    nodes = set(parent) | set(parent.values())
    assert must_span <= nodes | {root}
    assert root not in parent
    for node in parent:
        seen = set()
        cur = node
        while cur != root:
            assert cur not in seen, f"cycle through {cur}"
            seen.add(cur)
            cur = parent[cur]


def check_schedule(model: NetworkModel, state: NetworkState, task: Task, s: Schedule) -> None:
    if s.blocked:
        assert s.reason and not s.edges and not s.reservations
        return
    terminals = set(task.terminals)
    check_tree(dict(s.broadcast_parent), task.global_site, terminals)
    check_tree(dict(s.upload_parent), task.global_site, terminals)
    # edges mirror the parent maps, and every path is a real walk
    assert {(e.src, e.dst) for e in s.edges_of("broadcast")} == {(p, c) for c, p in s.broadcast_parent.items()}
    assert {(e.src, e.dst) for e in s.edges_of("upload")} == set(s.upload_parent.items())
    recomputed: dict[tuple[str, str], float] = {}
    for e in s.edges:
        assert e.path[0] == e.src and e.path[-1] == e.dst and len(e.path) >= 2
        for u, v in e.links():
            assert model.has_link(u, v), f"{u}-{v} is not a link"
            recomputed[(u, v)] = recomputed.get((u, v), 0.0) + task.demand_mbps
    assert dict(s.reservations) == pytest.approx(recomputed)
    # capacity and wavelength limits hold on top of what is already admitted
    for (u, v), mbps in s.reservations.items():
        assert state.used_mbps(u, v) + mbps <= model.link(u, v).capacity_mbps + EPS
    per_wl: dict[tuple[str, str, int], float] = {}
    for e in s.edges:
        assert e.wavelength is not None
        for u, v in e.links():
            key = (u, v, e.wavelength)
            per_wl[key] = per_wl.get(key, 0.0) + task.demand_mbps
            assert e.wavelength < model.link(u, v).wavelengths
    for (u, v, w), mbps in per_wl.items():
        assert state.wavelength_used_mbps(u, v, w) + mbps <= model.link(u, v).wavelength_mbps + EPS
    # only G, locals, or relays with compute aggregate
    for site in s.aggregation_sites:
        assert model.sites[site].has_compute
    for relay in s.relay_sites:
        assert model.sites[relay].has_compute


@pytest.mark.parametrize("name", ALL_SCHEDULERS)
@SETTINGS
@given(data=networks())
def test_trees_span_paths_are_walks_reservations_add_up(name: str, data: tuple[NetworkModel, random.Random]) -> None:
    model, rng = data
    task = draw_task(model, rng)
    assume(task is not None)
    assert task is not None
    state = NetworkState(model)

    s = make_scheduler(name).schedule(state, task)

    assert not s.blocked  # ample capacity on an empty network
    check_schedule(model, state, task, s)


@pytest.mark.parametrize("name", ALL_SCHEDULERS)
@SETTINGS
@given(data=networks(tight=True))
def test_never_beyond_capacity_under_accumulating_load(name: str, data: tuple[NetworkModel, random.Random]) -> None:
    model, rng = data
    state = NetworkState(model)
    scheduler = make_scheduler(name)
    for task_id in range(1, 9):
        task = draw_task(model, rng, task_id)
        assume(task is not None)
        assert task is not None

        s = scheduler.schedule(state, task)

        check_schedule(model, state, task, s)
        if not s.blocked:
            state.admit(s)
    for link in model.iter_links():
        for u, v in ((link.a, link.b), (link.b, link.a)):
            assert state.used_mbps(u, v) <= link.capacity_mbps + EPS


@pytest.mark.parametrize("name", ["mst", "steiner", "spt"])
@SETTINGS
@given(data=networks())
def test_with_hop_weights_a_tree_never_reserves_more_than_spff(
    name: str, data: tuple[NetworkModel, random.Random]
) -> None:
    model, rng = data
    task = draw_task(model, rng)
    assume(task is not None)
    assert task is not None
    state = NetworkState(model)

    tree = get_scheduler(name, weight="hops").schedule(state, task)
    spff = get_scheduler("spff", weight="hops").schedule(state, task)

    assert not tree.blocked and not spff.blocked
    assert tree.reserved_mbps_total <= spff.reserved_mbps_total + EPS
