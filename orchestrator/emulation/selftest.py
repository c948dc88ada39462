"""Checks on a running emulation: TCP reachability, isolation, iperf3 goodput, flow tables vs the schedule.

Also `self_test`, the body of ``netai net test`` (like ``mn --test``): bring a topology up in strict
connectivity (no best-effort routes, so that isolation can be checked), install an
``mst`` schedule for one task, check that every overlay edge carries TCP and that two hosts with no
route do not, compare every switch's flow table with the pure builder's entries, check the task's
byte counters, measure iperf3 over a shaped multi-hop path against its configured rate, tear down.

Traffic only flows between the emulation's hosts (inside their namespaces). Readiness (a server
listening) is polled, never slept for.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from controller.flows import (
    STRICT,
    FlowEntry,
    background_entries,
    best_effort_entries,
    diff_entries,
    parse_ofctl_dump,
    table_miss_entries,
    task_entries,
)
from controller.tc_flows import TC, as_installed, parse_block
from orchestrator.emulation.background import wait_listening
from orchestrator.emulation.network import DEFAULT_CONNECT_TIMEOUT_S, Emulation
from orchestrator.emulation.task_paths import task_paths
from orchestrator.errors import ConfigError
from orchestrator.scheduling.schedule import Schedule, task_ports
from topologies.plan import DEFAULT_MAX_LINK_MBPS, EmulationPlan

#: TCP goodput / shaped line rate at best: payload 1448 of 1514 bytes on the wire (TCP timestamps).
GOODPUT_CEILING = 1448 / 1514
LISTEN_TIMEOUT_S = 5.0
COUNTER_TIMEOUT_S = 5.0
#: The band `self_test` accepts for goodput / line rate: looser than the 0.90-1.05 target, because
#: the userspace datapath shares two cores with everything else on the machine.
IPERF_RATIO_BAND = (0.70, 1.05)


@dataclass(frozen=True)
class TransferResult:
    """One iperf3 client run."""

    ok: bool
    bytes_sent: int = 0  # written by the client (iperf3 may stop before all of it is on the wire)
    bytes_received: int = 0  # payload the server received: what crossed the network
    mbps: float = 0.0
    error: str = ""


def iperf(
    src: Any,
    dst: Any,
    port: int,
    *,
    nbytes: int | None = None,
    seconds: float | None = None,
    connect_timeout_s: float = 2.0,
    timeout_s: float = 30.0,
) -> TransferResult:
    """Run an iperf3 server on `dst`:`port` (one test) and a client on `src`; goodput at the receiver."""
    server = dst.popen(
        ["iperf3", "-s", "-1", "-p", str(port), "-B", dst.IP()],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        wait_listening([(server, dst.IP(), port, dst.name)], timeout_s=LISTEN_TIMEOUT_S)
        amount = ["-n", str(nbytes)] if nbytes is not None else ["-t", f"{seconds or 3:g}"]
        client = src.popen(
            ["iperf3", "-c", dst.IP(), "-p", str(port), "-J", "--connect-timeout", str(int(connect_timeout_s * 1000)),
             *amount],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            out, err = client.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            client.kill()
            client.communicate()
            return TransferResult(ok=False, error=f"iperf3 client timed out after {timeout_s:g} s")
        try:
            report = json.loads(out)
        except json.JSONDecodeError:
            return TransferResult(ok=False, error=(err or out).strip()[:200])
        if client.returncode != 0 or "error" in report:
            return TransferResult(ok=False, error=str(report.get("error", err.strip()))[:200])
        end = report["end"]
        return TransferResult(
            ok=True,
            bytes_sent=int(end["sum_sent"]["bytes"]),
            bytes_received=int(end["sum_received"]["bytes"]),
            mbps=float(end["sum_received"]["bits_per_second"]) / 1e6,
        )
    finally:
        if server.poll() is None:
            server.kill()
        server.communicate()


def poll_counter(read: Callable[[], int], at_least: int, *, timeout_s: float = COUNTER_TIMEOUT_S) -> int:
    """Poll a flow counter until it reaches `at_least` or `timeout_s` passes; returns the last value.

    OVS updates OpenFlow counters from its datapath flows in the background (its revalidators run
    about every 500 ms), so a counter read right after a transfer may lag behind.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if value >= at_least or time.monotonic() >= deadline:
            return value
        time.sleep(0.1)


def ping_ok(src: Any, dst: Any) -> bool:
    """One ICMP echo from `src` to `dst` answered within a second."""
    proc = src.popen(["ping", "-c1", "-W1", dst.IP()], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=10)
    return " 0% packet loss" in out


def switch_flow_table(emu: Emulation, site: str) -> list[FlowEntry]:
    """The flow table of a site's switch as the switch itself reports it: ``ovs-ofctl`` on Open
    vSwitch, ``tc filter show`` on the tc datapath (`controller.tc_flows`)."""
    sw = emu.plan.switch(site)
    if emu.info is not None and emu.info.datapath == TC:
        res = subprocess.run(["tc", "-s", "filter", "show", "block", str(sw.dpid)], capture_output=True, text=True,
                             check=True)
        return [st.entry for st in parse_block(sw.dpid, sw.name, res.stdout)]
    res = subprocess.run(
        ["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", sw.name], capture_output=True, text=True, check=True
    )
    return parse_ofctl_dump(sw.dpid, res.stdout)


def as_switch_holds(emu: Emulation, expected: Sequence[FlowEntry]) -> list[FlowEntry]:
    """`expected` as the run's switches hold it: unchanged on Open vSwitch; on the tc datapath
    without drops and DSCP rewrites (`controller.tc_flows.as_installed`)."""
    if emu.info is None or emu.info.datapath != TC:
        return list(expected)
    return [e for e in map(as_installed, expected) if e is not None]


def expected_entries(
    plan: EmulationPlan, schedules: Sequence[Schedule], background_pairs: Sequence[Sequence[str]] = (),
    *, best_effort: bool = False,
) -> list[FlowEntry]:
    """Everything every switch should hold for these schedules and background pairs (and, with
    `best_effort`, the best-effort connectivity of a network not in strict mode)."""
    entries = [*table_miss_entries(plan), *background_entries(plan, background_pairs)]
    if best_effort:
        entries += best_effort_entries(plan)
    for s in schedules:
        entries += task_entries(task_paths(s, bw_scale=plan.bw_scale), plan)
    return entries


def compare_flow_tables(emu: Emulation, expected: Sequence[FlowEntry]) -> dict[str, dict[str, list[str]]]:
    """Per switch whose table differs from `expected`: missing and unexpected entries (as text)."""
    diffs = {}
    expected = as_switch_holds(emu, expected)
    for sw in emu.plan.switches:
        actual = switch_flow_table(emu, sw.site)
        diff = diff_entries([e for e in expected if e.dpid == sw.dpid], actual)
        if diff["missing"] or diff["unexpected"]:
            diffs[sw.name] = {k: [repr(e) for e in v] for k, v in diff.items()}
    return diffs


def edge_port(schedule: Schedule, procedure: str) -> int:
    broadcast_port, upload_port = task_ports(schedule.task_id)
    return broadcast_port if procedure == "broadcast" else upload_port


def isolated_pair(plan: EmulationPlan, busy_sites: set[str]) -> tuple[str, str]:
    """Two compute sites outside `busy_sites` (hosts that no task or background route joins)."""
    free = [h.site for h in plan.hosts if h.site not in busy_sites]
    if len(free) < 2:
        raise ValueError(f"need two compute sites outside {sorted(busy_sites)}")
    return free[0], free[-1]


def longest_shortest_pair(plan: EmulationPlan, min_hops: int = 3) -> tuple[str, str, list[str]]:
    """Two compute sites whose fewest-hops path has at least `min_hops` links (the first found)."""
    from controller.flows import shortest_site_path

    best: tuple[str, str, list[str]] | None = None
    sites = [h.site for h in plan.hosts]
    for i, a in enumerate(sites):
        for b in sites[i + 1:]:
            path = shortest_site_path(plan, a, b)
            if len(path) - 1 >= min_hops:
                return a, b, path
            if best is None or len(path) > len(best[2]):
                best = (a, b, path)
    if best is None:
        raise ValueError("the plan has fewer than two hosts")
    return best


def self_test(
    topology: str = "sndlib/nobel-us",
    *,
    locals_per_task: int = 5,
    iperf_seconds: float = 3.0,
    seed: int = 1,
    max_link_mbps: float = DEFAULT_MAX_LINK_MBPS,
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
    say: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """The ``netai net test`` checks (see the module docstring); returns the summary dict.

    Keys: ``switches_connected``, ``switches_expected``, ``bringup_s``, ``paths_ok``,
    ``isolation_ok``, ``flows_match``, ``bytes_ok``, ``iperf_mbps``, ``iperf_configured_mbps``,
    ``iperf_ratio`` (goodput / shaped line rate), ``iperf_ratio_of_ceiling`` (goodput / the TCP
    goodput ceiling `GOODPUT_CEILING` x line rate), ``delay_emulated``, ``teardown_clean``,
    ``ok``, and details of failures. `connect_timeout_s` is the emulation's wait for the controller,
    then for every switch (`Emulation`).
    """
    plan, schedule = _test_task(topology, locals_per_task=locals_per_task, seed=seed, max_link_mbps=max_link_mbps)
    # Decide the isolation and iperf3 pairs before anything starts: a topology too small is a usage error.
    try:
        iso_a, iso_b = isolated_pair(plan, set(schedule.overlay_nodes))
    except ValueError as e:
        raise ConfigError(f"{topology}: {e}; use fewer --locals") from e
    perf_a, perf_b, perf_path = longest_shortest_pair(plan, min_hops=3)
    result: dict[str, Any] = {"topology": topology, "task": schedule.task_id, "scheduler": "mst",
                              "connectivity": STRICT}
    # Strict: the isolation check needs hosts that no route joins, the flow tables hold only the task's.
    emu = Emulation(plan, connectivity=STRICT, connect_timeout_s=connect_timeout_s)
    with emu:
        info = emu.info
        assert info is not None
        result.update(
            switches_connected=info.switches_connected,
            switches_expected=len(plan.switches),
            bringup_s=info.bringup_s,
            delay_emulated=info.delay_emulated,
            datapath=info.datapath,
            run_id=info.run_id,
        )
        say(f"up: {info.switches_connected}/{len(plan.switches)} switches in {info.bringup_s:.2f} s")
        emu.install_task(schedule)
        _check_paths(emu, schedule, result, say)
        _check_isolation(emu, schedule, (iso_a, iso_b), result, say)
        _check_flows(emu, schedule, result, say)
        _check_bytes(emu, schedule, result, say)
        _check_iperf(emu, (perf_a, perf_b, perf_path), iperf_seconds, result, say)
    info = emu.info
    assert info is not None
    result["teardown_clean"] = bool(info.teardown_clean)
    result["teardown_s"] = info.teardown_s
    result["leftovers"] = info.leftovers
    result["ok"] = _all_passed(result)
    return result


def _test_task(topology: str, *, locals_per_task: int, seed: int, max_link_mbps: float) -> tuple[EmulationPlan, Schedule]:
    """The plan of `topology` and one seeded task scheduled by mst on the idle network.

    Raises
    ------
    ConfigError
        If mst blocks the task.
    """
    from orchestrator.scheduling import NetworkState, get_scheduler
    from orchestrator.scheduling.tasks import generate_tasks
    from topologies.loaders import load

    model = load(topology)
    plan = EmulationPlan.from_model(model, max_link_mbps=max_link_mbps)
    task = generate_tasks(model, count=1, locals_per_task=locals_per_task, seed=seed)[0]
    schedule = get_scheduler("mst").schedule(NetworkState(model), task)
    if schedule.blocked:
        raise ConfigError(f"the mst scheduler blocked the test task {task.id}: {schedule.reason}")
    return plan, schedule


def _all_passed(result: dict[str, Any]) -> bool:
    """Every check passed: all switches, paths, isolation, flows, bytes, iperf3 in its band, clean teardown."""
    return bool(
        result["switches_connected"] == result["switches_expected"]
        and result["paths_ok"] and result["isolation_ok"] and result["flows_match"] and result["bytes_ok"]
        and IPERF_RATIO_BAND[0] <= result["iperf_ratio"] <= IPERF_RATIO_BAND[1] and result["teardown_clean"]
    )


def plan_link_mbps(plan: EmulationPlan, a: str, b: str) -> float:
    for ln in plan.links:
        if {ln.a, ln.b} == {a, b}:
            return ln.emulated_mbps
    raise ValueError(f"no link {a}-{b}")


Say = Callable[[str], None]


def _check_paths(emu: Emulation, schedule: Schedule, result: dict[str, Any], say: Say) -> None:
    """Overlay neighbours reach each other on the edge's port."""
    failures = []
    for edge in schedule.edges:
        r = iperf(emu.host(edge.src), emu.host(edge.dst), edge_port(schedule, edge.procedure), nbytes=64_000)
        if not r.ok:
            failures.append(f"{edge.procedure} {edge.src}->{edge.dst}: {r.error}")
    result["paths_ok"] = not failures
    result["path_failures"] = failures
    say(f"paths: {len(schedule.edges) - len(failures)}/{len(schedule.edges)} overlay edges carry TCP")


def _check_isolation(emu: Emulation, schedule: Schedule, pair: tuple[str, str], result: dict[str, Any],
                     say: Say) -> None:
    """Two hosts no route joins stay isolated (TCP on a task port and ICMP)."""
    a, b = pair
    tcp = iperf(emu.host(a), emu.host(b), edge_port(schedule, "broadcast"), nbytes=10_000, connect_timeout_s=1.0)
    icmp = ping_ok(emu.host(a), emu.host(b))
    result["isolation_ok"] = not tcp.ok and not icmp
    result["isolated_pair"] = [a, b]
    say(f"isolation {a} <-> {b}: {'ok' if result['isolation_ok'] else 'BROKEN'}")


def _check_flows(emu: Emulation, schedule: Schedule, result: dict[str, Any], say: Say) -> None:
    """Flow tables equal the schedule's entries."""
    diffs = compare_flow_tables(emu, expected_entries(emu.plan, [schedule]))
    result["flows_match"] = not diffs
    result["flow_diffs"] = diffs
    say(f"flow tables: {'match' if not diffs else f'{len(diffs)} switch(es) differ'} the schedule")


def _check_bytes(emu: Emulation, schedule: Schedule, result: dict[str, Any], say: Say) -> None:
    """The task's byte counters grow by at least the bytes sent over one edge."""
    plan = emu.plan
    edge = max(schedule.edges, key=lambda e: len(e.path))
    first_dpid = plan.switch(edge.src).dpid
    dst_ip = plan.host(edge.dst).ip
    port = edge_port(schedule, edge.procedure)

    def edge_bytes() -> int:
        return sum(
            f["bytes"] for f in emu.client.flows(schedule.task_id)
            if f["dpid"] == first_dpid and f["match"].get("ipv4_dst") == dst_ip and f["match"].get("tcp_dst") == port
        )

    before = edge_bytes()
    sent = iperf(emu.host(edge.src), emu.host(edge.dst), port, nbytes=2_000_000)
    # Payload the receiver got is a lower bound of the bytes (with headers) the entry carried.
    grown = poll_counter(lambda: edge_bytes() - before, sent.bytes_received) if sent.ok else 0
    result["bytes_ok"] = sent.ok and sent.bytes_received > 0 and grown >= sent.bytes_received
    result["bytes_sent"], result["bytes_counted"] = sent.bytes_received, grown
    say(f"byte counters: {sent.bytes_received} payload bytes received, {grown} counted on {edge.src}'s switch")


def _check_iperf(emu: Emulation, pair: tuple[str, str, list[str]], seconds: float, result: dict[str, Any],
                 say: Say) -> None:
    """iperf3 over a shaped multi-hop path (a background route between two other hosts)."""
    a, b, path = pair
    emu.client.set_background([[a, b]])
    configured = min(plan_link_mbps(emu.plan, u, v) for u, v in itertools.pairwise(path))
    r = iperf(emu.host(a), emu.host(b), 5201, seconds=seconds)
    result.update(
        iperf_path=path,
        iperf_mbps=round(r.mbps, 3),
        iperf_configured_mbps=configured,
        iperf_ratio=round(r.mbps / configured, 4) if r.ok else 0.0,
        iperf_ratio_of_ceiling=round(r.mbps / (configured * GOODPUT_CEILING), 4) if r.ok else 0.0,
    )
    say(f"iperf3 {a}->{b} over {len(path) - 1} shaped links: {r.mbps:.1f} of {configured:g} Mbit/s "
        f"(ratio {result['iperf_ratio']:.3f} of line rate)")


def dump_flows(emu: Emulation) -> str:
    """``ovs-ofctl dump-flows`` (``tc filter show`` on the tc datapath) of every switch of a running
    emulation (for failure reports)."""
    out = []
    tc = emu.info is not None and emu.info.datapath == TC
    for sw in emu.plan.switches:
        argv = (["tc", "-s", "filter", "show", "block", str(sw.dpid)] if tc
                else ["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", sw.name])
        res = subprocess.run(argv, capture_output=True, text=True, check=False)
        out.append(f"--- {sw.name} ({sw.site})\n{res.stdout}{res.stderr}")
    return "\n".join(out)
