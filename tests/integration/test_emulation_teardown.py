"""Teardown on every exit path (normal, exception, Ctrl-C, SIGTERM) and `netai clean` after a crash.

"Nothing left" means: no process carrying the run's mark (host shells, what ran in them, the
controller), no OVS bridge with the run's tag, none of the run's switch interfaces, no state file.
`netai clean` must also leave alone an OVS bridge and a veth that are not the project's.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation.cleanup import (
    STATE_DIR,
    marked_interfaces,
    marked_processes,
    tagged_bridges,
)
from orchestrator.emulation.network import Emulation
from orchestrator.procs import process_alive
from topologies.loaders import load
from topologies.mininet_topo import switch_interfaces
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root, pytest.mark.slow]

CHILD = Path(__file__).with_name("bringup_child.py")
UP_TIMEOUT_S = 60.0
EXIT_TIMEOUT_S = 30.0


def leftovers(run_id: str, plan: EmulationPlan) -> dict[str, Any]:
    return {
        "processes": sorted(marked_processes({run_id})),
        "bridges": sorted(b for b, rid in tagged_bridges().items() if rid == run_id),
        "interfaces": [n for n in switch_interfaces(plan) if Path(f"/sys/class/net/{n}").exists()],
        "state_file": (STATE_DIR / f"run-{run_id}.json").exists(),
    }


NOTHING: dict[str, Any] = {"processes": [], "bridges": [], "interfaces": [], "state_file": False}


def start_child(topology: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), topology], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + UP_TIMEOUT_S
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if line.startswith("{"):
                return proc, json.loads(line)
        if proc.poll() is not None:
            break
    proc.kill()
    _, err = proc.communicate()
    raise AssertionError(f"timed out after {UP_TIMEOUT_S:g} s waiting for the child's network to come up: {err}")


def test_normal_exit_and_exception_leave_nothing() -> None:
    plan = EmulationPlan.from_model(load("triangle"))
    normal = Emulation(plan)
    with normal:
        assert normal.controller is not None
        controller_pid = normal.controller.pid
        intfs = [i for link in normal.net.links for i in (link.intf1, link.intf2)]
    failing = Emulation(plan)

    with pytest.raises(RuntimeError, match="boom"), failing:
        raise RuntimeError("boom")

    assert controller_pid is not None and not process_alive(controller_pid)
    # every link's pair went in the teardown's one batch (`delete_links`), none by Mininet's own round trips
    assert len(intfs) == 2 * len(plan.links + plan.hosts) and all(i.deleted_in_batch for i in intfs)
    for emu in (normal, failing):
        assert emu.info is not None and emu.info.teardown_clean
        assert leftovers(emu.run_id, plan) == NOTHING


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_signals_tear_the_network_down(sig: signal.Signals) -> None:
    plan = EmulationPlan.from_model(load("triangle"))
    proc, up = start_child("triangle")
    try:  # its switches: Open vSwitch bridges, or on the tc datapath their ports alone
        assert leftovers(up["run_id"], plan)["interfaces"] != []
    except AssertionError:
        proc.kill()
        raise

    proc.send_signal(sig)
    proc.communicate(timeout=EXIT_TIMEOUT_S)

    assert proc.returncode != 0
    assert leftovers(up["run_id"], plan) == NOTHING
    assert not process_alive(up["controller_pid"])


def test_netai_clean_removes_a_crashed_run_and_nothing_else() -> None:
    plan = EmulationPlan.from_model(load("triangle"))
    subprocess.run(["ovs-vsctl", "--may-exist", "add-br", "foreignbr0", "--", "set", "bridge", "foreignbr0",
                    "datapath_type=netdev"], check=True)
    subprocess.run(["ip", "link", "add", "foreign-v0", "type", "veth", "peer", "name", "foreign-v1"], check=True)
    subprocess.run(["ip", "netns", "add", "foreign-ns0"], check=True)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    probe = f"netai-probe-{gone.pid}"  # a kernel probe's namespace, its process killed mid-probe
    subprocess.run(["ip", "netns", "add", probe], check=True)
    try:
        proc, up = start_child("triangle")
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=EXIT_TIMEOUT_S)
        crashed = leftovers(up["run_id"], plan)
        netai = Path(sys.executable).with_name("netai")

        res = subprocess.run([str(netai), "clean", "--json"], capture_output=True, text=True, timeout=120)

        assert crashed["interfaces"] and crashed["processes"] and crashed["state_file"]
        assert res.returncode == 0, res.stderr
        assert up["run_id"] in json.loads(res.stdout[res.stdout.index("{"):])["runs"]
        assert leftovers(up["run_id"], plan) == NOTHING
        assert not process_alive(up["controller_pid"])
        assert "foreignbr0" in subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout
        assert Path("/sys/class/net/foreign-v0").exists()
        assert not Path("/run/netns", probe).exists() and Path("/run/netns/foreign-ns0").exists()
    finally:
        subprocess.run(["ovs-vsctl", "--if-exists", "del-br", "foreignbr0"], check=False)
        subprocess.run(["ip", "link", "del", "foreign-v0"], check=False, capture_output=True)
        for ns in ("foreign-ns0", probe):
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)


def test_a_new_run_clears_a_crashed_run_s_interfaces_but_not_another_program_s(
        capsys: pytest.CaptureFixture[str]) -> None:
    # Mininet names switch interfaces the same way in every run (s1-eth2, ...): a run killed
    # before its teardown (as a CI job cut off) must not stop the next run from building its links.
    plan = EmulationPlan.from_model(load("triangle"))
    proc, up = start_child("triangle")
    assert set(marked_interfaces().items()) >= {(n, up["run_id"]) for n in switch_interfaces(plan)}
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=EXIT_TIMEOUT_S)
    assert leftovers(up["run_id"], plan)["interfaces"], "the crashed run left no interfaces to clear"
    # Its state file lost too (as a CI job's /run may be): only the marks say whose they are.
    (STATE_DIR / f"run-{up['run_id']}.json").unlink()

    with Emulation(plan) as emu:
        assert emu.info is not None and emu.info.switches_connected == len(plan.switches)
    assert leftovers(up["run_id"], plan) == NOTHING
    assert emu.info.teardown_clean and not process_alive(up["controller_pid"])
    assert "interface names are taken" in capsys.readouterr().err

    # An interface of the same name that no run of the testbed holds: refused before anything starts.
    name = switch_interfaces(plan)[0]
    subprocess.run(["ip", "link", "add", name, "type", "veth", "peer", "name", "foreign-v9"], check=True)
    try:
        blocked = Emulation(plan)
        with pytest.raises(RuntimeError, match=rf"before anything was started: 1 of its switch interfaces "
                                               rf"already exist \({name}: not this testbed's"):
            blocked.__enter__()
        assert blocked.controller is None and blocked.net is None and blocked.state is None
        assert leftovers(blocked.run_id, plan) == {**NOTHING, "interfaces": [name]}
        assert Path(f"/sys/class/net/{name}").exists()  # left as it was
    finally:
        subprocess.run(["ip", "link", "del", name], check=False, capture_output=True)


def test_delete_links_removes_the_runs_pairs_together_and_leaves_another_programs_interface_in_its_group() -> None:
    from types import SimpleNamespace

    from orchestrator.emulation.link_groups import interface_group
    from orchestrator.emulation.mininet_nodes import delete_links

    # Prepare: six veth pairs of "a run", and another program's pair already in that run's group
    tag = f"nd{os.getpid() % 10000}"
    root = SimpleNamespace(inNamespace=False)
    links = [SimpleNamespace(intf1=SimpleNamespace(name=f"{tag}a{i}", node=root),
                             intf2=SimpleNamespace(name=f"{tag}b{i}", node=root)) for i in range(6)]
    other = f"{tag}x"
    try:
        for i in range(6):
            subprocess.run(["ip", "link", "add", f"{tag}a{i}", "type", "veth", "peer", "name", f"{tag}b{i}"], check=True)
        subprocess.run(["ip", "link", "add", other, "type", "veth", "peer", "name", f"{tag}y"], check=True)
        subprocess.run(["ip", "link", "set", "dev", other, "group", str(interface_group("run-a"))], check=True)
        # Execute: one run's teardown whose group another program's interface shares, then a run's alone
        delete_links(links[:3], "run-a")
        delete_links(links[3:], "run-b")
        # Assert: every pair of the runs gone and marked; the other program's pair still there
        assert not [n for i in range(6) for n in (f"{tag}a{i}", f"{tag}b{i}") if Path(f"/sys/class/net/{n}").exists()]
        assert all(link.intf1.deleted_in_batch and link.intf2.deleted_in_batch for link in links)
        assert Path(f"/sys/class/net/{other}").exists() and Path(f"/sys/class/net/{tag}y").exists()
    finally:
        for name in [f"{tag}a{i}" for i in range(6)] + [other]:
            subprocess.run(["ip", "link", "del", name], capture_output=True)
