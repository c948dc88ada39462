"""The orchestrator's REST client against the real WSGI app served on loopback (switches faked)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest

from controller.app import SwitchError
from controller.core import ControllerCore
from controller.rest import RestApi
from controller.southbound import FlowStat
from orchestrator.emulation.controller_client import (
    ControllerClient,
    ControllerHTTPError,
    ControllerUnreachable,
)
from orchestrator.emulation.controller_process import free_port
from orchestrator.emulation.task_paths import task_paths
from orchestrator.scheduling.schedule import OverlayEdge, Schedule, task_ports
from tests.unit.controller_fakes import FakeSwitches, handmade_schedule
from topologies.loaders import load
from topologies.plan import EmulationPlan


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def served() -> Iterator[tuple[ControllerClient, EmulationPlan, FakeSwitches]]:
    plan = EmulationPlan.from_model(load("triangle"))
    fake = FakeSwitches(plan)
    fake.connect_all()
    core = ControllerCore(plan, fake)
    for sw in plan.switches:
        core.switch_connected(sw.dpid)
    server = make_server("127.0.0.1", 0, RestApi(core), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield ControllerClient(f"http://127.0.0.1:{server.server_port}", timeout_s=5), plan, fake
    finally:
        server.shutdown()
        server.server_close()


def test_install_list_and_remove_through_the_client(served: tuple[ControllerClient, EmulationPlan, FakeSwitches]) -> None:
    client, plan, _ = served

    summary = client.install_task(task_paths(handmade_schedule(plan, task_id=5)))
    listed = client.tasks()
    flows = client.flows(5)
    removed = client.remove_task(5)

    assert summary["entries"] == 18
    assert [t["task_id"] for t in listed] == [5]
    assert len(flows) == 18 and {f["task"] for f in flows} == {5}
    assert removed["task_id"] == 5 and client.tasks() == []


def test_errors_carry_the_controllers_message(served: tuple[ControllerClient, EmulationPlan, FakeSwitches]) -> None:
    client, _, _ = served

    with pytest.raises(ControllerHTTPError) as info:
        client.remove_task(77)

    assert info.value.status == 404
    assert "no task 77" in info.value.message


def test_wait_for_names_what_it_awaited(served: tuple[ControllerClient, EmulationPlan, FakeSwitches]) -> None:
    client, _, _ = served

    ok = client.wait_for("three switches", lambda h: h["switches_connected"] == 3, timeout_s=2)
    with pytest.raises(TimeoutError, match="waiting for nine switches"):
        client.wait_for("nine switches", lambda h: h["switches_connected"] == 9, timeout_s=0.3)

    assert ok["status"] == "ok"


def test_only_loopback_is_allowed_and_silence_is_unreachable() -> None:
    with pytest.raises(ValueError, match="loopback only"):
        ControllerClient("http://192.0.2.1:8181")
    client = ControllerClient(f"http://127.0.0.1:{free_port()}", timeout_s=1)

    with pytest.raises(ControllerUnreachable):
        client.health()


def test_task_bytes_sums_the_tasks_counters(served: tuple[ControllerClient, EmulationPlan, FakeSwitches]) -> None:
    client, plan, fake = served
    client.install_task(task_paths(handmade_schedule(plan, task_id=5)))
    bport, _ = task_ports(5)
    for _ in range(3):
        fake.send("A", plan.host("B").ip, tcp_src=40000, tcp_dst=bport, nbytes=1000)

    total = client.task_bytes(5)

    # Three packets over the one link of the A->B broadcast edge: counted at A's switch, which forwards
    # them onto the link; B's switch delivers them to its host, which is not a link.
    assert total == 3 * 1000 * 1


def test_background_flows_are_the_background_routes_entries_only(
        served: tuple[ControllerClient, EmulationPlan, FakeSwitches]) -> None:
    # Prepare: a task and a background pair between the same hosts, both carrying traffic.
    client, plan, fake = served
    client.install_task(task_paths(handmade_schedule(plan, task_id=5)))
    client.set_background([["A", "B"]])
    bport, _ = task_ports(5)
    fake.send("A", plan.host("B").ip, tcp_src=40000, tcp_dst=bport, nbytes=700)  # the task's
    fake.send("A", plan.host("B").ip, tcp_src=40001, tcp_dst=5201, nbytes=300)  # the background's

    # Execute
    background = client.background_flows()

    # Assert: only the background's entries, and only the background's bytes on them.
    assert background and {f["kind"] for f in background} == {"background"}
    assert sum(f["bytes"] for f in background) == 2 * 300  # switch A and switch B each forwarded it
    assert sum(f["bytes"] for f in client.flows()) == 2 * 300 + 2 * 700


class _OneSwitchSilent(FakeSwitches):
    """A switch still connected that no longer answers (its machine was lost): every read of it fails."""

    silent: int = 0

    def flow_stats(self, dpid: int, cookie: int | None) -> list[FlowStat]:
        if dpid == self.silent:
            raise SwitchError(f"switch dpid {dpid} did not answer")
        return super().flow_stats(dpid, cookie)


def test_a_tasks_counters_are_read_from_its_own_switches_only() -> None:
    plan = EmulationPlan.from_model(load("triangle"))
    fake = _OneSwitchSilent(plan)
    fake.connect_all()
    fake.silent = plan.switch("C").dpid
    core = ControllerCore(plan, fake)
    for sw in plan.switches:
        core.switch_connected(sw.dpid)
    edges = (OverlayEdge("broadcast", "A", "B", ("A", "B")), OverlayEdge("upload", "B", "A", ("B", "A")))
    schedule = Schedule(task_id=9, scheduler="handmade", global_site="A", local_sites=("B",), demand_mbps=10.0,
                        broadcast_parent={"B": "A"}, upload_parent={"B": "A"}, edges=edges)
    core.install_task(task_paths(schedule))
    fake.send("A", plan.host("B").ip, tcp_src=40000, tcp_dst=task_ports(9)[0], nbytes=1000)

    flows = core.flows(9)

    assert flows and {f["site"] for f in flows} <= {"A", "B"} and {f["task"] for f in flows} == {9}
    assert sum(f["bytes"] for f in flows) >= 1000
    with pytest.raises(SwitchError):  # the silent switch is still asked when every switch is read
        core.flows()
