"""Reservations as htb classes: the pure tc builders, the shaper's bookkeeping, and the core installing
and removing a task's classes with its flow entries (switches and tc faked)."""

from __future__ import annotations

import itertools
import json
import os
import stat
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from webob import Request

from controller.core import NO_SHAPER, ControllerCore
from controller.errors import ControllerError
from controller.htb import (
    BACKGROUND_QUEUE_PACKETS,
    BURST_FLOOR_BYTES,
    FIRST_TASK_CLASS,
    MIN_RATE_MBPS,
    background_queue,
    base_layout,
    burst_bytes,
    delay_leaves,
    htb_args,
    interface_switch,
    shaped_links,
    task_budget_mbps,
)
from controller.paths import PathSpec, TaskPaths
from controller.rest import RestApi
from controller.shaping import TcShaper, install_commands, remove_commands, task_classes
from controller.tc import ShapingError, SubprocessTc, batch_text, layout_problem
from orchestrator.emulation.task_paths import task_paths
from tests.unit.controller_fakes import FakeSwitches, handmade_schedule
from topologies.loaders import load
from topologies.plan import EmulationPlan

# The triangle: every link 100 Mbit/s emulated; A=s1, B=s2, C=s3; A-B on s1-eth2/s2-eth2,
# B-C on s2-eth3/s3-eth2, A-C on s1-eth3/s3-eth3; hosts 10.0.0.1, .2, .3.
LINK = 100.0
def _htb(rate_bit: int, ceil_bit: int) -> str:
    """The burst, cburst and quantum of a class at these rates (the rule pinned by the burst tests)."""
    return f"burst {burst_bytes(rate_bit / 1e6)} cburst {burst_bytes(ceil_bit / 1e6)} quantum 1514"


@pytest.fixture
def plan() -> EmulationPlan:
    plan = EmulationPlan.from_model(load("triangle"))
    assert {ln.emulated_mbps for ln in plan.links} == {LINK}
    return plan


def one_path(task_id: int, sites: Sequence[str], port: int, mbps: float) -> TaskPaths:
    return TaskPaths(task_id=task_id, paths=(
        PathSpec(src=sites[0], dst=sites[-1], sites=tuple(sites), tcp_dst=port, reserved_mbps=mbps),
    ))


@dataclass
class FakeTc:
    """A tc that keeps classes and filters per interface, with `tc -batch` semantics.

    Without `force` a batch stops at the first failing command; with it, it goes on. Either way a
    failure raises `ShapingError` at the end, like a non-zero exit.
    """

    problem: str | None = None
    fail_on: str | None = None  # a command whose text contains this fails
    classes: dict[str, dict[str, str]] = field(default_factory=dict)  # dev -> classid -> rate
    filters: dict[tuple[str, int], list[str]] = field(default_factory=dict)  # (dev, prio) -> flowids
    batches: list[tuple[str, bool]] = field(default_factory=list)
    checks: int = 0

    def check(self, devices: Sequence[str]) -> str | None:
        self.checks += 1
        return self.problem

    def run(self, commands: Sequence[Sequence[str]], *, force: bool = False) -> None:
        self.batches.append((batch_text(commands), force))
        errors = []
        for cmd in commands:
            try:
                self._one(list(cmd))
            except ShapingError as e:
                errors.append(str(e))
                if not force:
                    break
        if errors:
            raise ShapingError("; ".join(errors))

    def _one(self, cmd: list[str]) -> None:
        if self.fail_on is not None and self.fail_on in " ".join(cmd):
            raise ShapingError(f"RTNETLINK answers: Invalid argument ({' '.join(cmd)})")
        what, verb, dev = cmd[0], cmd[1], cmd[3]
        kv = dict(itertools.pairwise(cmd[4:]))  # each word -> the word after it
        dev_classes = self.classes.setdefault(dev, {})
        if (what, verb) == ("class", "add"):
            if kv["classid"] in dev_classes:
                raise ShapingError("RTNETLINK answers: File exists")
            dev_classes[kv["classid"]] = kv["rate"]
        elif (what, verb) == ("class", "del"):
            if kv["classid"] not in dev_classes:
                raise ShapingError("RTNETLINK answers: No such file or directory")
            if any(kv["classid"] in ids for (d, _p), ids in self.filters.items() if d == dev):
                raise ShapingError("RTNETLINK answers: Device or resource busy")
            del dev_classes[kv["classid"]]
        elif (what, verb) == ("filter", "add"):
            self.filters.setdefault((dev, int(kv["prio"])), []).append(kv["flowid"])
        elif (what, verb) == ("filter", "del"):
            if self.filters.pop((dev, int(kv["prio"])), None) is None:
                raise ShapingError("RTNETLINK answers: No such file or directory")
        elif what == "qdisc":
            pass
        else:
            raise AssertionError(f"unexpected tc command {cmd}")

    def task_state(self) -> dict[str, list[str]]:
        """Per interface: the task classes (not 5:1/5:2) and their filters' flowids."""
        out: dict[str, list[str]] = {}
        for dev, classes in self.classes.items():
            for cid in classes:
                out.setdefault(dev, []).append(cid)
        for (dev, _prio), ids in self.filters.items():
            out.setdefault(dev, []).extend(f"filter->{i}" for i in ids)
        return {dev: sorted(v) for dev, v in out.items() if v}


# -- pure builders -----------------------------------------------------------------------------------
def test_base_layout_is_root_link_background_best_effort_and_ack_classes() -> None:
    text = batch_text(base_layout("s1-eth2", 50.0))

    assert text.splitlines() == [
        "qdisc add dev s1-eth2 root handle 5:0 htb default 2",
        f"class add dev s1-eth2 parent 5:0 classid 5:1 htb rate 50000000bit ceil 50000000bit {_htb(50000000, 50000000)}",
        f"class add dev s1-eth2 parent 5:1 classid 5:2 htb rate 500000bit ceil 50000000bit {_htb(500000, 50000000)} prio 1",
        # best-effort: next to nothing guaranteed, the worst prio; fed by packets marked Lower Effort (DSCP 1)
        f"class add dev s1-eth2 parent 5:1 classid 5:3 htb rate 1000bit ceil 50000000bit {_htb(1000, 50000000)} prio 2",
        "filter add dev s1-eth2 parent 5:0 protocol ip prio 1 u32 match ip dsfield 0x04 0xfc flowid 5:3",
        # pure ACKs of every flow: TCP datagrams under 128 bytes, at the tasks' prio with 2 % guaranteed
        f"class add dev s1-eth2 parent 5:1 classid 5:4 htb rate 1000000bit ceil 50000000bit {_htb(1000000, 50000000)} prio 0",
        "filter add dev s1-eth2 parent 5:0 protocol ip prio 2 u32 match ip protocol 6 0xff "
        "match u16 0x0000 0xff80 at 2 flowid 5:4",
    ]


def test_the_burst_is_one_frame_up_to_2_13_mbps_then_6_ms_of_the_rate_up_to_its_cap() -> None:
    assert burst_bytes(0.001) == burst_bytes(100 / 128) == burst_bytes(2.13) == BURST_FLOOR_BYTES == 1600
    assert burst_bytes(100 / 32) == 2344 and burst_bytes(20) == 15_000  # 6 ms of the rate
    assert burst_bytes(50) == burst_bytes(100) == burst_bytes(1000) == 16_000  # the cap


@pytest.mark.parametrize("k", [1, 2, 8, 32, 128])
@pytest.mark.parametrize("link_mbps", [10, 100, 1000])
def test_no_class_burst_passes_a_whole_small_model(link_mbps: float, k: float) -> None:
    """The default mlp's copy is about 20 KB of frames: whatever the link's dilated rate, some of it
    crosses at the rate, and a 100 Mbit/s link from K = 47 passes only one frame ahead of it."""
    dilated = link_mbps / k
    args = htb_args(dilated, dilated)
    burst, cburst = int(args[args.index("burst") + 1]), int(args[args.index("cburst") + 1])
    assert burst == cburst <= 16_000 < 19_924
    assert burst == BURST_FLOOR_BYTES or dilated > 2.13


def test_a_class_takes_its_burst_from_its_rate_and_its_cburst_from_its_ceil() -> None:
    args = htb_args(1.0, 100.0, 0)
    assert args[args.index("burst") + 1] == "1600"
    assert args[args.index("cburst") + 1] == "16000"


def test_the_background_leaf_gets_a_short_pfifo() -> None:
    assert batch_text([background_queue("s1-eth2")]).splitlines() == [
        f"qdisc add dev s1-eth2 parent 5:2 handle 6: pfifo limit {BACKGROUND_QUEUE_PACKETS}"]


def test_the_link_delay_goes_under_the_best_effort_and_ack_classes_too() -> None:
    # a ping (best effort) and every flow's pure ACKs cross the fibre like the data: same delay
    assert batch_text(delay_leaves("s1-eth2", "1.500ms")).splitlines() == [
        "qdisc add dev s1-eth2 parent 5:3 handle 11: netem delay 1.500ms",
        "qdisc add dev s1-eth2 parent 5:4 handle 12: netem delay 1.500ms",
    ]


def test_shaped_links_name_the_egress_interface_of_each_direction(plan: EmulationPlan) -> None:
    links = {(sl.src, sl.dst): sl.dev for sl in shaped_links(plan)}

    assert links == {
        ("A", "B"): "s1-eth2", ("B", "A"): "s2-eth2",
        ("B", "C"): "s2-eth3", ("C", "B"): "s3-eth2",
        ("A", "C"): "s1-eth3", ("C", "A"): "s3-eth3",
    }
    # and each interface names the switch it is on back (ClusterTc and the cluster's tc file read it)
    assert {interface_switch(dev) for dev in links.values()} == {"s1", "s2", "s3"}
    assert interface_switch("s12-eth10") == "s12" and interface_switch("my-eth-sw-eth3") == "my-eth-sw"


def test_one_path_gets_its_rate_on_the_data_links_and_a_class_for_acks_on_the_reverse(plan: EmulationPlan) -> None:
    task = one_path(7, ["A", "B", "C"], 20014, 30.0)

    classes = task_classes(task, plan, FIRST_TASK_CLASS)
    text = batch_text(install_commands(classes))

    data = "match ip protocol 6 0xff match ip src 10.0.0.1/32 match ip dst 10.0.0.3/32 match ip dport 20014 0xffff"
    acks = "match ip protocol 6 0xff match ip src 10.0.0.3/32 match ip dst 10.0.0.1/32 match ip sport 20014 0xffff"
    assert text.splitlines() == [
        f"class add dev s1-eth2 parent 5:1 classid 5:10 htb rate 30000000bit ceil 100000000bit {_htb(30000000, 100000000)} prio 0",
        f"filter add dev s1-eth2 parent 5:0 protocol ip prio 16 u32 {data} flowid 5:10",
        f"class add dev s2-eth2 parent 5:1 classid 5:10 htb rate 1000bit ceil 100000000bit {_htb(1000, 100000000)} prio 0",
        f"filter add dev s2-eth2 parent 5:0 protocol ip prio 16 u32 {acks} flowid 5:10",
        f"class add dev s2-eth3 parent 5:1 classid 5:10 htb rate 30000000bit ceil 100000000bit {_htb(30000000, 100000000)} prio 0",
        f"filter add dev s2-eth3 parent 5:0 protocol ip prio 16 u32 {data} flowid 5:10",
        f"class add dev s3-eth2 parent 5:1 classid 5:10 htb rate 1000bit ceil 100000000bit {_htb(1000, 100000000)} prio 0",
        f"filter add dev s3-eth2 parent 5:0 protocol ip prio 16 u32 {acks} flowid 5:10",
    ]
    assert [(lc.demand.link, lc.guaranteed_mbps) for lc in classes.links] == [
        (("A", "B"), 30.0), (("B", "A"), 0.0), (("B", "C"), 30.0), (("C", "B"), 0.0)
    ]
    assert not classes.capped


def test_removal_deletes_the_task_filters_first_then_its_classes(plan: EmulationPlan) -> None:
    classes = task_classes(one_path(7, ["A", "B"], 20014, 10.0), plan, 0x2A)

    text = batch_text(remove_commands(classes))

    assert text.splitlines() == [
        "filter del dev s1-eth2 parent 5:0 protocol ip prio 42",
        "filter del dev s2-eth2 parent 5:0 protocol ip prio 42",
        "class del dev s1-eth2 classid 5:2a",
        "class del dev s2-eth2 classid 5:2a",
    ]


def test_paths_of_one_task_crossing_a_link_add_their_rates(plan: EmulationPlan) -> None:
    sched = handmade_schedule(plan, task_id=7)  # demand 10 Mbit/s on each edge
    task = task_paths(sched)

    classes = task_classes(task, plan, FIRST_TASK_CLASS)

    rates = {lc.demand.link: lc.guaranteed_mbps for lc in classes.links}
    # A->B carries broadcast A->B; B->A carries uploads C->B->A and B->A; B->C broadcast B->C;
    # C->B upload C->B->A; A-C is not used at all.
    assert rates == {("A", "B"): 10.0, ("B", "A"): 20.0, ("B", "C"): 10.0, ("C", "B"): 10.0}
    b_to_a = next(lc for lc in classes.links if lc.demand.link == ("B", "A"))
    # Two upload data filters (C->A and B->A), one broadcast ACK filter (from B to A's port).
    assert len(b_to_a.demand.filters) == 3


def test_guarantees_are_capped_at_what_the_link_has_left(plan: EmulationPlan) -> None:
    budget = task_budget_mbps(LINK)
    first = task_classes(one_path(1, ["A", "B"], 20002, 80.0), plan, 0x10)
    second = task_classes(one_path(2, ["A", "B"], 20004, 30.0), plan, 0x11, first.guaranteed())
    used = {k: first.guaranteed()[k] + second.guaranteed()[k] for k in first.guaranteed()}
    third = task_classes(one_path(3, ["A", "B"], 20006, 10.0), plan, 0x12, used)

    g = [c.guaranteed()[("A", "B")] for c in (first, second, third)]
    assert budget == pytest.approx(97.0)  # the background keeps 1 %, the ACKs 2 %
    assert g == pytest.approx([80.0, budget - 80.0, 0.0])
    assert [c.capped for c in (first, second, third)] == [False, True, True]
    assert sum(g) + LINK * 0.01 + LINK * 0.02 <= LINK + 1e-9
    third_rate = install_commands(third)[0]
    assert third_rate[third_rate.index("rate") + 1] == f"{round(MIN_RATE_MBPS * 1e6)}bit"


def test_a_task_asking_more_than_the_link_gets_the_budget(plan: EmulationPlan) -> None:
    classes = task_classes(one_path(1, ["A", "B"], 20002, 250.0), plan, 0x10)

    assert classes.guaranteed()[("A", "B")] == pytest.approx(task_budget_mbps(LINK))
    assert classes.capped


def test_netem_goes_under_each_task_class_when_links_carry_delay(plan: EmulationPlan) -> None:
    classes = task_classes(one_path(1, ["A", "B"], 20002, 5.0), plan, 0x10)

    cmds = [" ".join(c) for c in install_commands(classes, delay=True)]

    assert "qdisc add dev s1-eth2 parent 5:10 netem delay 0.500ms" in cmds
    assert not any("netem" in c for c in (" ".join(c) for c in install_commands(classes)))


def test_batch_text_refuses_arguments_tc_would_split() -> None:
    with pytest.raises(ValueError, match="unsafe"):
        batch_text([["class", "add", "dev", "s1-eth2; reboot"]])
    with pytest.raises(ValueError, match="unsafe"):
        batch_text([["qdisc", "show", "dev", "a\nb"]])


def test_layout_problem_names_interfaces_without_the_htb_root() -> None:
    qdiscs = [
        {"kind": "htb", "handle": "5:", "dev": "s1-eth2", "root": True, "options": {"default": "0x2"}},
        {"kind": "htb", "handle": "5:", "dev": "s2-eth2", "root": True, "options": {"default": "0x1"}},
        {"kind": "noqueue", "handle": "0:", "dev": "s3-eth2", "root": True},
        {"kind": "netem", "handle": "10:", "dev": "s1-eth2", "parent": "5:2"},
    ]

    assert layout_problem(["s1-eth2"], qdiscs) is None
    problem = layout_problem(["s1-eth2", "s2-eth2", "s3-eth2", "s4-eth2"], qdiscs)
    assert problem is not None and "3 of 4" in problem and "s2-eth2, s3-eth2, s4-eth2" in problem


# -- the shaper ---------------------------------------------------------------------------------------
def test_class_ids_are_allocated_per_task_reused_after_removal_and_kept_on_replace(plan: EmulationPlan) -> None:
    tc = FakeTc()
    shaper = TcShaper(plan, tc)

    r1 = shaper.install(one_path(1, ["A", "B"], 20002, 10.0))
    r2 = shaper.install(one_path(2, ["A", "C"], 20004, 10.0))
    shaper.remove(1)
    r3 = shaper.install(one_path(3, ["B", "C"], 20006, 10.0))
    r2_again = shaper.install(one_path(2, ["A", "B", "C"], 20004, 20.0))

    assert [r.classes.classid for r in (r1, r2, r3, r2_again) if r.classes] == ["5:10", "5:11", "5:10", "5:11"]
    assert tc.task_state() == {
        "s1-eth2": ["5:11", "filter->5:11"], "s2-eth2": ["5:11", "filter->5:11"],   # task 2, A->B and acks
        "s2-eth3": ["5:10", "5:11", "filter->5:10", "filter->5:11"],               # tasks 3 and 2, B->C
        "s3-eth2": ["5:10", "5:11", "filter->5:10", "filter->5:11"],               # their acks
    }


def test_a_replaced_task_does_not_count_against_itself(plan: EmulationPlan) -> None:
    shaper = TcShaper(plan, FakeTc())
    shaper.install(one_path(1, ["A", "B"], 20002, 90.0))

    again = shaper.install(one_path(1, ["A", "B"], 20002, 95.0))

    assert again.classes is not None and again.classes.guaranteed()[("A", "B")] == pytest.approx(95.0)


def test_unavailable_shaping_runs_nothing_and_says_why(plan: EmulationPlan) -> None:
    tc = FakeTc(problem="tc (iproute2) is not installed")
    shaper = TcShaper(plan, tc)

    r = shaper.install(one_path(1, ["A", "B"], 20002, 10.0))

    assert (r.enforced, r.reason, r.classes) == (False, "tc (iproute2) is not installed", None)
    assert tc.batches == [] and shaper.tasks == {}


def test_status_is_probed_until_ready_and_then_kept(plan: EmulationPlan) -> None:
    tc = FakeTc(problem="6 of 6 switch-to-switch interfaces lack the htb layout")
    shaper = TcShaper(plan, tc)

    first = shaper.status()
    tc.problem = None
    ready = shaper.status()
    tc.problem = "gone"
    still = shaper.status()

    assert (first.enforced, ready.enforced, still.enforced) == (False, True, True)
    assert first.reason == "6 of 6 switch-to-switch interfaces lack the htb layout"
    assert tc.checks == 2
    assert "6 switch-to-switch interfaces" in ready.reason


def test_a_failed_install_is_cleaned_up_and_its_class_id_not_reused(plan: EmulationPlan) -> None:
    tc = FakeTc(fail_on="dev s2-eth3")
    shaper = TcShaper(plan, tc)

    with pytest.raises(ShapingError, match="Invalid argument"):
        shaper.install(one_path(1, ["A", "B", "C"], 20002, 10.0))
    tc.fail_on = None
    nxt = shaper.install(one_path(2, ["A", "B"], 20004, 10.0))

    assert shaper.tasks.keys() == {2}
    assert tc.batches[1][1] is True  # the cleanup batch ran with -force
    assert nxt.classes is not None and nxt.classes.classid == "5:11"
    assert all("5:10" not in v for v in tc.task_state().values())


# -- the core with a shaper ----------------------------------------------------------------------------
def connected_core(plan: EmulationPlan, fake: FakeSwitches, shaper: Any = None) -> ControllerCore:
    core = ControllerCore(plan, fake, shaper=shaper)
    fake.connect_all()
    for sw in plan.switches:
        fake.install(sw.dpid, core.expected_entries(sw.dpid))
        core.switch_connected(sw.dpid)
    return core


def call(api: RestApi, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    req = Request.blank(path, method=method)
    if body is not None:
        req.body = json.dumps(body).encode()
        req.content_type = "application/json"
    resp = req.get_response(api)
    return resp.status_int, json.loads(resp.body)


def test_install_shapes_after_the_entries_and_the_summary_and_health_say_enforced(plan: EmulationPlan) -> None:
    fake, tc = FakeSwitches(plan), FakeTc()
    api = RestApi(connected_core(plan, fake, TcShaper(plan, tc)))

    status, body = call(api, "PUT", "/tasks/7", one_path(7, ["A", "B"], 20014, 40.0).to_dict())
    _, health = call(api, "GET", "/health")
    _, listing = call(api, "GET", "/tasks")

    assert status == 201
    r = body["reservation"]
    assert (r["enforced"], r["classid"], r["capped"]) == (True, "5:10", False)
    assert [(ln["link"], ln["dev"], ln["guaranteed_mbps"], ln["ceil_mbps"]) for ln in r["links"]] == [
        (["A", "B"], "s1-eth2", 40.0, LINK), (["B", "A"], "s2-eth2", 0.0, LINK)
    ]
    assert health["reservations"]["enforced"] is True and health["reservations"]["reason"]
    assert listing["tasks"][0]["reservation"]["classid"] == "5:10"
    assert tc.task_state() == {"s1-eth2": ["5:10", "filter->5:10"], "s2-eth2": ["5:10", "filter->5:10"]}


def test_without_a_shaper_tasks_install_and_everything_says_not_enforced(plan: EmulationPlan) -> None:
    api = RestApi(connected_core(plan, FakeSwitches(plan)))

    status, body = call(api, "PUT", "/tasks/7", one_path(7, ["A", "B"], 20014, 40.0).to_dict())
    _, health = call(api, "GET", "/health")

    assert status == 201
    assert body["reservation"] == {"enforced": False, "reason": NO_SHAPER}
    assert health["reservations"] == {"enforced": False, "reason": NO_SHAPER}


def test_with_tc_unavailable_the_task_installs_unshaped_and_says_why(plan: EmulationPlan) -> None:
    fake, tc = FakeSwitches(plan), FakeTc(problem="the controller does not run as root")
    api = RestApi(connected_core(plan, fake, TcShaper(plan, tc)))

    status, body = call(api, "PUT", "/tasks/7", one_path(7, ["A", "B"], 20014, 40.0).to_dict())
    _, health = call(api, "GET", "/health")

    assert status == 201 and body["entries"] > 0
    assert body["reservation"] == {"enforced": False, "reason": "the controller does not run as root"}
    assert health["reservations"] == {"enforced": False, "reason": "the controller does not run as root"}
    assert tc.batches == []


def test_remove_and_replace_take_the_classes_with_the_entries(plan: EmulationPlan) -> None:
    fake, tc = FakeSwitches(plan), FakeTc()
    core = connected_core(plan, fake, TcShaper(plan, tc))
    core.install_task(one_path(7, ["A", "B"], 20014, 40.0))

    replaced = core.install_task(one_path(7, ["A", "C"], 20014, 40.0))
    after_replace = tc.task_state()
    removed = core.remove_task(7)

    assert replaced["reservation"]["classid"] == "5:10"
    assert after_replace == {"s1-eth3": ["5:10", "filter->5:10"], "s3-eth3": ["5:10", "filter->5:10"]}
    assert removed["reservation"]["removed"] is True
    assert tc.task_state() == {}
    assert all(e.cookie != 7 for sw in plan.switches for e in fake.entries(sw.dpid))


def test_tc_refusing_the_classes_rolls_the_whole_task_back(plan: EmulationPlan) -> None:
    fake, tc = FakeSwitches(plan), FakeTc(fail_on="filter add dev s2-eth2")
    core = connected_core(plan, fake, TcShaper(plan, tc))

    status, body = call(RestApi(core), "PUT", "/tasks/7", one_path(7, ["A", "B"], 20014, 40.0).to_dict())

    assert status == 500 and "could not be shaped" in body["error"] and "Invalid argument" in body["error"]
    assert core.tasks == {}
    assert all(e.cookie != 7 for sw in plan.switches for e in fake.entries(sw.dpid))
    assert tc.task_state() == {}


def test_a_switch_failing_mid_install_runs_no_tc_and_removes_the_old_classes(plan: EmulationPlan) -> None:
    class Gateway(ControllerError):
        status = 502

    class FailingOnS2(FakeSwitches):
        fail = False

        def install(self, dpid: int, entries: Any) -> None:
            if self.fail and dpid == 2:
                raise Gateway("s2 rejected a flow mod")
            super().install(dpid, entries)

    fake, tc = FailingOnS2(plan), FakeTc()
    core = connected_core(plan, fake, TcShaper(plan, tc))
    core.install_task(one_path(7, ["A", "B"], 20014, 40.0))
    batches_before = len(tc.batches)
    fake.fail = True

    with pytest.raises(ControllerError, match="s2 rejected"):
        core.install_task(one_path(7, ["A", "B", "C"], 20014, 40.0))

    assert core.tasks == {}
    assert tc.task_state() == {}
    assert [force for _text, force in tc.batches[batches_before:]] == [True]  # only the removal ran


def test_a_failed_class_removal_is_recorded_and_the_task_still_goes(plan: EmulationPlan) -> None:
    fake, tc = FakeSwitches(plan), FakeTc()
    core = connected_core(plan, fake, TcShaper(plan, tc))
    core.install_task(one_path(7, ["A", "B"], 20014, 40.0))
    tc.fail_on = "class del"

    removed = core.remove_task(7)

    assert removed["reservation"]["removed"] is False
    assert core.tasks == {}
    assert "removal of task 7's classes failed" in core.health()["errors"][-1]["error"]


# -- the subprocess runner, against a stand-in tc ----------------------------------------------------
@pytest.fixture
def fake_tc_binary(tmp_path: Path) -> Path:
    """An executable that records its arguments and stdin, and answers `-j qdisc show` with a layout."""
    script = tmp_path / "tc"
    log = tmp_path / "calls.jsonl"
    qdiscs = [{"kind": "htb", "handle": "5:", "dev": "s1-eth2", "root": True, "options": {"default": "0x2"}}]
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"log = open({str(log)!r}, 'a')\n"
        "args = sys.argv[1:]\n"
        "data = sys.stdin.read() if '-batch' in args else ''\n"
        "log.write(json.dumps({'args': args, 'stdin': data}) + '\\n')\n"
        f"if args == ['-j', 'qdisc', 'show']: print({json.dumps(json.dumps(qdiscs))})\n"
        "sys.exit(2 if 'FAIL' in data else 0)\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return script


def test_subprocess_tc_feeds_the_batch_on_stdin_and_reports_failures(
    fake_tc_binary: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    runner = SubprocessTc(str(fake_tc_binary))

    ready = runner.check(["s1-eth2"])
    missing = runner.check(["s1-eth2", "s2-eth2"])
    runner.run([["class", "del", "dev", "s1-eth2", "classid", "5:10"]], force=True)
    with pytest.raises(ShapingError, match="exited 2"):
        runner.run([["class", "del", "dev", "FAIL", "classid", "5:10"]])

    calls = [json.loads(line) for line in (fake_tc_binary.parent / "calls.jsonl").read_text().splitlines()]
    assert ready is None
    assert missing is not None and "s2-eth2" in missing
    assert calls[2] == {"args": ["-force", "-batch", "-"], "stdin": "class del dev s1-eth2 classid 5:10\n"}
    assert calls[3]["args"] == ["-batch", "-"]


def test_subprocess_tc_needs_root(fake_tc_binary: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

    problem = SubprocessTc(str(fake_tc_binary)).check(["s1-eth2"])

    assert problem is not None and "root" in problem
