"""Far servers' pure parts: the given placement, where the controller shapes each interface, the tc split."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import pytest

from controller.core import ControllerCore
from controller.tc import ClusterTc, ShapingError
from orchestrator.emulation.cluster import LOCAL, ClusterServer, ClusterSpec, SshResult, checked_placement
from orchestrator.emulation.cluster_far import FarSide, far_side, tc_servers_file
from orchestrator.errors import ConfigError
from tests.unit.controller_fakes import FakeSwitches
from topologies.loaders import load
from topologies.plan import EmulationPlan

FAR = ClusterServer(name="root@10.9.0.2:22", user="root", host="10.9.0.2", key="/k", known_hosts="/kh",
                    sites=("r2",))


class _Local:
    def __init__(self) -> None:
        self.batches: list[list[Sequence[str]]] = []

    def check(self, devices: Sequence[str]) -> str | None:
        return None

    def run(self, commands: Sequence[Sequence[str]], *, force: bool = False) -> None:
        self.batches.append(list(commands))


def test_a_server_listing_its_sites_places_them_and_the_rest_stay_here() -> None:
    plan = EmulationPlan.from_model(load("ring:4"))
    spec = ClusterSpec((ClusterServer(LOCAL), FAR))

    placement = checked_placement(plan, spec, None, None)

    assert placement == {"r1": LOCAL, "r2": FAR.name, "r3": LOCAL, "r4": LOCAL}
    bad = ClusterSpec((ClusterServer(LOCAL), ClusterServer(**{**FAR.__dict__, "sites": ("nowhere",)})))
    with pytest.raises(ConfigError, match="'nowhere', which is not a site"):
        checked_placement(plan, bad, None, None)


def test_the_far_interfaces_are_shaped_over_their_servers_ssh(tmp_path: Path) -> None:
    plan = EmulationPlan.from_model(load("ring:4"))
    placement = {"r1": LOCAL, "r2": FAR.name, "r3": LOCAL, "r4": LOCAL}
    far = FarSide(ClusterSpec((ClusterServer(LOCAL), FAR)), tmp_path, {LOCAL: "10.9.0.1", FAR.name: "10.9.0.2"}, 1500)

    spec = json.loads(tc_servers_file(tmp_path / "tc.json", far, plan, placement).read_text())

    s2 = plan.switch("r2").name
    assert spec["devices"] and all(d.startswith(s2 + "-eth") for d in spec["devices"])
    assert set(spec["devices"].values()) == {FAR.name}
    argv = spec["servers"][FAR.name]
    assert argv[0] == "ssh" and argv[-1] == "root@10.9.0.2" and "StrictHostKeyChecking=yes" in argv
    assert far.inner_mtu == 1450


def test_a_tc_batch_is_split_by_the_server_of_each_device(tmp_path: Path) -> None:
    record = tmp_path / "far.txt"
    # stands for `ssh ... target`: records the command line it was given and the batch on stdin
    fake_ssh = [sys.executable, "-c", "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text("
                "sys.argv[2] + '|' + sys.stdin.read())", str(record)]
    local = _Local()
    tc = ClusterTc(local, {"m1": fake_ssh}, {"s2-eth1": "m1"})

    tc.run([["qdisc", "add", "dev", "s1-eth1", "root", "handle", "1:", "htb"],
            ["qdisc", "add", "dev", "s2-eth1", "root", "handle", "1:", "htb"]])

    assert local.batches == [[["qdisc", "add", "dev", "s1-eth1", "root", "handle", "1:", "htb"]]]
    assert record.read_text() == "tc -batch -|qdisc add dev s2-eth1 root handle 1: htb\n"
    failing = ClusterTc(local, {"m1": [sys.executable, "-c", "import sys; sys.exit(2)"]}, {"s2-eth1": "m1"})
    with pytest.raises(ShapingError, match="tc -batch on m1 exited 2"):
        failing.run([["qdisc", "del", "dev", "s2-eth1", "root"]])


def test_far_and_loopback_servers_do_not_mix(tmp_path: Path) -> None:
    here = ClusterServer(name="root@127.0.0.1:2222", user="root", host="127.0.0.1", port=2222, key="/k",
                         known_hosts="/kh")
    with pytest.raises(ConfigError, match="mixes servers on other machines"):
        far_side(ClusterSpec((ClusterServer(LOCAL), here, FAR)), tmp_path)
    assert far_side(ClusterSpec((ClusterServer(LOCAL), here)), tmp_path) is None


def test_a_far_server_that_no_longer_answers_is_lost_and_its_nodes_marked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    other = ClusterServer(name="root@10.9.0.3:22", user="root", host="10.9.0.3", key="/k", known_hosts="/kh")
    far = FarSide(ClusterSpec((ClusterServer(LOCAL), FAR, other)), tmp_path, {}, 1500)
    answers = {FAR.host: SshResult(0, "", ""), other.host: SshResult(255, "", "No route to host")}
    monkeypatch.setattr("orchestrator.emulation.cluster_far.ssh_run",
                        lambda server, _dir, _argv, **_kw: answers[server.host])

    class Node:
        def __init__(self, server: str) -> None:
            self.server, self.lost = server, False

    here, near, gone = Node(LOCAL), Node(FAR.name), Node(other.name)
    net = type("Net", (), {"hosts": [here, gone], "switches": [near]})()

    assert far.mark_lost(net) == [other.name]
    assert (here.lost, near.lost, gone.lost) == (False, False, True)
    assert far.to_dict()["lost"] == [other.name]


def test_a_forward_or_probe_has_its_own_connection_and_keeps_ssh_s_reason(tmp_path: Path) -> None:
    from orchestrator.emulation.cluster import own_connection_argv, ssh_argv

    shared = ssh_argv(FAR, tmp_path)
    own = own_connection_argv(FAR, tmp_path)

    assert "ControlMaster=auto" in shared and f"ControlPath={tmp_path}/%C" in shared and "-q" in shared
    assert "ControlMaster=no" in own and "ControlPath=none" in own and "-q" not in own
    assert not any(a.startswith("ControlPath=") and a != "ControlPath=none" for a in own)
    # everything else as ssh_argv has it: the key, the host key check, the timeouts
    assert [a for a in own if not a.startswith("Control")] == [a for a in shared if not a.startswith("Control")
                                                               and a != "-q"]


def test_a_server_whose_switches_are_all_disconnected_is_not_asked(tmp_path: Path) -> None:
    record = tmp_path / "far.txt"
    fake_ssh = [sys.executable, "-c", "import sys, pathlib; pathlib.Path(sys.argv[1]).write_text(sys.stdin.read())",
                str(record)]
    tc = ClusterTc(_Local(), {"m1": fake_ssh}, {"s2-eth1": "m1", "s3-eth2": "m1"})
    batch = [["class", "del", "dev", "s2-eth1", "classid", "1:20"], ["class", "del", "dev", "s3-eth2", "classid", "1:20"]]

    tc.switches_down(["s2"])  # one of its two switches: still asked
    tc.run(batch, force=True)
    assert record.read_text().count("class del") == 2
    record.unlink()

    tc.switches_down(["s2", "s3", "s5"])  # every switch of m1
    with pytest.raises(ShapingError, match="tc on m1 not run: its switches are disconnected"):
        tc.run(batch, force=True)
    assert not record.exists()

    tc.switches_down(["s5"])  # back
    tc.run(batch, force=True)
    assert record.exists()


def test_the_controller_tells_the_shaper_which_switches_are_down() -> None:
    plan = EmulationPlan.from_model(load("ring:4"))
    told: list[list[str]] = []

    class _Shaper:
        def switches_down(self, switches: Iterable[str]) -> None:
            told.append(sorted(switches))

    core = ControllerCore(plan, FakeSwitches(plan), shaper=_Shaper())  # type: ignore[arg-type]
    names = sorted(sw.name for sw in plan.switches)
    for sw in plan.switches:
        core.switch_connected(sw.dpid)
    assert told[-1] == []
    lost = plan.switches[1]
    core.switch_disconnected(lost.dpid)
    assert told[-1] == [lost.name] and lost.name in names
    core.switch_connected(lost.dpid)
    assert told[-1] == []
