"""NSFNET in Mininet with the real controller: bring-up time, flow tables vs the schedule, traffic.

NSFNET (`sndlib/nobel-us`) is brought up once for the module. When a test fails, its teardown prints
every switch's flow table and the end of the controller's log.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import time
from collections.abc import Callable, Iterator

import pytest

from controller.flows import BACKGROUND_COOKIE, table_miss_entries
from orchestrator.emulation import ovs_socket
from orchestrator.emulation.controller_client import ControllerHTTPError
from orchestrator.emulation.network import Emulation
from orchestrator.emulation.selftest import (
    compare_flow_tables,
    dump_flows,
    edge_port,
    expected_entries,
    iperf,
    isolated_pair,
    ping_ok,
    poll_counter,
)
from orchestrator.emulation.task_paths import task_paths
from orchestrator.scheduling import NetworkState, Schedule, get_scheduler
from orchestrator.scheduling.tasks import generate_tasks
from topologies.loaders import load
from topologies.mininet_topo import switch_interfaces
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root, pytest.mark.slow]

TOPOLOGY = "sndlib/nobel-us"
MAX_BRINGUP_S = 30.0


@pytest.fixture(scope="module")
def nsfnet() -> Iterator[Emulation]:
    plan = EmulationPlan.from_model(load(TOPOLOGY))
    emu = Emulation(plan, connectivity="strict")  # isolation and exact flow tables: no best-effort routes
    emu.start()
    try:
        yield emu
    finally:
        info = emu.stop()
        assert info is not None
        print(f"\nNSFNET teardown in {info.teardown_s:.2f} s, leftovers {info.leftovers}")
        assert info.teardown_clean, f"teardown left {info.leftovers}"


@pytest.fixture(autouse=True)
def dump_on_failure(request: pytest.FixtureRequest, nsfnet: Emulation) -> Iterator[None]:
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(dump_flows(nsfnet))
        assert nsfnet.controller is not None
        print("--- controller log\n" + nsfnet.controller.log_tail(40))


@pytest.fixture(scope="module")
def mst_schedule(nsfnet: Emulation) -> Schedule:
    model = load(TOPOLOGY)
    task = generate_tasks(model, count=1, locals_per_task=5, seed=3, first_id=11)[0]
    schedule = get_scheduler("mst").schedule(NetworkState(model), task)
    assert not schedule.blocked, schedule.reason
    return schedule


@pytest.fixture
def installed(nsfnet: Emulation, mst_schedule: Schedule) -> Iterator[Schedule]:
    nsfnet.install_task(mst_schedule)
    yield mst_schedule
    nsfnet.client.remove_task(mst_schedule.task_id)


def test_nsfnet_comes_up_with_every_switch_connected_quickly(nsfnet: Emulation, figures: list[str]) -> None:
    info = nsfnet.info
    assert info is not None

    health = nsfnet.client.health()

    figures.append(f"NSFNET bring-up: {info.switches_connected}/14 switches connected in {info.bringup_s:.2f} s "
                   f"(datapath {info.datapath}, delay emulated: {info.delay_emulated})")
    assert health["switches_connected"] == health["switches_expected"] == 14
    assert info.bringup_s < MAX_BRINGUP_S
    if info.datapath == "tc":  # every switch is its ports, which share its ingress block
        qdiscs = json.loads(subprocess.run(["tc", "-j", "qdisc", "show"], capture_output=True, text=True,
                                           check=True).stdout)
        blocks = {q["dev"]: q.get("ingress_block") for q in qdiscs if q.get("kind") == "ingress"}
        wanted = {dev: int(dev.split("-eth")[0][1:]) for dev in switch_interfaces(nsfnet.plan)}
        assert {dev: blocks.get(dev) for dev in wanted} == wanted
    else:
        bridges = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True, check=True).stdout.split()
        assert {sw.name for sw in nsfnet.plan.switches} <= set(bridges)


def test_every_host_has_a_permanent_neighbour_entry_for_every_other(nsfnet: Emulation) -> None:
    """`static_arp`'s batches: no host resolves another's address on the wire (the switches drop it)."""
    hosts = nsfnet.net.hosts
    for host in hosts:
        entries = json.loads(host.cmd("ip -j neigh show nud permanent"))
        got = {(e["dst"], e["lladdr"]) for e in entries if e.get("dev") == str(host.defaultIntf())}
        assert got == {(other.IP(), other.MAC()) for other in hosts if other is not host}, host.name


def test_every_switch_port_is_read_with_the_full_receive_buffer(nsfnet: Emulation) -> None:
    """The userspace datapath's per-port packet sockets got the raised receive default (bursts into a
    port are not dropped before any shaped link), and the run records the smallest of them."""
    info = nsfnet.info
    assert info is not None
    if info.datapath != "user":
        pytest.skip("the kernel datapath reads ports without packet sockets")
    ports = set(switch_interfaces(nsfnet.plan))
    buffers = {dev: rb for dev, rb in ovs_socket.port_receive_buffers().items() if dev in ports}
    assert set(buffers) == ports, f"no packet socket seen for {sorted(ports - set(buffers))[:5]}"
    assert min(buffers.values()) >= ovs_socket.RECEIVE_TARGET_BYTES
    assert info.ovs_receive_buffer == min(buffers.values())


def test_flow_tables_equal_the_schedule(nsfnet: Emulation, installed: Schedule) -> None:
    diffs = compare_flow_tables(nsfnet, expected_entries(nsfnet.plan, [installed]))

    assert diffs == {}


def test_overlay_neighbours_reach_each_other_and_others_are_isolated(nsfnet: Emulation, installed: Schedule) -> None:
    failures = []
    for edge in installed.edges:
        r = iperf(nsfnet.host(edge.src), nsfnet.host(edge.dst), edge_port(installed, edge.procedure), nbytes=32_000)
        if not r.ok:
            failures.append((edge.procedure, edge.src, edge.dst, r.error))
    a, b = isolated_pair(nsfnet.plan, set(installed.overlay_nodes))
    blocked = iperf(nsfnet.host(a), nsfnet.host(b), edge_port(installed, "broadcast"), nbytes=10_000,
                    connect_timeout_s=1.0)

    assert failures == []
    assert not blocked.ok
    assert not ping_ok(nsfnet.host(a), nsfnet.host(b))


def test_broadcast_edge_does_not_carry_other_ports(nsfnet: Emulation, installed: Schedule) -> None:
    edge = installed.edges_of("broadcast")[0]

    wrong_port = iperf(nsfnet.host(edge.src), nsfnet.host(edge.dst), 5201, nbytes=10_000, connect_timeout_s=1.0)

    assert not wrong_port.ok


def test_task_byte_counters_grow_by_at_least_the_bytes_sent(nsfnet: Emulation, installed: Schedule) -> None:
    edge = max(installed.edges, key=lambda e: len(e.path))
    port = edge_port(installed, edge.procedure)
    dst_ip = nsfnet.plan.host(edge.dst).ip

    def counted() -> dict[str, int]:
        per_switch: dict[str, int] = {}
        for f in nsfnet.client.flows(installed.task_id):
            if f["match"].get("ipv4_dst") == dst_ip and f["match"].get("tcp_dst") == port:
                per_switch[f["site"]] = f["bytes"]
        return per_switch

    before = counted()
    sent = iperf(nsfnet.host(edge.src), nsfnet.host(edge.dst), port, nbytes=3_000_000)
    assert sent.ok, sent.error
    for site in edge.path:

        def grown_at(s: str = site) -> int:
            return counted().get(s, 0) - before.get(s, 0)

        grown = poll_counter(grown_at, sent.bytes_received)
        assert grown >= sent.bytes_received > 1_000_000, f"switch of {site}: {grown} < {sent.bytes_received}"
    flows = nsfnet.client.flows(installed.task_id)
    assert {f["task"] for f in flows} == {installed.task_id}


def test_link_stats_see_the_traffic(nsfnet: Emulation, installed: Schedule) -> None:
    edge = max(installed.edges, key=lambda e: len(e.path))
    u, v = edge.path[0], edge.path[1]

    def tx_bytes() -> int:
        return next(r["tx_bytes"] for r in nsfnet.client.link_stats() if r["link"] == [u, v])

    before = tx_bytes()
    sent = iperf(nsfnet.host(edge.src), nsfnet.host(edge.dst), edge_port(installed, edge.procedure), nbytes=1_000_000)
    assert sent.ok, sent.error
    # The controller polls port counters every second.
    grown = poll_counter(lambda: tx_bytes() - before, sent.bytes_received)

    assert grown >= sent.bytes_received


def test_removing_the_task_leaves_only_the_table_miss_entries(nsfnet: Emulation, mst_schedule: Schedule) -> None:
    nsfnet.install_task(mst_schedule)
    nsfnet.client.remove_task(mst_schedule.task_id)

    diffs = compare_flow_tables(nsfnet, table_miss_entries(nsfnet.plan))

    assert diffs == {}
    assert nsfnet.client.tasks() == []


def test_background_pairs_are_routed_below_tasks(nsfnet: Emulation) -> None:
    a, b = nsfnet.plan.hosts[0].site, nsfnet.plan.hosts[5].site
    nsfnet.client.set_background([[a, b]])
    try:
        reached = iperf(nsfnet.host(a), nsfnet.host(b), 5201, nbytes=100_000)
        diffs = compare_flow_tables(nsfnet, expected_entries(nsfnet.plan, [], [[a, b]]))
        bg = [f for f in nsfnet.client.flows() if f["cookie"] == BACKGROUND_COOKIE]
    finally:
        nsfnet.client.set_background([])

    assert reached.ok, reached.error
    assert diffs == {}
    assert bg and all(f["priority"] == 100 for f in bg)


def test_bad_requests_get_4xx_and_the_controller_keeps_running(nsfnet: Emulation, mst_schedule: Schedule) -> None:
    bad = task_paths(dataclasses.replace(mst_schedule, task_id=99)).to_dict()
    bad["paths"][0]["sites"][-1] = "Atlantis"
    bad["paths"][0]["dst"] = "Atlantis"
    statuses = {}
    for name, call in {
        "malformed": lambda: nsfnet.client.request("PUT", "/tasks/99", "{oops"),
        "unknown task": lambda: nsfnet.client.remove_task(12345),
        "unknown site": lambda: nsfnet.client.install_task(bad),
    }.items():
        with pytest.raises(ControllerHTTPError) as info:
            call()
        statuses[name] = (info.value.status, info.value.message)

    assert statuses["malformed"][0] == 400
    assert statuses["unknown task"][0] == 404 and "12345" in statuses["unknown task"][1]
    assert statuses["unknown site"][0] == 422 and "Atlantis" in statuses["unknown site"][1]
    assert nsfnet.client.health()["switches_connected"] == 14


def test_port_status_changes_are_visible_through_the_api(nsfnet: Emulation) -> None:
    ln = nsfnet.plan.links[0]
    switch = nsfnet.plan.switch(ln.a).name
    intf = f"{switch}-eth{ln.port_a}"

    def down_ports() -> list[dict]:
        return list(nsfnet.client.topology()["ports_down"])

    subprocess.run(["ip", "link", "set", intf, "down"], check=True)
    try:
        seen_down = poll_until(lambda: any(p["switch"] == switch and p["port"] == ln.port_a for p in down_ports()))
    finally:
        subprocess.run(["ip", "link", "set", intf, "up"], check=True)
    seen_up = poll_until(lambda: not any(p["switch"] == switch and p["port"] == ln.port_a for p in down_ports()))
    events = nsfnet.client.topology()["port_events"]

    assert seen_down and seen_up
    assert any(e["link"] == [ln.a, ln.b] and e["up"] is False for e in events)


def poll_until(check: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Poll `check` until it holds; False after `timeout_s` (the caller asserts and names it)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True
