"""The Mininet Topo built from an EmulationPlan: pure data, checked without root."""

from __future__ import annotations

import pytest

pytest.importorskip("mininet.topo")

from topologies.loaders import load
from topologies.mininet_topo import PlanTopo, switch_interfaces
from topologies.plan import HOST_PORT, EmulationPlan


@pytest.fixture(scope="module")
def nsfnet_plan() -> EmulationPlan:
    return EmulationPlan.from_model(load("sndlib/nobel-us"), max_link_mbps=100)


def _link_info(topo: PlanTopo, a: str, b: str) -> dict:
    infos = [info for (n1, n2, info) in topo.links(withInfo=True) if {n1, n2} == {a, b}]
    assert len(infos) == 1, f"expected one link {a}-{b}, got {infos}"
    return infos[0]


def test_nsfnet_topo_has_a_switch_per_site_and_a_host_per_compute_site(nsfnet_plan: EmulationPlan) -> None:
    topo = PlanTopo(nsfnet_plan)

    assert sorted(topo.switches()) == sorted(sw.name for sw in nsfnet_plan.switches)
    assert len(topo.switches()) == 14
    assert sorted(topo.hosts()) == sorted(h.name for h in nsfnet_plan.hosts)
    assert len(topo.links()) == 14 + 21
    assert topo.nodeInfo("s3")["dpid"] == "0000000000000003"
    assert topo.nodeInfo("h1")["ip"] == "10.0.0.1/8"
    assert topo.nodeInfo("h1")["mac"] == "00:00:00:00:00:01"


def test_ports_come_from_the_plan(nsfnet_plan: EmulationPlan) -> None:
    topo = PlanTopo(nsfnet_plan)

    for ln in nsfnet_plan.links:
        sa, sb = nsfnet_plan.switch(ln.a).name, nsfnet_plan.switch(ln.b).name
        info = _link_info(topo, sa, sb)
        ports = {info["node1"]: info["port1"], info["node2"]: info["port2"]}
        assert ports == {sa: ln.port_a, sb: ln.port_b}
    for h in nsfnet_plan.hosts:
        info = _link_info(topo, h.name, h.switch)
        ports = {info["node1"]: info["port1"], info["node2"]: info["port2"]}
        assert ports[h.switch] == HOST_PORT


def test_switch_links_are_shaped_and_host_links_are_not(nsfnet_plan: EmulationPlan) -> None:
    topo = PlanTopo(nsfnet_plan, delay_emulated=False, checksum_offload=False)

    ln = nsfnet_plan.links[0]
    info = _link_info(topo, nsfnet_plan.switch(ln.a).name, nsfnet_plan.switch(ln.b).name)
    assert info["bw"] == pytest.approx(ln.emulated_mbps)
    assert "delay" not in info
    assert (info["txo"], info["rxo"]) == (False, False)
    host_info = _link_info(topo, "h1", "s1")
    assert "bw" not in host_info
    assert (host_info["txo"], host_info["rxo"]) == (False, False)


def test_delay_is_added_only_when_emulated(nsfnet_plan: EmulationPlan) -> None:
    topo = PlanTopo(nsfnet_plan, delay_emulated=True, checksum_offload=True)

    ln = nsfnet_plan.links[0]
    info = _link_info(topo, nsfnet_plan.switch(ln.a).name, nsfnet_plan.switch(ln.b).name)
    assert info["delay"] == f"{ln.delay_ms:.3f}ms"
    assert "txo" not in info


def test_scaled_rates_follow_the_plan() -> None:
    plan = EmulationPlan.from_model(load("triangle"), bw_scale=50 / 80_000)
    topo = PlanTopo(plan)

    rates = sorted(info["bw"] for (_a, _b, info) in topo.links(withInfo=True) if "bw" in info)
    assert rates == pytest.approx([50.0, 50.0, 50.0])


def test_switch_interfaces_names_every_switch_port(nsfnet_plan: EmulationPlan) -> None:
    names = switch_interfaces(nsfnet_plan)

    assert len(names) == 14 + 2 * 21
    assert len(set(names)) == len(names)
    assert "s1-eth1" in names
    ln = nsfnet_plan.links[0]
    assert f"{nsfnet_plan.switch(ln.a).name}-eth{ln.port_a}" in names


def test_host_params_reach_every_host_and_cannot_override_addresses(nsfnet_plan: EmulationPlan) -> None:
    topo = PlanTopo(nsfnet_plan, host_params=lambda h: {"cpus": h.cpu, "image": "netai-worker"})

    info = topo.nodeInfo("h2")
    assert (info["cpus"], info["image"], info["ip"]) == (1.0, "netai-worker", "10.0.0.2/8")
    with pytest.raises(ValueError, match="must not set"):
        PlanTopo(nsfnet_plan, host_params={"ip": "10.9.9.9/8"})
