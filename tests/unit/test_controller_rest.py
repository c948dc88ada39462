"""The controller's core and REST layer, through its WSGI app, with the switches faked."""

from __future__ import annotations

import json
from typing import Any

import pytest
from webob import Request

from controller.core import ControllerCore
from controller.errors import ControllerError
from controller.flows import BACKGROUND_COOKIE, BEST_EFFORT_COOKIE, table_miss_entry
from controller.rest import RestApi
from controller.southbound import PortStat
from orchestrator.emulation.task_paths import task_paths
from orchestrator.scheduling.schedule import task_ports
from tests.unit.controller_fakes import FakeSwitches, handmade_schedule
from topologies.loaders import load
from topologies.plan import EmulationPlan


class BadGateway(ControllerError):
    status = 502


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def plan() -> EmulationPlan:
    return EmulationPlan.from_model(load("triangle"))


@pytest.fixture
def fake(plan: EmulationPlan) -> FakeSwitches:
    return FakeSwitches(plan)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def core(plan: EmulationPlan, fake: FakeSwitches, clock: Clock) -> ControllerCore:
    core = ControllerCore(plan, fake, clock=clock)
    fake.connect_all()
    for sw in plan.switches:
        fake.install(sw.dpid, core.expected_entries(sw.dpid))
        core.switch_connected(sw.dpid)
    return core


@pytest.fixture
def api(core: ControllerCore) -> RestApi:
    return RestApi(core)


def call(api: RestApi, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    req = Request.blank(path, method=method)
    if raw is not None:
        req.body = raw
    elif body is not None:
        req.body = json.dumps(body).encode()
        req.content_type = "application/json"
    resp = req.get_response(api)
    return resp.status_int, json.loads(resp.body)


def test_health_counts_connected_switches(plan: EmulationPlan, fake: FakeSwitches, clock: Clock) -> None:
    core = ControllerCore(plan, fake, clock=clock)
    api = RestApi(core)

    status, before = call(api, "GET", "/health")
    core.switch_connected(1)
    _, after = call(api, "GET", "/health")

    assert status == 200
    assert (before["switches_connected"], before["switches_expected"], before["status"]) == (0, 3, "waiting")
    assert after["switches_connected"] == 1
    assert after["missing"] == ["s2", "s3"]


def test_put_task_installs_its_entries_and_traffic_follows(
    api: RestApi, plan: EmulationPlan, fake: FakeSwitches
) -> None:
    schedule = handmade_schedule(plan, task_id=7)
    bport, _ = task_ports(7)

    status, body = call(api, "PUT", "/tasks/7", task_paths(schedule).to_dict())

    assert status == 201
    assert body["entries"] == 18 and body["switches"] == ["s1", "s2", "s3"]
    assert fake.send("B", plan.host("C").ip, tcp_src=40000, tcp_dst=bport) == ["B", "C"]
    _, listing = call(api, "GET", "/tasks")
    assert [t["task_id"] for t in listing["tasks"]] == [7]
    _, one = call(api, "GET", "/tasks/7")
    assert one["label"] == "handmade" and len(one["paths"]) == 4 and len(one["entries"]) == 18


def test_flows_report_counters_by_task(api: RestApi, plan: EmulationPlan, fake: FakeSwitches, clock: Clock) -> None:
    schedule = handmade_schedule(plan, task_id=7)
    bport, _ = task_ports(7)
    call(api, "PUT", "/tasks/7", task_paths(schedule).to_dict())
    for _ in range(5):
        fake.send("A", plan.host("B").ip, tcp_src=40000, tcp_dst=bport, nbytes=1000)

    clock.t = 123.5  # when the switches are read: the fake says nothing of it, so the core's clock
    status, body = call(api, "GET", "/flows?task=7")

    assert status == 200
    assert {f["task"] for f in body["flows"]} == {7}
    a_to_b = [f for f in body["flows"] if f["switch"] == "s1" and f["match"].get("tcp_dst") == bport
              and f["match"]["ipv4_dst"] == plan.host("B").ip]
    assert [(f["packets"], f["bytes"]) for f in a_to_b] == [(5, 5000)]
    assert {f["read_s"] for f in body["flows"]} == {123.5}
    _, everything = call(api, "GET", "/flows")
    assert len(everything["flows"]) == 18 + 3  # + one table-miss entry per switch


def test_port_bytes_are_read_from_the_switches_when_asked_now(api: RestApi, plan: EmulationPlan,
                                                             fake: FakeSwitches, clock: Clock) -> None:
    # Prepare: a port that has sent 5000 bytes, not yet polled
    ln = plan.links[0]
    fake.port_bytes[(plan.switch(ln.a).dpid, ln.port_a)] = 5000
    clock.t = 321.0

    # Execute
    _, polled = call(api, "GET", "/stats/ports")
    _, now = call(api, "GET", "/stats/ports?read=now")
    status, bad = call(api, "GET", "/stats/ports?read=later")

    # Assert: the poll has nothing yet; the read now has the bytes, stamped with its time
    row = next(r for r in now["links"] if r["link"] == [ln.a, ln.b])
    assert (row["tx_bytes"], row["read_s"]) == (5000, 321.0)
    assert {(r["tx_bytes"], r["read_s"]) for r in polled["links"]} == {(0, None)}
    assert status == 400 and "read must be 'now'" in bad["error"]


def test_a_switch_that_does_not_answer_keeps_its_polled_port_bytes(api: RestApi, plan: EmulationPlan,
                                                                   fake: FakeSwitches, clock: Clock,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: two switches' ports have sent bytes; the first switch times out when read again
    a, b = plan.links[0].a, plan.links[0].b
    for site in (a, b):
        fake.port_bytes[(plan.switch(site).dpid, plan.port_towards(site, b if site == a else a))] = 700
    core = api.core
    core.record_port_stats(plan.switch(a).dpid, fake.port_stats(plan.switch(a).dpid), t_s=5.0)
    fake.port_bytes = {k: 900 for k in fake.port_bytes}
    read = fake.port_stats

    def slow(dpid: int) -> list[Any]:
        if dpid == plan.switch(a).dpid:
            raise ControllerError(f"switch dpid {dpid} did not answer within 5 s")
        return read(dpid)

    monkeypatch.setattr(fake, "port_stats", slow)
    clock.t = 9.0

    # Execute
    status, now = call(api, "GET", "/stats/ports?read=now")

    # Assert: the others are read now; the one that did not answer keeps its polled bytes and time
    rows = {tuple(r["link"]): (r["tx_bytes"], r["read_s"]) for r in now["links"]}
    assert status == 200
    assert rows[(a, b)] == (700, 5.0) and rows[(b, a)] == (900, 9.0)


def test_replacing_and_deleting_a_task_removes_its_entries(
    api: RestApi, plan: EmulationPlan, fake: FakeSwitches
) -> None:
    schedule = handmade_schedule(plan, task_id=7)
    call(api, "PUT", "/tasks/7", task_paths(schedule).to_dict())
    status_again, _ = call(api, "PUT", "/tasks/7", task_paths(schedule).to_dict())
    count_after_replace = sum(len(fake.entries(sw.dpid)) for sw in plan.switches)

    status, body = call(api, "DELETE", "/tasks/7")

    assert status_again == 201
    assert count_after_replace == 18 + 3
    assert status == 200 and body["task_id"] == 7
    for sw in plan.switches:
        assert fake.entries(sw.dpid) == [table_miss_entry(sw.dpid)]
    status, body = call(api, "DELETE", "/tasks/7")
    assert status == 404 and "no task 7" in body["error"]


@pytest.mark.parametrize(
    ("method", "path", "payload", "raw", "status", "fragment"),
    [
        ("PUT", "/tasks/7", None, b"{not json", 400, "malformed JSON"),
        ("PUT", "/tasks/7", None, b"", 400, "empty"),
        ("PUT", "/tasks/7", [1, 2], None, 400, "task-paths JSON object"),
        ("PUT", "/tasks/7", {"task_id": 7}, None, 400, "paths must be a non-empty list"),
        ("PUT", "/tasks/x", {"task_id": 7}, None, 400, "positive integer"),
        ("GET", "/tasks/99", None, None, 404, "no task 99"),
        ("DELETE", "/tasks/99", None, None, 404, "no task 99"),
        ("GET", "/flows?task=99", None, None, 404, "no task 99"),
        ("GET", "/nowhere", None, None, 404, "no such endpoint"),
        ("POST", "/tasks/7", {}, None, 405, "not allowed"),
        ("PUT", "/background", {"pairs": "A-B"}, None, 400, "pairs"),
        ("PUT", "/background", {"pairs": [["A", "Q"]]}, None, 422, "unknown site 'Q'"),
    ],
)
def test_bad_requests_get_a_4xx_with_a_message_and_the_controller_keeps_running(
    api: RestApi, method: str, path: str, payload: Any, raw: bytes | None, status: int, fragment: str
) -> None:
    got_status, body = call(api, method, path, payload, raw)

    assert got_status == status
    assert fragment in body["error"]
    assert call(api, "GET", "/health")[0] == 200


def test_schedule_naming_an_unknown_site_is_refused_and_changes_nothing(
    api: RestApi, plan: EmulationPlan, fake: FakeSwitches
) -> None:
    bad = task_paths(handmade_schedule(plan, task_id=7)).to_dict()
    bad["paths"][1]["dst"] = "Atlantis"
    bad["paths"][1]["sites"] = [bad["paths"][1]["src"], "Atlantis"]
    before = {sw.dpid: fake.entries(sw.dpid) for sw in plan.switches}

    status, body = call(api, "PUT", "/tasks/7", bad)

    assert status == 422 and "Atlantis" in body["error"]
    assert {sw.dpid: fake.entries(sw.dpid) for sw in plan.switches} == before
    assert call(api, "GET", "/tasks")[1] == {"tasks": []}


def test_task_id_mismatch_is_a_conflict(api: RestApi, plan: EmulationPlan) -> None:
    status, body = call(api, "PUT", "/tasks/8", task_paths(handmade_schedule(plan, task_id=7)).to_dict())

    assert status == 409 and "task 7" in body["error"]


def test_install_needs_every_switch_of_the_task(plan: EmulationPlan, fake: FakeSwitches, clock: Clock) -> None:
    core = ControllerCore(plan, fake, clock=clock)
    fake.connect_all()
    core.switch_connected(1)
    api = RestApi(core)

    status, body = call(api, "PUT", "/tasks/7", task_paths(handmade_schedule(plan, task_id=7)).to_dict())

    assert status == 503 and "s2" in body["error"]
    assert core.tasks == {}


def test_background_routes_and_isolation(api: RestApi, plan: EmulationPlan, fake: FakeSwitches) -> None:
    status, body = call(api, "PUT", "/background", {"pairs": [["A", "C"]]})

    assert status == 200 and body == {"pairs": [["A", "C"]], "entries": 4}
    assert fake.send("A", plan.host("C").ip, tcp_src=1, tcp_dst=2) == ["A", "C"]
    assert fake.send("A", plan.host("B").ip, tcp_src=1, tcp_dst=2) is None
    call(api, "DELETE", "/background")
    assert all(e.cookie != BACKGROUND_COOKIE for sw in plan.switches for e in fake.entries(sw.dpid))


def test_port_stats_give_rates_per_directed_link(core: ControllerCore, api: RestApi, plan: EmulationPlan) -> None:
    ln = plan.links[0]
    dpid_a = plan.switch(ln.a).dpid
    core.record_port_stats(dpid_a, [PortStat(ln.port_a, 0, 1_000_000, 0, 0)], t_s=10.0)
    core.record_port_stats(dpid_a, [PortStat(ln.port_a, 0, 3_500_000, 0, 0)], t_s=12.0)

    status, body = call(api, "GET", "/stats/ports")

    row = next(r for r in body["links"] if r["link"] == [ln.a, ln.b])
    assert status == 200
    assert row["tx_bytes"] == 3_500_000
    assert row["rate_mbps"] == pytest.approx(10.0)
    assert row["utilisation"] == pytest.approx(10.0 / ln.emulated_mbps)
    assert len(body["links"]) == 2 * len(plan.links)


def test_port_status_changes_are_visible(core: ControllerCore, api: RestApi, plan: EmulationPlan) -> None:
    ln = plan.links[0]
    core.record_port_status(plan.switch(ln.a).dpid, ln.port_a, "modify", link_down=True)

    _, topo = call(api, "GET", "/topology")
    _, links = call(api, "GET", "/stats/ports")

    assert topo["port_events"][-1]["link"] == [ln.a, ln.b]
    assert topo["ports_down"] == [{"switch": plan.switch(ln.a).name, "port": ln.port_a, "link": [ln.a, ln.b]}]
    assert next(r for r in links["links"] if r["link"] == [ln.a, ln.b])["up"] is False
    assert topo["plan"]["topology"] == plan.topology


def test_a_switch_failing_mid_install_rolls_the_task_back(
    plan: EmulationPlan, fake: FakeSwitches, clock: Clock
) -> None:
    class FailingOnS3(FakeSwitches):
        def install(self, dpid: int, entries: Any) -> None:
            if dpid == 3 and any(e.cookie == 7 for e in entries):
                raise BadGateway("s3 rejected a flow mod")
            super().install(dpid, entries)

    failing = FailingOnS3(plan)
    failing.connect_all()
    core = ControllerCore(plan, failing, clock=clock)
    for sw in plan.switches:
        core.switch_connected(sw.dpid)

    status, body = call(RestApi(core), "PUT", "/tasks/7", task_paths(handmade_schedule(plan, task_id=7)).to_dict())

    assert status == 502 and "s3 rejected" in body["error"]
    assert core.tasks == {}
    assert all(e.cookie != 7 for sw in plan.switches for e in failing.entries(sw.dpid))


def test_a_reconnecting_switch_gets_everything_it_must_hold(api: RestApi, core: ControllerCore, plan: EmulationPlan) -> None:
    call(api, "PUT", "/tasks/7", task_paths(handmade_schedule(plan, task_id=7)).to_dict())
    call(api, "PUT", "/background", {"pairs": [["A", "C"]]})
    dpid = plan.switch("B").dpid

    entries = core.expected_entries(dpid)

    assert entries[-1] == table_miss_entry(dpid)
    # The background pair A-C uses the direct A-C link, so B holds only the task and the table-miss.
    assert {e.cookie for e in entries} == {0, 7}
    assert {e.cookie for e in core.expected_entries(plan.switch("A").dpid)} == {0, 7, BACKGROUND_COOKIE}
    assert len([e for e in entries if e.cookie == 7]) == len([e for e in core.tasks[7].entries if e.dpid == dpid])


def test_a_task_whose_ports_clash_with_an_installed_task_is_refused(api: RestApi, plan: EmulationPlan) -> None:
    call(api, "PUT", "/tasks/7", task_paths(handmade_schedule(plan, task_id=7)).to_dict())
    same_ports = 7 + 10000  # task ports repeat every 10000 task ids

    status, body = call(api, "PUT", f"/tasks/{same_ports}", task_paths(handmade_schedule(plan, task_id=same_ports)).to_dict())

    assert status == 409 and "overwrite task 7" in body["error"]
    assert [t["task_id"] for t in call(api, "GET", "/tasks")[1]["tasks"]] == [7]


def test_best_effort_core_routes_every_pair_and_labels_its_entries(plan: EmulationPlan, clock: Clock) -> None:
    # Prepare: a core in best-effort mode whose switches got what it expects, and a task on top.
    fake = FakeSwitches(plan)
    core = ControllerCore(plan, fake, clock=clock, connectivity="best-effort")
    fake.connect_all()
    for sw in plan.switches:
        fake.install(sw.dpid, core.expected_entries(sw.dpid))
        core.switch_connected(sw.dpid)
    api = RestApi(core)
    call(api, "PUT", "/tasks/7", task_paths(handmade_schedule(plan, task_id=7)).to_dict())
    bport, _ = task_ports(7)

    # Execute
    best_effort = fake.send("C", plan.host("B").ip, tcp_src=40000, tcp_dst=5201)
    task = fake.send("A", plan.host("B").ip, tcp_src=40000, tcp_dst=bport)
    _, health = call(api, "GET", "/health")
    _, flows = call(api, "GET", "/flows")
    call(api, "DELETE", "/tasks/7")

    # Assert: both reach B, the flows say who installed what, and removing the task keeps best effort.
    assert (best_effort, task) == (["C", "B"], ["A", "B"])
    assert health["connectivity"] == "best-effort"
    kinds = {f["kind"] for f in flows["flows"]}
    assert kinds == {"table-miss", "best-effort", "task"}
    assert all(f["task"] is None for f in flows["flows"] if f["kind"] == "best-effort")
    assert len([f for f in flows["flows"] if f["kind"] == "best-effort"]) == len(plan.hosts) * len(plan.switches)
    assert {e.cookie for sw in plan.switches for e in fake.entries(sw.dpid)} == {0, BEST_EFFORT_COOKIE}


def test_strict_core_holds_no_best_effort_entries_and_rejects_unknown_modes(
    core: ControllerCore, plan: EmulationPlan, fake: FakeSwitches, clock: Clock
) -> None:
    assert core.connectivity == "strict"
    assert fake.send("C", plan.host("B").ip, tcp_src=40000, tcp_dst=5201) is None
    with pytest.raises(ValueError, match="connectivity"):
        ControllerCore(plan, fake, clock=clock, connectivity="open")


def test_flows_of_an_unknown_kind_are_refused(api: RestApi) -> None:
    status, body = call(api, "GET", "/flows?kind=task")

    assert status == 400 and "kind must be 'background'" in body["error"]
