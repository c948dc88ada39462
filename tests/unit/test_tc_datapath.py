"""The tc datapath's pure builders, its reading back, its `FlowSender` (with a recording runner) and
the choice of datapath."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from controller.flows import (
    BACKGROUND_COOKIE,
    BACKGROUND_PRIORITY,
    BEST_EFFORT_COOKIE,
    BEST_EFFORT_PRIORITY,
    ETH_TYPE_IPV4,
    LOWER_EFFORT_DSCP,
    TASK_PRIORITY,
    FlowEntry,
    best_effort_entries,
    ipv4_match,
    make_match,
    table_miss_entry,
    tcp_match,
)
from controller.htb import BACKGROUND_FILTER_PRIO, LAST_TASK_CLASS
from controller.tc_datapath import TcDatapathError, TcFlowSender
from controller.tc_flows import (
    BACKGROUND_PREF,
    BEST_EFFORT_PREF,
    TASK_PREFS,
    PrefBook,
    TcFlowError,
    as_installed,
    filter_add,
    match_args,
    match_of_keys,
    parse_block,
    parse_blocks,
)
from orchestrator.emulation.kernel import DatapathUnavailable, KernelFeatures, choose_datapath
from topologies.loaders import load
from topologies.plan import EmulationPlan

#: What ``tc -s filter show block 1`` printed (iproute2 6.1) after `filter_add` of `CAPTURED` on the
#: ports s1-eth1..3, in that order (tests/unit/data/tc_filter_show.txt).
SHOWN = (Path(__file__).parent / "data" / "tc_filter_show.txt").read_text()
CAPTURED = [
    FlowEntry(1, TASK_PRIORITY, 7, tcp_match("10.0.0.1", "10.0.0.2", tcp_dst=5001), 2),
    FlowEntry(1, TASK_PRIORITY, 7, tcp_match("10.0.0.2", "10.0.0.1", tcp_src=5001), 1),
    FlowEntry(1, TASK_PRIORITY, 9, tcp_match("10.0.0.3", "10.0.0.2", tcp_src=6000, tcp_dst=6001), 3),
    FlowEntry(1, BACKGROUND_PRIORITY, BACKGROUND_COOKIE, ipv4_match("10.0.0.1", "10.0.0.3"), 3),
    FlowEntry(1, BEST_EFFORT_PRIORITY, BEST_EFFORT_COOKIE, make_match(eth_type=ETH_TYPE_IPV4, ipv4_dst="10.0.0.1"), 1),
]


def test_a_filter_carries_the_match_the_output_and_the_cookie() -> None:
    entry = CAPTURED[0]
    args = filter_add(1, 0x100, entry, "s1-eth2")
    assert args[:8] == ["filter", "add", "block", "1", "protocol", "ip", "pref", "256"]
    assert args[args.index("u32") + 1:args.index("action")] == [
        "match", "ip", "src", "10.0.0.1/32", "match", "ip", "dst", "10.0.0.2/32",
        "match", "ip", "protocol", "6", "0xff", "match", "ip", "dport", "5001", "0xffff"]
    assert args[args.index("action"):] == ["action", "mirred", "egress", "redirect", "dev", "s1-eth2",
                                           "cookie", "0000000000000007"]


def test_what_the_tc_datapath_cannot_match_is_refused() -> None:
    with pytest.raises(TcFlowError, match="IPv4 only"):
        match_args(FlowEntry(1, TASK_PRIORITY, 7, make_match(eth_type=0x0806), 2))
    with pytest.raises(TcFlowError, match="in_port"):
        match_args(FlowEntry(1, TASK_PRIORITY, 7, make_match(eth_type=ETH_TYPE_IPV4, in_port=3), 2))


def test_filters_read_back_are_the_entries_installed() -> None:
    stats = parse_block(1, "s1", SHOWN)
    assert sorted((st.entry for st in stats), key=FlowEntry.sort_key) == sorted(CAPTURED, key=FlowEntry.sort_key)
    assert all(st.packets == 0 and st.bytes == 0 for st in stats)
    only_7 = parse_block(1, "s1", SHOWN, cookie=7)
    assert {st.entry for st in only_7} == set(CAPTURED[:2])


def test_reading_back_refuses_what_the_project_does_not_install() -> None:
    with pytest.raises(TcFlowError, match="not one of its ports"):
        parse_block(1, "s2", SHOWN)  # s1's ports are not s2's
    with pytest.raises(TcFlowError, match="no field"):
        match_of_keys([(0x45000000, 0xFF000000, 0)])
    with pytest.raises(TcFlowError, match="partial"):
        match_of_keys([(0x0A000000, 0xFF000000, 12)])


def test_counters_are_read_from_the_action_statistics() -> None:
    text = SHOWN.replace("Sent 0 bytes 0 pkt", "Sent 4242 bytes 3 pkt", 1)
    first = next(st for st in parse_block(1, "s1", text) if st.entry == CAPTURED[0])
    assert (first.bytes, first.packets) == (4242, 3)


def test_preferences_follow_openflow_priorities_and_are_one_per_task() -> None:
    book = PrefBook()
    a1, a2, b1 = (FlowEntry(d, TASK_PRIORITY, c, (), 2) for d, c in ((1, 7), (2, 7), (1, 8)))
    assert book.pref(a1) == book.pref(a2) == TASK_PREFS[0]  # the same on every switch
    assert book.pref(b1) == TASK_PREFS[1]
    bg = FlowEntry(1, BACKGROUND_PRIORITY, BACKGROUND_COOKIE, (), 2)
    be = FlowEntry(1, BEST_EFFORT_PRIORITY, BEST_EFFORT_COOKIE, (), 2)
    assert max(TASK_PREFS) < book.pref(bg) == BACKGROUND_PREF < book.pref(be) == BEST_EFFORT_PREF
    book.release(1, 7)
    assert book.task_pref(7) == TASK_PREFS[0]  # switch 2 still holds it
    book.release(2, 7)
    assert book.task_pref(7) is None
    assert book.pref(FlowEntry(1, TASK_PRIORITY, 99, (), 2)) == TASK_PREFS[0]  # freed, taken again
    with pytest.raises(TcFlowError, match="priority 50"):
        book.pref(FlowEntry(1, 50, 5, (), 2))


def test_background_class_filters_come_after_every_task_class() -> None:
    assert LAST_TASK_CLASS < BACKGROUND_FILTER_PRIO <= 0xFFFF


def test_drops_and_dscp_rewrites_are_not_filters() -> None:
    assert as_installed(table_miss_entry(1)) is None
    plan = EmulationPlan.from_model(load("triangle"))
    marked = best_effort_entries(plan)[0]
    assert marked.set_dscp == LOWER_EFFORT_DSCP
    installed = as_installed(marked)
    assert installed is not None and installed.set_dscp is None and installed.match == marked.match


class Recorder:
    """A `TcRunner` that records batches (and can be told to fail)."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[list[str]], bool]] = []
        self.fail = False

    def check(self, devices: Sequence[str]) -> str | None:
        return None

    def run(self, commands: Sequence[Sequence[str]], *, force: bool = False) -> None:
        from controller.tc import ShapingError

        self.batches.append(([list(c) for c in commands], force))
        if self.fail:
            raise ShapingError("RTNETLINK answers: File exists")


def _sender() -> tuple[TcFlowSender, Recorder, EmulationPlan]:
    plan = EmulationPlan.from_model(load("triangle"))
    rec = Recorder()
    return TcFlowSender(plan, rec), rec, plan


def test_install_and_remove_a_task() -> None:
    sender, rec, plan = _sender()
    sw = plan.switches[0]
    entries = [FlowEntry(sw.dpid, TASK_PRIORITY, 7, tcp_match("10.0.0.1", "10.0.0.2", tcp_dst=5001), 2),
               FlowEntry(sw.dpid, TASK_PRIORITY, 7, tcp_match("10.0.0.2", "10.0.0.1", tcp_src=5001), 1),
               table_miss_entry(sw.dpid)]
    sender.install(sw.dpid, entries)
    (cmds, _), = rec.batches
    assert len(cmds) == 2 and all(c[:4] == ["filter", "add", "block", str(sw.dpid)] for c in cmds)
    assert [c[c.index("dev") + 1] for c in cmds] == [f"{sw.name}-eth2", f"{sw.name}-eth1"]
    sender.remove_cookie(sw.dpid, 7)
    assert rec.batches[-1][0] == [["filter", "del", "block", str(sw.dpid), "protocol", "ip", "pref",
                                   str(TASK_PREFS[0])]]
    n = len(rec.batches)
    sender.remove_cookie(sw.dpid, 7)  # nothing left of it there: no command
    sender.remove_cookie(sw.dpid, 12345)
    assert len(rec.batches) == n


def test_background_entries_are_classified_on_the_links_they_leave_by() -> None:
    sender, rec, plan = _sender()
    sw = plan.switches[0]
    to_link = FlowEntry(sw.dpid, BACKGROUND_PRIORITY, BACKGROUND_COOKIE, ipv4_match("10.0.0.1", "10.0.0.2"), 2)
    to_host = FlowEntry(sw.dpid, BACKGROUND_PRIORITY, BACKGROUND_COOKIE, ipv4_match("10.0.0.2", "10.0.0.1"), 1)
    sender.install(sw.dpid, [to_link, to_host])
    cmds = rec.batches[-1][0]
    classify = [c for c in cmds if "dev" in c and c[:2] == ["filter", "add"] and "flowid" in c]
    assert len(classify) == 1 and classify[0][classify[0].index("dev") + 1] == f"{sw.name}-eth2"
    assert classify[0][-2:] == ["flowid", "5:2"]
    sender.remove_cookie(sw.dpid, BACKGROUND_COOKIE)
    removed = rec.batches[-1][0]
    assert removed[0][:4] == ["filter", "del", "block", str(sw.dpid)]
    assert removed[1][:4] == ["filter", "del", "dev", f"{sw.name}-eth2"]


def test_a_refused_batch_is_a_controller_error_and_holds_nothing() -> None:
    sender, rec, plan = _sender()
    sw = plan.switches[0]
    rec.fail = True
    with pytest.raises(TcDatapathError, match="File exists"):
        sender.install(sw.dpid, [FlowEntry(sw.dpid, TASK_PRIORITY, 7, tcp_match("10.0.0.1", "10.0.0.2"), 2)])
    rec.fail = False
    undo, forced = rec.batches[-1]  # what of the refused batch went in is taken out again
    assert forced and undo == [["filter", "del", "block", str(sw.dpid), "protocol", "ip", "pref", str(TASK_PREFS[0])]]
    assert sender._prefs.task_pref(7) is None
    n = len(rec.batches)
    sender.remove_cookie(sw.dpid, 7)
    assert len(rec.batches) == n


def test_ports_and_counters_come_from_sysfs(tmp_path: Path) -> None:
    plan = EmulationPlan.from_model(load("triangle"))
    sw = plan.switches[0]
    sender = TcFlowSender(plan, Recorder(), sysfs=tmp_path)
    assert sender.ports(sw.dpid) == [1, 2, 3]
    for port, state in ((1, "up"), (2, "down")):
        d = tmp_path / f"{sw.name}-eth{port}"
        (d / "statistics").mkdir(parents=True)
        for i, k in enumerate(("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")):
            (d / "statistics" / k).write_text(f"{port * 10 + i}\n")
        (d / "operstate").write_text(state + "\n")
    stats = sender.port_stats(sw.dpid)
    assert [(s.port_no, s.rx_bytes, s.tx_packets) for s in stats] == [(1, 10, 13), (2, 20, 23)]
    assert sender.link_down(sw.dpid) == {1: False, 2: True}  # port 3 does not exist: left out


@pytest.mark.parametrize(("choice", "module", "cluster", "picked"), [
    ("auto", True, False, "kernel"),
    ("auto", False, False, "tc"),
    ("auto", False, True, "user"),
    ("user", False, False, "user"),
    ("tc", True, False, "tc"),
])
def test_auto_picks_the_kernel_module_then_tc(choice: str, module: bool, cluster: bool, picked: str) -> None:
    assert choose_datapath(choice, KernelFeatures(ovs_kernel_datapath=module, netem=False), cluster=cluster) == picked


def test_a_datapath_the_kernel_cannot_give_is_refused() -> None:
    with pytest.raises(DatapathUnavailable, match="no openvswitch module"):
        choose_datapath("kernel", KernelFeatures(ovs_kernel_datapath=False, netem=True))
    with pytest.raises(DatapathUnavailable, match="cluster mode"):
        choose_datapath("tc", KernelFeatures(ovs_kernel_datapath=False, netem=True), cluster=True)


def test_one_preference_shown_is_read_with_it() -> None:
    """``tc filter show block N pref P`` leaves ``pref P`` out of every line."""
    one = "\n".join(line.replace(" pref 256", "") for line in SHOWN.split("filter protocol ip pref 257")[0].splitlines())
    stats = parse_block(1, "s1", one, 7, pref=0x100)
    assert {st.entry for st in stats} == set(CAPTURED[:2])


def test_several_blocks_read_at_once_go_to_the_switch_each_filter_redirects_to() -> None:
    two = SHOWN + SHOWN.replace("s1-eth", "s2-eth")  # what one tc -batch of two blocks' shows prints
    got = parse_blocks({"s1": 1, "s2": 2}, two, 7, read_s=41.5)
    assert {st.entry for st in got[1]} == set(CAPTURED[:2])
    assert {st.read_s for sts in got.values() for st in sts} == {41.5}  # the one read's moment
    assert {st.entry.dpid for st in got[2]} == {2} and len(got[2]) == 2
    with pytest.raises(TcFlowError, match="no port of the switches read"):
        parse_blocks({"s1": 1}, two)
