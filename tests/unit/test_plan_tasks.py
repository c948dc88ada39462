"""The emulation plan (names, ports, scaled rates) and tasks (validation, seeded generation)."""

from __future__ import annotations

import pytest

from orchestrator.errors import ConfigError
from orchestrator.scheduling.tasks import Task, generate_tasks, max_locals, validate_task
from topologies.errors import TopologyError
from topologies.loaders import load, with_compute_sites
from topologies.plan import HOST_PORT, EmulationPlan


def test_plan_ports_are_unique_per_switch_and_rates_scaled() -> None:
    model = load("sndlib/nobel-us")

    plan = EmulationPlan.from_model(model, max_link_mbps=100)

    for sw in plan.switches:
        ports = [HOST_PORT] + [ln.port_a for ln in plan.links if ln.a == sw.site] + [
            ln.port_b for ln in plan.links if ln.b == sw.site
        ]
        assert len(ports) == len(set(ports)) == 1 + model.graph.degree[sw.site]
    assert max(ln.emulated_mbps for ln in plan.links) == pytest.approx(100)
    link = next(ln for ln in plan.links if {ln.a, ln.b} == {"Palo-Alto", "San-Diego"})
    assert plan.port_towards(link.a, link.b) == link.port_a
    assert plan.port_towards(link.b, link.a) == link.port_b
    assert len({h.ip for h in plan.hosts}) == 14
    assert EmulationPlan.from_dict(plan.to_dict()) == plan


def test_plan_rejects_rates_beyond_what_can_be_emulated() -> None:
    with pytest.raises(TopologyError, match="at most 1000"):
        EmulationPlan.from_model(load("triangle"), bw_scale=1.0)


def test_generate_tasks_is_seeded_and_valid() -> None:
    model = load("sndlib/nobel-us")

    a = generate_tasks(model, count=30, locals_per_task=13, seed=7)
    b = generate_tasks(model, count=30, locals_per_task=13, seed=7)

    assert a == b
    assert [t.id for t in a] == list(range(1, 31))
    for t in a:
        assert t.global_site not in t.local_sites and len(set(t.local_sites)) == 13


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (Task(1, "Boulder", ("Nowhere",)), "unknown site"),
        (Task(1, "Boulder", ("Boulder", "Houston")), "also a local site"),
        (Task(1, "Boulder", ()), "at least one local"),
        (Task(1, "Boulder", ("Houston", "Houston")), "listed twice"),
        (Task(0, "Boulder", ("Houston",)), "positive integer"),
        (Task(1, "Boulder", ("Houston",), rounds=0), "rounds"),
    ],
)
def test_invalid_tasks(task: Task, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate_task(load("sndlib/nobel-us"), task)


def test_local_on_site_without_compute_and_too_many_locals() -> None:
    model = with_compute_sites(load("sndlib/nobel-us"), ["Boulder", "Houston", "Atlanta"])

    with pytest.raises(ConfigError, match="no compute"):
        validate_task(model, Task(1, "Boulder", ("Seattle",)))
    assert max_locals(model) == 2
    with pytest.raises(ConfigError, match="at most 2 locals"):
        generate_tasks(model, count=1, locals_per_task=3)
