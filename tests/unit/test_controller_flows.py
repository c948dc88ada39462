"""Flow building from a task's paths (built from a Schedule) + EmulationPlan, checked on a fake flow table (no switch)."""

from __future__ import annotations

import dataclasses
import itertools

import networkx as nx
import pytest

from controller.flows import (
    BACKGROUND_COOKIE,
    BACKGROUND_PRIORITY,
    BEST_EFFORT_COOKIE,
    BEST_EFFORT_PRIORITY,
    LOWER_EFFORT_DSCP,
    TASK_PRIORITY,
    FlowBuildError,
    FlowEntry,
    background_entries,
    best_effort_entries,
    diff_entries,
    entry_kind,
    make_match,
    parse_ofctl_dump,
    shortest_site_path,
    table_miss_entries,
    task_entries,
    tcp_match,
)
from controller.hops import next_hops_towards, site_neighbours
from orchestrator.emulation.task_paths import task_paths
from orchestrator.scheduling.schedule import OverlayEdge, task_ports
from tests.unit.controller_fakes import FakeSwitches, handmade_schedule
from topologies.loaders import load
from topologies.plan import HOST_PORT, EmulationPlan


@pytest.fixture
def plan() -> EmulationPlan:
    return EmulationPlan.from_model(load("triangle"))


@pytest.fixture
def fake(plan: EmulationPlan) -> FakeSwitches:
    fake = FakeSwitches(plan)
    fake.connect_all()
    for e in table_miss_entries(plan):
        fake.install(e.dpid, [e])
    return fake


def _install(fake: FakeSwitches, entries: list[FlowEntry]) -> None:
    for e in entries:
        fake.install(e.dpid, [e])


def test_each_edge_forwards_along_its_path_and_acks_return_on_the_reverse(
    plan: EmulationPlan, fake: FakeSwitches
) -> None:
    schedule = handmade_schedule(plan)
    bport, uport = task_ports(schedule.task_id)
    _install(fake, task_entries(task_paths(schedule), plan))

    for edge in schedule.edges:
        port = bport if edge.procedure == "broadcast" else uport
        dst_ip, src_ip = plan.host(edge.dst).ip, plan.host(edge.src).ip
        assert fake.send(edge.src, dst_ip, tcp_src=40000, tcp_dst=port) == list(edge.path)
        assert fake.send(edge.dst, src_ip, tcp_src=port, tcp_dst=40000) == list(reversed(edge.path))


def test_broadcast_and_upload_between_the_same_hosts_take_their_own_paths(
    plan: EmulationPlan, fake: FakeSwitches
) -> None:
    schedule = handmade_schedule(plan)
    schedule = dataclasses.replace(
        schedule, edges=(*schedule.edges, OverlayEdge("broadcast", "A", "C", ("A", "C")))
    )
    bport, uport = task_ports(schedule.task_id)
    _install(fake, task_entries(task_paths(schedule), plan))

    c_ip, a_ip = plan.host("C").ip, plan.host("A").ip
    assert fake.send("A", c_ip, tcp_src=40000, tcp_dst=bport) == ["A", "C"]
    assert fake.send("C", a_ip, tcp_src=40000, tcp_dst=uport) == ["C", "B", "A"]


def test_everything_else_is_dropped(plan: EmulationPlan, fake: FakeSwitches) -> None:
    schedule = handmade_schedule(plan)
    bport, _ = task_ports(schedule.task_id)
    _install(fake, task_entries(task_paths(schedule), plan))

    # The wrong port, another task's port, and a pair with no edge (C -> B upload) are dropped.
    assert fake.send("A", plan.host("B").ip, tcp_src=40000, tcp_dst=5201) is None
    assert fake.send("A", plan.host("B").ip, tcp_src=40000, tcp_dst=task_ports(8)[0]) is None
    assert fake.send("C", plan.host("B").ip, tcp_src=40000, tcp_dst=task_ports(7)[1]) is None
    assert fake.send("A", plan.host("B").ip, tcp_src=40000, tcp_dst=bport) == ["A", "B"]


def test_entries_carry_the_task_cookie_priority_and_ports(plan: EmulationPlan) -> None:
    schedule = handmade_schedule(plan, task_id=42)
    bport, _ = task_ports(42)

    entries = task_entries(task_paths(schedule), plan)

    assert {e.cookie for e in entries} == {42}
    assert {e.priority for e in entries} == {TASK_PRIORITY}
    # 4 edges; forward + reverse entries on every switch of each path: 2*(2+2+3+2).
    assert len(entries) == 18
    first = FlowEntry(
        dpid=plan.switch("A").dpid,
        priority=TASK_PRIORITY,
        cookie=42,
        match=tcp_match(plan.host("A").ip, plan.host("B").ip, tcp_dst=bport),
        out_port=plan.port_towards("A", "B"),
    )
    last = dataclasses.replace(first, dpid=plan.switch("B").dpid, out_port=HOST_PORT)
    assert first in entries and last in entries


def test_unknown_site_and_broken_paths_are_rejected(plan: EmulationPlan) -> None:
    good = handmade_schedule(plan)
    unknown = dataclasses.replace(good, edges=(OverlayEdge("broadcast", "A", "Z", ("A", "Z")),))
    with pytest.raises(FlowBuildError, match="unknown site 'Z'") as info:
        task_entries(task_paths(unknown), plan)
    assert info.value.unknown_site == "Z"

    two = EmulationPlan.from_model(load("ring:4"))
    names = [sw.site for sw in two.switches]
    no_link = dataclasses.replace(
        good,
        global_site=names[0],
        local_sites=(names[2],),
        edges=(OverlayEdge("broadcast", names[0], names[2], (names[0], names[2])),),
    )
    with pytest.raises(FlowBuildError, match="no link"):
        task_entries(task_paths(no_link), two)

    blocked = dataclasses.replace(good, blocked=True, reason="no capacity")
    with pytest.raises(ValueError, match="blocked"):
        task_paths(blocked)


def test_background_pairs_get_lower_priority_shortest_paths_both_ways(
    plan: EmulationPlan, fake: FakeSwitches
) -> None:
    entries = background_entries(plan, [["A", "C"], ["C", "A"]])
    _install(fake, entries)

    assert {e.priority for e in entries} == {BACKGROUND_PRIORITY}
    assert {e.cookie for e in entries} == {BACKGROUND_COOKIE}
    assert fake.send("A", plan.host("C").ip, tcp_src=1, tcp_dst=5201) == ["A", "C"]
    assert fake.send("C", plan.host("A").ip, tcp_src=5201, tcp_dst=1) == ["C", "A"]
    assert fake.send("A", plan.host("B").ip, tcp_src=1, tcp_dst=5201) is None


def test_task_entries_win_over_background(plan: EmulationPlan, fake: FakeSwitches) -> None:
    schedule = handmade_schedule(plan)
    _, uport = task_ports(schedule.task_id)
    _install(fake, background_entries(plan, [["C", "A"]]))
    _install(fake, task_entries(task_paths(schedule), plan))

    assert fake.send("C", plan.host("A").ip, tcp_src=40000, tcp_dst=uport) == ["C", "B", "A"]
    assert fake.send("C", plan.host("A").ip, tcp_src=40000, tcp_dst=80) == ["C", "A"]


@pytest.mark.parametrize("pair", [["A"], ["A", "A"], ["A", 3]])
def test_malformed_background_pairs_are_rejected(plan: EmulationPlan, pair: list) -> None:
    with pytest.raises(FlowBuildError):
        background_entries(plan, [pair])


# -- best-effort connectivity ---------------------------------------------------------------------
@pytest.mark.parametrize("topology", ["triangle", "ring:6", "sndlib/nobel-us"])
def test_best_effort_routes_every_host_pair_on_a_fewest_hops_path(topology: str) -> None:
    plan = EmulationPlan.from_model(load(topology))
    fake = FakeSwitches(plan)
    fake.connect_all()
    _install(fake, [*table_miss_entries(plan), *best_effort_entries(plan)])
    hops = dict(nx.all_pairs_shortest_path_length(nx_graph(plan)))

    routes = {
        (a.site, b.site): fake.send(a.site, b.ip, tcp_src=40000, tcp_dst=5201)
        for a, b in itertools.permutations(plan.hosts, 2)
    }

    assert all(route is not None for route in routes.values()), [k for k, r in routes.items() if r is None]
    assert {k: len(r) - 1 for k, r in routes.items() if r} == {(a, b): hops[a][b] for a, b in routes}
    assert all(r is not None and r[0] == a and r[-1] == b for (a, b), r in routes.items())


def test_best_effort_entries_are_one_per_destination_and_switch_below_background() -> None:
    plan = EmulationPlan.from_model(load("sndlib/nobel-us"))

    entries = best_effort_entries(plan)

    assert len(entries) == len(plan.hosts) * len(plan.switches)
    assert {e.priority for e in entries} == {BEST_EFFORT_PRIORITY}
    assert 0 < BEST_EFFORT_PRIORITY < BACKGROUND_PRIORITY < TASK_PRIORITY
    # Their own cookie: neither a task id (1 .. 2**63 - 1) nor the background's.
    assert {e.cookie for e in entries} == {BEST_EFFORT_COOKIE}
    assert BEST_EFFORT_COOKIE >= 1 << 63 and BEST_EFFORT_COOKIE not in (BACKGROUND_COOKIE, 0)
    assert {e.set_dscp for e in entries} == {LOWER_EFFORT_DSCP}
    host = plan.hosts[3]
    on_its_switch = next(e for e in entries if e.dpid == plan.switch(host.site).dpid
                         and e.match == make_match(eth_type=0x0800, ipv4_dst=host.ip))
    assert on_its_switch.out_port == HOST_PORT
    assert on_its_switch.to_dict()["actions"] == [
        {"type": "SET_FIELD", "field": "ip_dscp", "value": LOWER_EFFORT_DSCP}, {"type": "OUTPUT", "port": HOST_PORT}]


def test_tasks_and_background_win_over_best_effort(plan: EmulationPlan, fake: FakeSwitches) -> None:
    schedule = handmade_schedule(plan)
    _, uport = task_ports(schedule.task_id)
    best_effort = best_effort_entries(plan)
    _install(fake, [*best_effort, *background_entries(plan, [["A", "B"]]), *task_entries(task_paths(schedule), plan)])

    task_route = fake.send("C", plan.host("A").ip, tcp_src=40000, tcp_dst=uport)
    background_route = fake.send("A", plan.host("B").ip, tcp_src=40000, tcp_dst=5201)
    unmarked = {e.key() for e in best_effort}
    untouched = all(s.packets == 0 for t in fake.tables.values() for s in t if s.entry.key() in unmarked)
    best_effort_route = fake.send("C", plan.host("A").ip, tcp_src=40000, tcp_dst=5201)

    assert task_route == ["C", "B", "A"]  # the task's upload path, not the direct best-effort link
    assert background_route == ["A", "B"]
    assert untouched  # neither packet met a best-effort entry, so neither was marked Lower Effort
    assert best_effort_route == ["C", "A"]


def test_entry_kind_names_who_installed_an_entry() -> None:
    assert [entry_kind(c) for c in (0, 7, (1 << 63) - 1, BACKGROUND_COOKIE, BEST_EFFORT_COOKIE)] == [
        "table-miss", "task", "task", "background", "best-effort"]


OFCTL_DUMP = """\
 cookie=0x2a, duration=3.1s, table=0, n_packets=12, n_bytes=3400, priority=200,tcp,nw_src=10.0.0.1,nw_dst=10.0.0.2,tp_dst=20084 actions=output:2
 cookie=0x2a, duration=3.1s, table=0, n_packets=9, n_bytes=600, priority=200,tcp,nw_src=10.0.0.2,nw_dst=10.0.0.1,tp_src=20084 actions=output:1
 cookie=0x8000000000000000, duration=3.1s, table=0, n_packets=0, n_bytes=0, priority=100,ip,nw_src=10.0.0.1,nw_dst=10.0.0.3 actions=output:3
 cookie=0x0, duration=9.0s, table=0, n_packets=4, n_bytes=280, priority=0 actions=drop
"""


def test_ofctl_dump_parses_into_the_builders_entries() -> None:
    entries = parse_ofctl_dump(1, OFCTL_DUMP)

    expected = [
        FlowEntry(1, 200, 42, tcp_match("10.0.0.1", "10.0.0.2", tcp_dst=20084), 2),
        FlowEntry(1, 200, 42, tcp_match("10.0.0.2", "10.0.0.1", tcp_src=20084), 1),
    ]
    assert diff_entries(expected, entries[:2]) == {"missing": [], "unexpected": []}
    assert entries[2].cookie == BACKGROUND_COOKIE and entries[2].out_port == 3
    assert entries[3].match == () and entries[3].out_port is None and entries[3].priority == 0


@pytest.mark.parametrize("actions", ["set_field:1->ip_dscp,output:3", "mod_nw_tos:4,output:3",
                                     "set_field:0x4->nw_tos,output:3"])
def test_ofctl_dump_reads_the_dscp_rewrite_of_best_effort_entries(actions: str) -> None:
    line = (f" cookie=0x8000000000000001, duration=1.2s, table=0, n_packets=3, n_bytes=294, priority=10,ip,"
            f"nw_dst=10.0.0.3 actions={actions}")

    (entry,) = parse_ofctl_dump(1, line)

    assert entry == FlowEntry(1, BEST_EFFORT_PRIORITY, BEST_EFFORT_COOKIE,
                              make_match(eth_type=0x0800, ipv4_dst="10.0.0.3"), 3, set_dscp=LOWER_EFFORT_DSCP)


def test_diff_reports_missing_and_unexpected_entries() -> None:
    a = FlowEntry(1, 200, 7, tcp_match("10.0.0.1", "10.0.0.2", tcp_dst=1), 2)
    b = dataclasses.replace(a, out_port=3)

    diff = diff_entries([a], [b])

    assert diff == {"missing": [a], "unexpected": [b]}


# -- fewest-hops paths without networkx ------------------------------------------------------------
def nx_graph(plan: EmulationPlan) -> nx.Graph:
    """The plan's sites and links as a networkx graph: its switches' sites, then its links, in order."""
    g: nx.Graph = nx.Graph()
    g.add_nodes_from(sw.site for sw in plan.switches)
    g.add_edges_from((ln.a, ln.b) for ln in plan.links)
    return g


@pytest.mark.parametrize("topology", ["triangle", "ring:6", "ring:9", "spine-leaf:2:4", "random:12:1",
                                      "random:20:7", "sndlib/nobel-us", "sndlib/germany50", "topozoo/Abilene"])
def test_the_controllers_fewest_hops_paths_are_networkxs_on_every_pair(topology: str) -> None:
    # Prepare: the plan, and networkx's graph of it (the controller's paths before it did without it)
    plan = EmulationPlan.from_model(load(topology))
    g = nx_graph(plan)
    sites = [sw.site for sw in plan.switches]

    # Execute / Assert: the same path for every ordered pair (ties broken alike), the same next hop
    # towards every site, the same neighbours in the same order
    assert {s: list(n) for s, n in site_neighbours(plan).items()} == {s: list(g.adj[s]) for s in g}
    for a in sites:
        for b in sites:
            assert shortest_site_path(plan, a, b) == nx.shortest_path(g, a, b), (a, b)
        towards = nx.shortest_path(g, target=a)
        assert next_hops_towards(plan, a) == {s: path[1] if len(path) > 1 else None for s, path in towards.items()}


def test_no_path_between_sites_the_plan_does_not_join_or_does_not_have() -> None:
    # Prepare: a plan whose link between two sites is gone
    plan = EmulationPlan.from_model(load("triangle"))
    a, b, c = (sw.site for sw in plan.switches)
    cut = dataclasses.replace(plan, links=tuple(ln for ln in plan.links if {ln.a, ln.b} != {a, b}))
    alone = dataclasses.replace(plan, links=tuple(ln for ln in plan.links if c not in (ln.a, ln.b)
                                                  and {ln.a, ln.b} != {a, b}))

    # Execute / Assert: around the cut; none to a site cut off, nor to one the plan does not have
    assert shortest_site_path(cut, a, b) == [a, c, b]
    with pytest.raises(FlowBuildError, match="no link joins them"):
        shortest_site_path(alone, a, c)
    assert next_hops_towards(alone, c) == {c: None}
    with pytest.raises(FlowBuildError, match="no site 'nowhere'"):
        shortest_site_path(plan, a, "nowhere")
