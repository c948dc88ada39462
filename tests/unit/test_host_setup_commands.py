"""The commands a run's bring-up sends its hosts, its tunnel ends and its servers' switches
(`orchestrator.emulation.mininet_nodes`, `orchestrator.emulation.cluster_nodes`): every host's command
started before any is waited for, each failure named with its host; a tunnel end made in as few
commands as hold its settings (on a far server each is an SSH session); each server's switch batch
under way together with the others'. Fakes stand in for Mininet's nodes; the hosts' commands are real
processes. The real bring-up runs in tests/integration (test_cluster*.py, test_emulation_*.py)."""

from __future__ import annotations

import subprocess
import threading
from typing import Any

import pytest

from orchestrator.emulation import cluster_nodes
from orchestrator.emulation.mininet_nodes import on_each, rto_min_route, tune_hosts


class FakeHost:
    """A host whose commands run here, logging when each starts and when it is waited for."""

    def __init__(self, name: str, events: list[str], *, fails: bool = False, hangs: bool = False) -> None:
        self.name, self.events, self.fails, self.hangs = name, events, fails, hangs
        self.procs: list[subprocess.Popen[bytes]] = []

    def defaultIntf(self) -> str:  # Mininet's name
        return f"{self.name}-eth0"

    def IP(self) -> str:  # Mininet's name
        return "10.0.0.7"

    def cmd(self, line: str) -> str:
        self.events.append(f"cmd {self.name}")
        return ""

    def popen(self, argv: list[str], **kw: Any) -> Any:
        self.events.append(f"start {self.name} {argv[0]}")
        script = "echo 'RTNETLINK answers: no such device' >&2; exit 2" if self.fails else \
            "exec sleep 60" if self.hangs else "exit 0"
        proc = subprocess.Popen(["sh", "-c", script], **kw)
        self.procs.append(proc)
        real = proc.communicate

        def communicate(*args: Any, **kwargs: Any) -> Any:
            self.events.append(f"wait {self.name}")
            return real(*args, **kwargs)

        proc.communicate = communicate  # type: ignore[method-assign]
        return proc


def test_every_hosts_command_starts_before_any_is_waited_for() -> None:
    events: list[str] = []
    hosts = [FakeHost(f"h{i}", events) for i in range(4)]

    on_each(hosts, rto_min_route, "setting rto_min")

    starts = [i for i, e in enumerate(events) if e.startswith("start")]
    waits = [i for i, e in enumerate(events) if e.startswith("wait")]
    assert len(starts) == len(waits) == 4
    assert max(starts) < min(waits), events


def test_each_failure_is_named_with_its_host_after_every_command_ended() -> None:
    events: list[str] = []
    hosts = [FakeHost("h1", events), FakeHost("h2", events, fails=True), FakeHost("h3", events),
             FakeHost("h4", events, fails=True)]

    with pytest.raises(RuntimeError) as err:
        on_each(hosts, rto_min_route, "setting rto_min")

    assert str(err.value) == ("h2: setting rto_min failed: RTNETLINK answers: no such device; "
                              "h4: setting rto_min failed: RTNETLINK answers: no such device")
    assert sum(e.startswith("wait") for e in events) == 4  # none left running


def test_a_command_that_does_not_end_is_killed_reaped_and_named_and_the_others_waited_for() -> None:
    # Prepare: the second of three hosts' commands hangs; the others end at once, one failing
    events: list[str] = []
    hosts = [FakeHost("h1", events), FakeHost("h2", events, hangs=True), FakeHost("h3", events, fails=True)]

    # Execute
    with pytest.raises(RuntimeError) as err:
        on_each(hosts, rto_min_route, "setting rto_min", timeout_s=0.5)

    # Assert: both named, in the hosts' order; every command waited for and none left running
    assert str(err.value) == ("h2: setting rto_min did not end within 0.5 s; "
                              "h3: setting rto_min failed: RTNETLINK answers: no such device")
    assert sum(e.startswith("wait") for e in events) >= 3
    assert [p.returncode for h in hosts for p in h.procs] == [0, -9, 2]


def test_tune_hosts_turns_offload_off_only_when_asked_and_sets_the_route_on_each() -> None:
    events: list[str] = []
    hosts = [FakeHost("a", events), FakeHost("b", events)]

    tune_hosts(hosts, segmentation_offload=True)
    kept = list(events)
    events.clear()
    tune_hosts(hosts, segmentation_offload=False)

    assert kept == ["cmd a", "cmd b", "start a ip", "start b ip", "wait a", "wait b"]
    assert events[-4:] == ["start a ethtool", "start b ethtool", "wait a", "wait b"]
    assert rto_min_route(hosts[0])[:4] == ["ip", "route", "replace", "10.0.0.0/8"]


class FakeServerNode:
    """A node on a server: `rcmd` records each command, which answers `out` (nothing: success)."""

    server = "far-1"

    def __init__(self, out: str = "") -> None:
        self.commands: list[list[str]] = []
        self.out = out

    def rcmd(self, argv: list[str]) -> str:
        self.commands.append(list(argv))
        return self.out


def test_a_tunnel_end_between_machines_is_three_commands_with_its_address_and_mtu_made_with_it() -> None:
    node = FakeServerNode()

    cluster_nodes._vxlan_underlay(node, "s1-eth3", 7, (4800, 4801), ("192.0.2.1", "192.0.2.2"),
                                  "02:00:00:00:00:05", 1450)

    assert node.commands == [
        ["ip", "link", "add", "s1-eth3", "address", "02:00:00:00:00:05", "mtu", "1450", "type", "vxlan", "id",
         "7", "local", "192.0.2.1", "dstport", "4800", "nolearning"],
        ["bridge", "fdb", "append", "00:00:00:00:00:00", "dev", "s1-eth3", "dst", "192.0.2.2", "port", "4801"],
        ["ip", "link", "set", "s1-eth3", "up"],
    ]


def test_a_loopback_tunnel_end_is_made_in_the_underlay_and_moved_out_keeping_its_settings() -> None:
    node = FakeServerNode()

    cluster_nodes._vxlan(node, "s2-eth1", 9, 4802, 4803, None, "run-x")

    ns = cluster_nodes.underlay_netns("run-x")
    assert node.commands == [
        ["ip", "-n", ns, "link", "add", "s2-eth1", "mtu", "1500", "type", "vxlan", "id", "9", "local",
         "127.0.0.1", "dstport", "4802", "nolearning"],
        ["ip", "-n", ns, "link", "set", "s2-eth1", "netns", "1"],
        ["bridge", "fdb", "append", "00:00:00:00:00:00", "dev", "s2-eth1", "dst", "127.0.0.1", "port", "4803"],
        ["ip", "link", "set", "s2-eth1", "up"],
    ]


def test_a_tunnel_end_stops_at_the_first_command_that_answers() -> None:
    node = FakeServerNode(out="RTNETLINK answers: File exists")

    with pytest.raises(RuntimeError, match=r"tunnel end s1-eth3 on far-1: ip link add s1-eth3 .*File exists"):
        cluster_nodes._vxlan_underlay(node, "s1-eth3", 7, (4800, 4801), ("192.0.2.1", "192.0.2.2"), None, 1450)
    assert len(node.commands) == 1


class FakeSwitch:
    def __init__(self, name: str, server: str) -> None:
        self.name, self.server = name, server


def test_each_servers_switches_are_handled_at_once_and_a_failure_is_raised_after_all_ended() -> None:
    switches = [FakeSwitch("s1", "far-1"), FakeSwitch("s2", "localhost"), FakeSwitch("s3", "far-1")]
    both = threading.Barrier(2)  # broken (an error) unless the two servers' calls are under way together
    seen: list[tuple[str, ...]] = []

    def each(members: tuple[Any, ...]) -> None:
        both.wait(timeout=30)
        seen.append(tuple(m.name for m in members))
        if members[0].server == "far-1":
            raise RuntimeError("ovs-vsctl: unix:/var/run/openvswitch/db.sock: database connection failed")

    with pytest.raises(RuntimeError, match="database connection failed"):
        cluster_nodes._per_server(switches, each)

    assert sorted(seen) == [("s1", "s3"), ("s2",)]
