"""The simulation's background: the emulation's plan, seeds and on/off processes, and what the
simulated schedulers are told (the background's own rates, never a task's traffic)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from orchestrator.scheduling import NetworkState
from orchestrator.scheduling.background_plan import (
    ON_OFF_PERIODS,
    BackgroundConfig,
    on_off_periods,
    plan_background,
)
from orchestrator.scheduling.cost import capacity_rate
from orchestrator.scheduling.schedule import OverlayEdge, Schedule
from orchestrator.simulation.background import SimBackground, flow_plans
from orchestrator.simulation.ports import SimBatch, SimNetwork
from orchestrator.simulation.spec import SimParams, TaskRun, build_spec
from topologies.loaders import load
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan


def nsfnet() -> tuple[NetworkModel, EmulationPlan]:
    model = load("sndlib/nobel-us")
    return model, EmulationPlan.from_model(model, max_link_mbps=100)


@pytest.mark.parametrize("pattern", ["demand-matrix", "constant", "poisson"])
def test_the_simulated_background_is_the_emulations_plan_with_its_seed(pattern: str) -> None:
    # Prepare: the emulation's background of one config.
    model, plan = nsfnet()
    cfg = BackgroundConfig(pattern=pattern, load=0.3, pairs=4, mean_on_s=1.5, mean_off_s=0.5)

    bg = SimBackground.plan(model, plan, cfg, topology="sndlib/nobel-us", seed=7, emulated_rates=True, share=0.01)

    # Same flows (pairs, rates, paths) as the emulation plans with that seed; another seed differs.
    assert bg is not None
    assert list(bg.flows) == plan_background(model, plan, cfg, topology="sndlib/nobel-us", seed=7)
    spec = bg.to_spec()
    for i, f in enumerate(spec["flows"]):
        assert f["path"] == list(bg.flows[i].path) and f["rate_mbps"] == bg.flows[i].rate_mbps
        # ... and the same on/off processes: flow i seeded seed + i, the emulation's count of periods.
        want = on_off_periods(cfg, 7 + i, ON_OFF_PERIODS) if pattern == "poisson" else None
        assert f["periods"] == want
    if pattern == "poisson":
        other = SimBackground.plan(model, plan, cfg, topology="sndlib/nobel-us", seed=8, emulated_rates=True,
                                   share=0.01)
        assert other is not None and other.to_spec()["flows"][0]["periods"] != spec["flows"][0]["periods"]


def test_an_off_background_plans_nothing() -> None:
    model, plan = nsfnet()
    assert SimBackground.plan(model, plan, BackgroundConfig(enabled=False), topology="sndlib/nobel-us", seed=1,
                              emulated_rates=True, share=0.01) is None


def test_flows_are_bounded_by_their_part_of_the_backgrounds_guarantee() -> None:
    # Prepare: two flows share link a-b (1e6 B/s); one is offered little, one much.
    bg = {"share": 0.01, "flows": [{"path": ["a", "b", "c"], "rate_mbps": 0.016, "periods": None},
                                   {"path": ["a", "b"], "rate_mbps": 80.0, "periods": [(1.0, 2.0)]}]}
    rates = {("a", "b"): 1e6, ("b", "c"): 4e6}

    plans = flow_plans(bg, rates, switch_ns_per_byte_hop=2.0)

    net = [p for p in plans if p["kind"] == "net"]
    cpu = [p for p in plans if p["kind"] == "cpu"]
    assert net[0]["rate_Bps"] == pytest.approx(2000.0)  # offered 0.016 Mbit/s, under 1 % of 1e6 / 2
    assert net[1]["rate_Bps"] == pytest.approx(5000.0)  # 1 % of a-b, split between its two flows
    assert net[1]["periods"] == [(1.0, 2.0)]
    # The switch's work is for the offered bytes, per hop: 2 ns per byte and hop.
    assert [p["rate_Bps"] for p in cpu] == pytest.approx([2000.0 * 2 * 2.0, 1e7 * 1 * 2.0])


def _one_hop(model: NetworkModel) -> Schedule:
    e = OverlayEdge
    return Schedule(task_id=1, scheduler="hand", global_site="G", local_sites=("A",), demand_mbps=1.0,
                    broadcast_parent={"A": "G"}, upload_parent={"A": "G"},
                    edges=(e("broadcast", "G", "A", ("G", "A")), e("upload", "A", "G", ("A", "G"))))


def test_a_background_leaves_a_task_all_but_its_guarantee_on_a_shared_link() -> None:
    pytest.importorskip("simgrid")
    from orchestrator.simulation.spec import simulate

    # Prepare: G - A at 80 Mbit/s; a steady background on G -> A offered far more than its guarantee.
    model = NetworkModel.build("pair", [{"name": "G"}, {"name": "A"}], [
        {"a": "G", "b": "A", "capacity_mbps": 80.0, "delay_ms": 0.0, "wavelengths": 1}])
    size = 1_000_000
    params = SimParams(alpha_s=0.0, chunk_bytes=size, seconds_per_example=0.0, propagation=False)
    spec = build_spec(model, [TaskRun("t", _one_hop(model), size, 1)], params, capacity_rate(model))
    quiet = simulate(spec)["runs"][0]["events"]["A"]
    spec["background"] = {"share": 0.01, "flows": [{"path": ["G", "A"], "rate_mbps": 60.0, "periods": None}]}

    loaded = simulate(spec)["runs"][0]["events"]["A"]

    got = {ev["event"]: ev["t"] for ev in loaded}["global_received"]
    alone = {ev["event"]: ev["t"] for ev in quiet}["global_received"]
    assert alone == pytest.approx(size * 8 / 80e6, rel=1e-9)
    assert got == pytest.approx(size * 8 / (80e6 * 0.99), rel=1e-6)  # htb: the task first, 1 % kept


def test_the_schedulers_view_is_the_backgrounds_rates_and_never_a_tasks_traffic(tmp_path: Path) -> None:
    # Prepare: a batch whose background is planned and whose first task "ran" (fake result: it
    # carried many bytes on links the background also crosses).
    model, plan = nsfnet()
    bg = SimBackground.plan(model, plan, BackgroundConfig(pattern="demand-matrix", load=0.3, pairs=6),
                            topology="sndlib/nobel-us", seed=1, emulated_rates=True, share=0.01)
    assert bg is not None
    batch = SimBatch(model, SimParams(rates="emulated"), capacity_rate(model), bg)
    network = SimNetwork(batch, propagation=False)
    before = network.background(NetworkState(model), task_id=101)
    path = bg.flows[0].path
    batch.ran = True
    batch.results = {"spff/101/1": {"link_bytes": [[u, v, 10**9] for u, v in itertools.pairwise(path)]}}
    network.keys[1] = "spff/101/1"

    after = network.background(NetworkState(model), task_id=102)

    # Each directed link: the flows crossing it, their rates in model Mbit/s as planned, as frames
    # (1514 wire bytes per 1448 of payload), and the ACKs (66 bytes per two segments) of the flows
    # crossing it the other way, as the emulated view counts a pair's entries both ways; the task's
    # 1 GB on the same links is in neither view.
    assert network.task_bytes(1) == round(10**9 * (len(path) - 1) * SimParams().wire_bytes_factor)
    assert before == after
    payload: dict[tuple[str, str], float] = {}
    want: dict[tuple[str, str], float] = {}
    for f in bg.flows:
        for a, b in itertools.pairwise(f.path):
            payload[(a, b)] = payload.get((a, b), 0.0) + f.rate_mbps / plan.bw_scale
            want[(a, b)] = want.get((a, b), 0.0) + f.rate_mbps / plan.bw_scale * 1514 / 1448
            want[(b, a)] = want.get((b, a), 0.0) + f.rate_mbps / plan.bw_scale * 66 / (2 * 1448)
    assert after == pytest.approx(want)
    peak = max(v * plan.bw_scale / next(ln.emulated_mbps for ln in plan.links if {ln.a, ln.b} == set(k))
               for k, v in payload.items())
    assert peak == pytest.approx(0.3)  # the most loaded link carries `load` of its emulated rate


def test_an_on_off_backgrounds_view_is_its_long_run_mean() -> None:
    model, plan = nsfnet()
    steady = SimBackground.plan(model, plan, BackgroundConfig(pattern="constant", pairs=3), topology="x", seed=2,
                                emulated_rates=True, share=0.01)
    cfg = BackgroundConfig(pattern="poisson", pairs=3, mean_on_s=1.0, mean_off_s=3.0)
    onoff = SimBackground.plan(model, plan, cfg, topology="x", seed=2, emulated_rates=True, share=0.01)
    assert steady is not None and onoff is not None
    assert onoff.view_mbps() == pytest.approx({k: v / 4 for k, v in steady.view_mbps().items()})


def test_the_flows_take_the_controllers_routes_and_the_view_follows_them() -> None:
    from controller.flows import background_entries
    from orchestrator.experiment.simulated import controller_route

    # Prepare: Abilene, where the plan's delay paths and the controller's fewest-hops routes differ.
    model = load("sndlib/abilene")
    plan = EmulationPlan.from_model(model, max_link_mbps=100)
    bg = SimBackground.plan(model, plan, BackgroundConfig(pattern="demand-matrix", load=0.3, pairs=6),
                            topology="sndlib/abilene", seed=3, emulated_rates=True, share=0.01)
    assert bg is not None

    routed = bg.routed(lambda a, b: controller_route(plan, a, b))

    # Each flow keeps its rate, takes the controller's path (its entries' switches, in order), and
    # the scheduler's view loads exactly those links (both ways).
    entries = background_entries(plan, [[f.src, f.dst] for f in bg.flows])
    switches = {sw.dpid: sw.site for sw in plan.switches}
    assert any(f.path != g.path for f, g in zip(bg.flows, routed.flows, strict=True))
    for f, g in zip(bg.flows, routed.flows, strict=True):
        assert (g.src, g.dst, g.rate_mbps) == (f.src, f.dst, f.rate_mbps)
        src_ip = next(h.ip for h in plan.hosts if h.site == g.src)
        dst_ip = next(h.ip for h in plan.hosts if h.site == g.dst)
        on = {switches[e.dpid] for e in entries if dict(e.match).get("ipv4_src") == src_ip
              and dict(e.match).get("ipv4_dst") == dst_ip}
        assert set(g.path) == on and len(g.path) == len(on)
    links = {link for g in routed.flows for link in itertools.pairwise(g.path)}
    assert set(routed.view_mbps()) == links | {(b, a) for a, b in links}  # the ACKs come back the same way
