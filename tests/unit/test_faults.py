"""Faults and rescheduling without an emulation: the events' validation, the injector's order and
outcomes, what the watcher reports, the network without cut links, the controller's own database
and its restore, and the round engine's absent children and resumption (fakes for speed; the real
thing is tests/integration/test_faults.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from controller.core import ControllerCore
from controller.shaping import TcShaper
from controller.state_store import StateStore
from orchestrator.emulation.task_paths import task_paths
from orchestrator.errors import ConfigError
from orchestrator.experiment.config import load_config, parse_config
from orchestrator.experiment.faults import (
    FaultEvent,
    FaultInjector,
    LinkWatcher,
    busiest_link,
    mixed_triggers,
    parse_events,
    parse_reschedule,
)
from orchestrator.lifecycle.policy import crosses, link_name
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.tasks import Task
from tests.unit.controller_fakes import FakeSwitches, handmade_schedule
from tests.unit.test_controller_shaping import FakeTc
from topologies.loaders import load
from topologies.plan import EmulationPlan
from workers.aggregate import fingerprint
from workers.config import AgentConfig, Peer, checkpoint_of
from workers.control import ProtocolError, check_request

NSF = "sndlib/nobel-us"
ROOT = Path(__file__).resolve().parents[2]


# -- events and policies in the config -------------------------------------------------------------------
def test_events_are_validated_and_sorted() -> None:
    model = load(NSF)
    evs = parse_events([{"at_s": 9, "action": "controller_restart"},
                        {"at_s": 2, "action": "link_down", "link": ["Seattle", "Palo-Alto"]},
                        {"at_s": 5, "action": "server_kill", "site": "Boulder", "restart_after_s": 1},
                        {"at_s": 6, "action": "link_up", "on_task": 3},
                        {"at_s": 7, "action": "background", "load": 0.5}], model)
    assert [e.action for e in evs] == ["link_down", "server_kill", "link_up", "background", "controller_restart"]
    assert evs[0].link == ("Seattle", "Palo-Alto") and evs[2].on_task == 3 and evs[3].load == 0.5


@pytest.mark.parametrize(("event", "message"), [
    ({"at_s": 1, "action": "explode"}, "action must be one of"),
    ({"at_s": -1, "action": "controller_restart"}, "at_s must be a number"),
    ({"action": "controller_restart"}, "needs at_s"),
    ({"at_s": 1, "action": "link_down", "link": ["Seattle", "Atlanta"]}, "is not a link"),
    ({"at_s": 1, "action": "link_down"}, "either link"),
    ({"at_s": 1, "action": "link_down", "link": ["Seattle", "Palo-Alto"], "on_task": 1}, "either link"),
    ({"at_s": 1, "action": "server_kill", "site": "Atlantis"}, "compute site"),
    ({"at_s": 1, "action": "server_kill", "site": "Boulder", "extra": 1}, "unknown key 'extra'"),
    ({"at_s": 1, "action": "background", "load": 2}, "load must be a number"),
    ({"at_s": 1, "action": "link_up", "on_task": 1.5}, "on_task must be a task id"),
    ("link_down", "must be a mapping"),
    ({"at_s": 1, "at_round": {"task": 1, "round": 5}, "action": "controller_restart"}, "one of them"),
    ({"at_round": {"task": 1}, "action": "controller_restart"}, r"at_round must be a mapping \{task: N, round: R\}"),
    ({"at_round": {"task": 1, "round": 0}, "action": "controller_restart"}, "positive integers"),
    ({"at_round": {"task": 1, "round": True}, "action": "controller_restart"}, "positive integers"),
    ({"at_round": {"task": 4, "round": 5}, "action": "controller_restart"}, r"task 4 is not in the trace \(online"),
    ({"at_round": {"task": 1, "round": 10}, "action": "controller_restart"}, "not before the task's last round"),
])
def test_bad_events_are_refused_with_the_reason(event: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_events([event], load(NSF), tasks=3, rounds=10)


def test_events_at_a_round_come_after_timed_ones_and_round_trip() -> None:
    raw = [{"at_round": {"task": 2, "round": 7}, "action": "controller_restart"},
           {"at_s": 30, "action": "background", "load": 0.5},
           {"at_round": {"task": 1, "round": 40}, "action": "server_kill", "site": "Boulder", "restart_after_s": 2}]
    evs = parse_events(raw, load(NSF), tasks=2, rounds=50)
    assert [(e.action, e.at_s, e.at_round) for e in evs] == [
        ("background", 30.0, None), ("server_kill", None, (1, 40)), ("controller_restart", None, (2, 7))]
    assert evs[1].when == "after round 40 of task 1" and evs[0].when == "at 30.0 s"
    assert evs[1].to_dict() == {"action": "server_kill", "at_round": {"task": 1, "round": 40}, "site": "Boulder",
                                "restart_after_s": 2.0}
    cfg = parse_config({"name": "x", "topology": NSF, "mode": "online", "locals": [2], "online": {"tasks": 2},
                        "task": {"rounds": 50}, "events": raw})
    assert cfg.events == evs and parse_config(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match=r"events\[0\]\.at_round: round 7 is not before the task's last round \(5\)"):
        parse_config({"name": "x", "topology": NSF, "mode": "online", "locals": [2], "online": {"tasks": 2},
                      "task": {"rounds": 5}, "events": raw})


def test_a_target_whose_events_mix_timed_and_round_triggers_is_warned_of() -> None:
    model = load(NSF)
    a, b = next(iter(model.links))
    mixed = parse_events([{"at_round": {"task": 1, "round": 40}, "action": "link_down", "link": [a, b]},
                          {"at_s": 20, "action": "link_up", "link": [a, b]},
                          {"at_s": 5, "action": "background", "load": 0.5},
                          {"at_round": {"task": 1, "round": 10}, "action": "background", "load": 0.0},
                          {"at_s": 1, "action": "server_kill", "site": "Boulder"},
                          {"at_s": 9, "action": "server_restart", "site": "Boulder"},
                          {"at_round": {"task": 1, "round": 3}, "action": "controller_restart"}],
                         model, tasks=1, rounds=50)

    warnings = mixed_triggers(mixed)

    assert len(warnings) == 2
    assert any(w.startswith(f"the events on {link_name((a, b))} mix triggers (link_up at 20.0 s, link_down "
                            "after round 40 of task 1)") for w in warnings)
    assert any(w.startswith("the events on the background load mix triggers") for w in warnings)
    assert mixed_triggers(mixed[:1]) == [] and mixed_triggers(()) == []


def test_reschedule_section_and_mode() -> None:
    assert parse_reschedule(None).policies == ("on_failure",)
    assert parse_reschedule({"policies": "never"}).policies == ("never",)
    with pytest.raises(ConfigError, match="distinct policies"):
        parse_reschedule({"policies": ["never", "never"]})
    with pytest.raises(ConfigError, match=r"unknown key reschedule\.every"):
        parse_reschedule({"every": 3})
    with pytest.raises(ConfigError, match="need mode: online"):
        parse_config({"name": "x", "topology": NSF, "events": [{"at_s": 1, "action": "controller_restart"}]})
    cfg = parse_config({"name": "x", "topology": NSF, "mode": "online", "locals": [2],
                        "events": [{"at_s": 1, "action": "controller_restart"}],
                        "reschedule": {"policies": ["never", "periodic"], "period_s": 2}})
    assert cfg.faults and cfg.reschedule.period_s == 2.0
    assert cfg.to_dict()["events"] == [{"at_s": 1.0, "action": "controller_restart"}]
    assert parse_config(cfg.to_dict()) == cfg  # what a run records parses back (trimmed runs re-parse it)


def test_a_sequential_config_round_trips_without_online_sections() -> None:
    shipped = sorted((ROOT / "experiments").glob("*.yaml"))
    assert {"quick", "paper", "online", "faults", "plugin"} <= {p.stem for p in shipped}
    for path in shipped:
        cfg = load_config(path)
        assert parse_config(cfg.to_dict()) == cfg, path.name
    assert "reschedule" not in load_config(ROOT / "experiments" / "quick.yaml").to_dict()


# -- the injector ------------------------------------------------------------------------------------------
class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.rows: list[dict[str, Any]] = []
        self.restarts = 0

    # emulation
    def set_link(self, a: str, b: str, up: bool) -> None:
        self.calls.append(("link", a, b, up))

    def restart_controller(self) -> dict[str, Any]:
        self.calls.append(("controller",))
        return {"restored_tasks": [4]}

    # compute
    def kill_server(self, site: str) -> None:
        self.calls.append(("kill", site))

    def restart_server(self, site: str) -> float:
        self.calls.append(("restart", site))
        self.restarts += 1
        if self.restarts > 1:
            raise RuntimeError("it will not come back")
        return 0.5

    def record(self, **row: Any) -> None:
        self.rows.append(row)


def test_injector_applies_due_events_in_order_and_records_failures() -> None:
    now = [0.0]
    rec = Recorder()
    events = parse_events([{"at_s": 1, "action": "link_down", "on_task": 7},
                           {"at_s": 2, "action": "server_kill", "site": "Boulder", "restart_after_s": 1.5},
                           {"at_s": 3, "action": "controller_restart"},
                           {"at_s": 4, "action": "link_up", "on_task": 7},
                           {"at_s": 5, "action": "background", "load": 0.1},
                           {"at_s": 6, "action": "server_restart", "site": "Boulder"}], load(NSF))
    inj = FaultInjector(events, rec, rec, lambda: now[0], rec.record,
                        task_link=lambda tid: ("Boulder", "Lincoln") if tid == 7 else None)
    assert inj.due() == []  # not started: nothing applied
    inj.start()
    for t in (0.5, 1.0, 2.9, 3.6, 10.0):
        now[0] = t
        inj.due()
    # The kill applied at 2.9 s brings its restart at 4.4 s: after the link's return at 4 s.
    assert rec.calls == [("link", "Boulder", "Lincoln", False), ("kill", "Boulder"), ("controller",),
                         ("link", "Boulder", "Lincoln", True), ("restart", "Boulder"), ("restart", "Boulder")]
    assert [(r["action"], r["ok"]) for r in rec.rows] == [
        ("link_down", True), ("server_kill", True), ("controller_restart", True), ("link_up", True),
        ("server_restart", True), ("background", False), ("server_restart", False)]
    assert rec.rows[0]["detail"] == "Boulder - Lincoln"
    assert rec.rows[2]["detail"] == "restored tasks [4]"
    assert rec.rows[4]["at_s"] == 10.0 and rec.rows[4]["detail"] == "back in 0.50 s"
    assert "no background" in rec.rows[5]["detail"] and "will not come back" in rec.rows[6]["detail"]
    assert inj.pending == 0


def test_injector_fires_round_events_on_the_task_s_progress_and_records_what_it_never_applied() -> None:
    now, done = [0.0], {1: 0}
    rec = Recorder()
    events = parse_events([{"at_round": {"task": 1, "round": 20}, "action": "server_kill", "site": "Boulder",
                            "restart_after_s": 1},
                           {"at_round": {"task": 1, "round": 50}, "action": "controller_restart"},
                           {"at_round": {"task": 2, "round": 3}, "action": "link_down", "on_task": 2},
                           {"at_s": 100, "action": "background", "load": 0.1}], load(NSF))
    inj = FaultInjector(events, rec, rec, lambda: now[0], rec.record, progress=lambda tid: done.get(tid))
    inj.start()
    for t, rounds in ((1.0, 19), (2.0, 20), (2.5, 49), (3.5, 49), (4.0, 61)):
        now[0], done[1] = t, rounds
        inj.due()
        if t == 2.0:
            assert rec.calls == [("kill", "Boulder")]  # at round 20, not 19
    # The kill's restart is timed (1 s after it); the restart waits for round 50; task 2 never ran.
    assert rec.calls == [("kill", "Boulder"), ("restart", "Boulder"), ("controller",)]
    assert inj.pending == 2
    left = inj.finish()
    assert [(e.action, e.when) for e in left] == [("background", "at 100.0 s"), ("link_down", "after round 3 of task 2")]
    assert [(r["action"], r["ok"]) for r in rec.rows[-2:]] == [("background", False), ("link_down", False)]
    assert rec.rows[-1]["detail"] == "not applied: the trace ended before it was due (after round 3 of task 2)"
    assert inj.pending == 0 and inj.finish() == []


def test_injector_reports_an_on_task_cut_without_that_task() -> None:
    rec = Recorder()
    inj = FaultInjector([FaultEvent(at_s=0, action="link_down", on_task=2)], rec, rec, lambda: 5.0, rec.record,
                        task_link=lambda tid: None)
    inj.start()
    inj.due()
    assert rec.calls == [] and not rec.rows[0]["ok"] and "not running" in rec.rows[0]["detail"]


class Topo:
    def __init__(self) -> None:
        self.down: list[dict[str, Any]] = []
        self.fail = False

    def topology(self) -> dict[str, Any]:
        if self.fail:
            raise ConnectionError("restarting")
        return {"ports_down": self.down}


def test_watcher_reports_links_going_down_and_up_once() -> None:
    topo = Topo()
    w = LinkWatcher(topo)
    assert w.poll() == (set(), set())
    topo.down = [{"link": ["B", "A"]}, {"link": ["A", "B"]}, {"link": ["C", "host"]}]
    assert w.poll() == ({("A", "B")}, set())
    assert w.poll() == (set(), set())
    topo.fail = True
    assert w.poll() == (set(), set())  # a restarting controller changes nothing
    topo.fail, topo.down = False, []
    assert w.poll() == (set(), {("A", "B")})


# -- scheduling around a cut ------------------------------------------------------------------------------
def test_schedulers_route_around_cut_links_and_keep_reservations() -> None:
    model = load(NSF)
    state = NetworkState(model)
    task = Task(id=1, global_site="Salt-Lake-City", local_sites=("Ann-Arbor", "San-Diego"), demand_mbps=1000)
    first = get_scheduler("mst").schedule(state, task)
    state.admit(first)
    link = busiest_link(first, model)
    assert link is not None and crosses(first, {link}) == [link]
    view = state.without_links({link}, around=task.global_site)
    assert not view.model.has_link(*link) and model.has_link(*link)
    # Reservations on the links that remain are carried over; the cut link's are not.
    kept = {(u, v) for e in first.edges for u, v in e.links() if frozenset((u, v)) != frozenset(link)}
    assert kept and all(view.ai_mbps(u, v) == state.ai_mbps(u, v) > 0 for u, v in kept)
    other = Task(id=2, global_site="Salt-Lake-City", local_sites=("Ann-Arbor", "San-Diego"), demand_mbps=1000)
    second = get_scheduler("mst").schedule(view, other)
    assert not second.blocked and crosses(second, {link}) == []
    state.admit(second)  # into the full network's ledger
    assert state.schedules.keys() == {1, 2}


def test_a_cut_that_splits_the_network_keeps_g_s_part() -> None:
    model = load("triangle")
    state = NetworkState(model)
    cut = {("A", "B"), ("A", "C")}
    with pytest.raises(ConfigError, match="split"):
        state.without_links(cut)
    assert set(state.without_links(cut, around="B").model.sites) == {"B", "C"}


# -- the controller's own database ------------------------------------------------------------------------
def test_a_restarted_controller_restores_tasks_background_and_classes(tmp_path: Path) -> None:
    plan = EmulationPlan.from_model(load("triangle"))
    tc = FakeTc()
    store = StateStore(tmp_path / "state.db")
    fake = FakeSwitches(plan)
    core = ControllerCore(plan, fake, shaper=TcShaper(plan, tc), store=store)
    fake.connect_all()
    for sw in plan.switches:
        core.switch_connected(sw.dpid)
    core.install_task(task_paths(handmade_schedule(plan, 7), bw_scale=plan.bw_scale))
    core.install_task(task_paths(handmade_schedule(plan, 9), bw_scale=1.0))
    core.remove_task(9)
    core.set_background([["A", "C"]])
    before = {sw.dpid: core.expected_entries(sw.dpid) for sw in plan.switches}
    minor = core.shaper.tasks[7].minor  # type: ignore[union-attr]
    store.close()

    # A new controller on the same database, before any switch connects.
    again = ControllerCore(plan, FakeSwitches(plan), shaper=TcShaper(plan, tc), store=StateStore(tmp_path / "state.db"))
    assert again.restore() == [7]
    assert {sw.dpid: again.expected_entries(sw.dpid) for sw in plan.switches} == before
    assert again.tasks[7].reservation.enforced and again.tasks[7].reservation.classes.minor == minor  # type: ignore[union-attr]
    assert again.background_pairs == [("A", "C")]
    assert again.health()["restored_tasks"] == [7]


def test_a_store_entry_that_no_longer_builds_is_dropped_and_said(tmp_path: Path) -> None:
    plan = EmulationPlan.from_model(load("triangle"))
    store = StateStore(tmp_path / "state.db")
    store.save_task(3, {"task_id": 3, "paths": [{"src": "A", "dst": "Z", "sites": ["A", "Z"], "tcp_dst": 9,
                                                   "reserved_mbps": 1}]}, None)
    core = ControllerCore(plan, FakeSwitches(plan), store=store)
    assert core.restore() == []
    assert "not restored" in core.errors[-1]["error"]


# -- the agents: resuming, absent children, files -------------------------------------------------------------
def test_resuming_needs_g_for_model_files_and_rounds_in_range() -> None:
    base = {"task": 1, "site": "A", "host": "10.0.0.1", "broadcast_port": 1, "upload_port": 2, "rounds": 5,
            "is_global": True, "expects_global": False, "upload_children": [{"site": "B", "host": "10.0.0.2"}]}
    assert AgentConfig.from_dict(base | {"first_round": 5, "init_model": "/x.global.safetensors"}).first_round == 5
    with pytest.raises(ValueError, match="first_round"):
        AgentConfig.from_dict(base | {"first_round": 6})
    local = base | {"site": "B", "host": "10.0.0.2", "is_global": False, "expects_global": True,
                    "broadcast_parent": {"site": "A", "host": "10.0.0.1"}, "upload_children": [],
                    "upload_parent": {"site": "A", "host": "10.0.0.1"}}
    with pytest.raises(ValueError, match="only G"):
        AgentConfig.from_dict(local | {"checkpoint_path": "/x.global.safetensors"})
    assert checkpoint_of(Path("/l/A.events.jsonl")) == Path("/l/A.global.safetensors")
    assert check_request({"op": "start", "config": {}, "events": "x", "checkpoint": True}) == "start"
    with pytest.raises(ProtocolError, match="wrong type"):
        check_request({"op": "start", "config": {}, "events": "x", "init_model": True})
    with pytest.raises(ProtocolError, match="unknown fields"):
        check_request({"op": "start", "config": {}, "events": "x", "resume": 1})
    assert Peer(site="A", host="h").site == "A"


def test_fingerprints_are_linear_so_aggregates_can_be_checked() -> None:
    gen = torch.Generator().manual_seed(0)
    a = {"w": torch.randn(5, 3, generator=gen), "b": torch.randn(3, generator=gen)}
    b = {"w": torch.randn(5, 3, generator=gen), "b": torch.randn(3, generator=gen)}
    mean = {k: (2 * a[k] + 3 * b[k]) / 5 for k in a}
    fa, fb, fm = fingerprint(a), fingerprint(b), fingerprint(mean)
    for i in range(2):
        assert fm[i] == pytest.approx((2 * fa[i] + 3 * fb[i]) / 5, rel=1e-5)
    assert fingerprint(a) != fingerprint(b)


# -- a task's roles when a site's server dies or comes back ----------------------------------------------
class Servers:
    """What `TaskExecution` asks of the computing manager, with servers that can die and return."""

    name = "fake"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.lost: dict[str, str] = {}
        self.generation: dict[str, int] = {}
        self.started: list[str] = []

    def address(self, site: str) -> str:
        return f"10.0.0.{ord(site[0]) - 64}"

    def events_file(self, log_dir: Path, site: str) -> Path:
        return log_dir / f"{site}.events.jsonl"

    def ship_model(self, spec: str, sites: Any) -> str:
        return spec

    def start_role(self, site: str, cfg: AgentConfig, path: Path, **extra: Any) -> None:
        self.started.append(site)

    def stop_roles(self, sites: list[str], task: int) -> None:
        pass


def test_a_lost_role_is_tolerated_but_g_s_is_not_and_a_restarted_server_s_roles_are_gone(tmp_path: Path) -> None:
    from orchestrator.runtime.task_runner import FLOptions, TaskExecution

    plan = EmulationPlan.from_model(load("triangle"))
    schedule = handmade_schedule(plan)  # G=A, locals B and C
    servers = Servers(tmp_path)
    run = TaskExecution(schedule, manager=servers, options=FLOptions(rounds=2), log_dir=tmp_path, tolerate_lost=True)
    run.start()

    def status(**states: str) -> dict[str, Any]:
        return {s: {"roles": {str(schedule.task_id): {"state": st}}} for s, st in states.items()}

    assert not run.check(status(A="running", B="running", C="running"))
    servers.lost["C"] = "exited with status -9"
    assert not run.check(status(A="running", B="running"))
    assert run.lost_roles == {"C": "its site server is gone (exited with status -9)"}
    # B's server is restarted before any check saw it die: its new server does not know the role.
    servers.generation["B"] = 1
    assert not run.check(status(A="running", B="running"))
    assert run.lost_roles["B"] == "its site server was restarted"
    assert run.check(status(A="done"))  # G done, the lost roles do not hold the task up
    servers.lost["A"] = "exited with status -9"
    with pytest.raises(RuntimeError, match="A: its site server is gone"):
        TaskExecution(schedule, manager=servers, options=FLOptions(rounds=2), log_dir=tmp_path,
                      tolerate_lost=True).check({})


def test_an_event_needs_exactly_one_trigger() -> None:
    with pytest.raises(ValueError, match="exactly one of at_s and at_round"):
        FaultEvent(action="controller_restart")
    with pytest.raises(ValueError, match="exactly one of at_s and at_round"):
        FaultEvent(action="controller_restart", at_s=1.0, at_round=(1, 2))


def test_the_report_counts_events_not_applied_apart_from_failed_ones(tmp_path: Path) -> None:
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.report import faults_section
    from orchestrator.results.stats import fault_figures

    db = ResultsDB(tmp_path / "results.db")
    run_id = db.start_run("t", {}, {"mode": "online"})
    task = Task(id=1, global_site="Boulder", local_sites=("Lincoln", "Houston"), model_bytes=1000, demand_mbps=100)
    db.record_task(run_id, "mst/never", task)
    for action, ok, detail in (("link_down", True, "Boulder - Lincoln"), ("background", False, "RuntimeError: no"),
                               ("controller_restart", False, "not applied: the trace ended before it was due "
                                                             "(after round 9 of task 1)")):
        db.record_fault(run_id, "mst/never", at_s=1.0, action=action, target="", ok=ok, detail=detail)
    db.conn.commit()

    (row,) = fault_figures(db, run_id)
    assert (row["events"], row["events_failed"], row["events_not_applied"]) == (2, 1, 1)
    text = "\n".join(faults_section(db, run_id))
    assert "| mst/never | 2 (1) | 1 |" in text
    assert "background  FAILED: RuntimeError: no" in text
    assert "controller_restart : not applied" in text and "controller_restart  FAILED" not in text
