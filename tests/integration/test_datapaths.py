"""Choosing a datapath for real: one this kernel cannot give is refused in one line, exit 2, before
anything starts (`netai net up --datapath`, an experiment's ``emulation.datapath``); the tc datapath's
switches hold exactly the filters the controller read back, and its strict mode isolates."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controller.tc_flows import parse_block
from orchestrator.emulation.network import Emulation
from tests.integration.test_experiment import leftovers, netai
from topologies.loaders import load
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root, pytest.mark.slow]

NETAI = Path(sys.executable).with_name("netai")
HAS_MODULE = Path("/sys/module/openvswitch").exists()
NOTHING = {"bridges": [], "veths": [], "controller": [], "containers": []}


@pytest.mark.skipif(HAS_MODULE, reason="this kernel has the openvswitch module: the kernel datapath is there")
def test_net_up_refuses_the_kernel_datapath_without_the_module() -> None:
    res = subprocess.run([str(NETAI), "net", "up", "--datapath", "kernel", "--no-cli"], capture_output=True,
                         text=True, timeout=120)

    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no openvswitch module" in lines[0], res.stderr
    assert leftovers() == NOTHING


@pytest.mark.skipif(HAS_MODULE, reason="this kernel has the openvswitch module: the kernel datapath is there")
def test_an_experiment_asking_for_the_kernel_datapath_is_refused_before_it_starts(tmp_path: Path) -> None:
    config = tmp_path / "kernel.yaml"
    config.write_text(yaml.safe_dump({"name": "kernel", "topology": "ring:4", "schedulers": ["mst"], "locals": [2],
                                      "tasks_per_point": 1, "task": {"model": "mlp", "rounds": 1},
                                      "emulation": {"backend": "process", "datapath": "kernel"},
                                      "background": {"enabled": False}}))

    proc = netai("experiment", str(config), "--out", str(tmp_path / "runs"), "--no-progress")
    out, _ = proc.communicate(timeout=300)

    assert proc.returncode == 2, out[-2000:]
    assert "no openvswitch module" in out
    assert not list((tmp_path / "runs").glob("*/results.db"))  # nothing started, nothing recorded
    assert leftovers() == NOTHING


def test_the_tc_datapath_holds_what_the_controller_reads_and_isolates_in_strict_mode() -> None:
    plan = EmulationPlan.from_model(load("ring:4"))
    with Emulation(plan, datapath="tc", connectivity="strict") as emu:
        assert emu.info is not None and emu.info.datapath == "tc"
        a, b = emu.net.hosts[0], emu.net.hosts[-1]
        isolated = a.cmd("ping", "-c1", "-W1", b.IP())  # strict: no route between them
        emu.client.set_background([[plan.hosts[0].site, plan.hosts[-1].site]])
        routed = a.cmd("ping", "-c2", "-W2", b.IP())
        shown = {sw.dpid: subprocess.run(["tc", "-s", "filter", "show", "block", str(sw.dpid)], capture_output=True,
                                         text=True, check=True).stdout for sw in plan.switches}
        flows = emu.client.background_flows()

    assert " 100% packet loss" in isolated, isolated
    assert " 0% packet loss" in routed, routed
    held = {(st.entry.dpid, st.entry.match, st.entry.out_port)
            for sw in plan.switches for st in parse_block(sw.dpid, sw.name, shown[sw.dpid])}
    read = {(f["dpid"], tuple(sorted(f["match"].items())), f["actions"][-1]["port"]) for f in flows}
    assert read and read == held  # the kernel holds the background routes, and nothing else, in strict mode
    assert sum(f["packets"] for f in flows) >= 4  # two echo requests and two replies, counted
    assert leftovers() == NOTHING
