"""The emulation across machines that are not this one, for real: test machines
(`tests.integration.machines`, containers on an internal Docker network) as a lab's servers.

One module-scoped set of machines serves every test here: `netai cluster check` before and after
`netai cluster prepare`; a wrong host key reported; NSFNET brought up over this machine and two
machines (tunnels over the underlay with its MTU, shaped there, only sshd listening beyond
loopback, nothing left afterwards); and an experiment over the three machines, then on one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.flows import BEST_EFFORT
from orchestrator.emulation.cluster import parse_cluster
from orchestrator.emulation.cluster_deploy import project_version
from orchestrator.emulation.network import Emulation
from orchestrator.results.stats import paired_ratio
from orchestrator.results.summary import task_summaries
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.tasks import Task
from tests.integration.machines import Machine, Machines, beyond_loopback, listeners
from tests.integration.test_experiment import leftovers, run_config
from topologies.loaders import load
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow]


def _config(path: Path, machines: Machines, **extra: Any) -> Path:
    servers = ["localhost", *[m.server_entry() for m in machines.machines]]
    path.write_text(yaml.safe_dump({"name": "machines", "topology": "sndlib/nobel-us",
                                    "emulation": {"cluster": {"servers": servers}}, **extra}))
    return path


def _netai(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], capture_output=True, text=True,
                          timeout=600, check=False)


def test_prepare_ships_the_project_and_check_reports_each_server(tmp_path: Path, machines: Machines) -> None:
    config = _config(tmp_path / "c.yaml", machines)
    before = _netai("cluster", "check", str(config), "--json")
    assert before.returncode == 1, before.stdout + before.stderr
    assert all(r["reachable"] and r["host_key"] == "ok" and r["project"] == "absent"
               for r in json.loads(before.stdout)), before.stdout

    prepared = _netai("cluster", "prepare", str(config))
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr

    after = _netai("cluster", "check", str(config), "--json")
    assert after.returncode == 0, after.stdout + after.stderr
    reports = json.loads(after.stdout)
    assert [r["server"] for r in reports] == [f"{m.ssh}:22" for m in machines.machines]
    for r in reports:
        assert r["ok"] and r["missing"] == [] and r["problems"] == [], r
        assert r["project"] == project_version()
        assert r["packages"]["torch"] and r["packages"]["torch"].startswith("2.13.0"), r
        # the containers share this kernel's clock: the offset is within the round trip's half
        assert abs(r["clock_offset_ms"]) <= r["clock_uncertainty_ms"] + 5.0, r
        assert r["underlay_mtu"] == 1500  # a Docker bridge's MTU
    for m in machines.machines:
        assert "orchestrator" in m.exec("ls", "/root/.netai/deploy/src").split()


def test_a_wrong_host_key_is_reported(tmp_path: Path, machines: Machines) -> None:
    m1, m2 = machines.machines[:2]
    swapped = {"ssh": m1.ssh, "key": str(m1.key), "known_hosts": str(m2.known_hosts)}
    config = tmp_path / "wrong.yaml"
    config.write_text(yaml.safe_dump({"emulation": {"cluster": {"servers": ["localhost", swapped]}}}))

    res = _netai("cluster", "check", str(config), "--json")

    assert res.returncode == 1
    (report,) = json.loads(res.stdout)
    assert report["host_key"] == "refused" and not report["reachable"], report
    assert str(m2.known_hosts) in report["error"]


def _ss_here() -> str:
    return subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout


def _far_leftovers(m: Machine, run_id: str) -> dict[str, list[str]]:
    """What a run left on a machine: bridges, vxlan devices, processes carrying its mark."""
    # the glob needs a shell; the run id reaches grep as an argument, not inside the script
    marked = m.exec("sh", "-c", 'grep -l "NETAI_RUN=$1" /proc/[0-9]*/environ 2>/dev/null || true', "marked",
                    run_id).split()
    return {"bridges": m.exec("ovs-vsctl", "list-br").split(),
            "vxlan": m.exec("ip", "-o", "link", "show", "type", "vxlan").splitlines(),
            "processes": [p for p in marked if not p.startswith("/proc/self")]}


def test_nsfnet_over_three_machines_tunnels_shapes_and_opens_no_door(tmp_path: Path, machines: Machines) -> None:
    spec = parse_cluster({"servers": ["localhost", *[m.server_entry() for m in machines.machines]]})
    assert spec is not None
    model = load("sndlib/nobel-us")
    plan = EmulationPlan.from_model(model)
    before = set(beyond_loopback(listeners(_ss_here())))
    with Emulation(plan, log_dir=tmp_path / "emulation", connectivity=BEST_EFFORT, cluster=spec) as emu:
        assert emu.info is not None
        placed, far = emu.info.cluster["servers"], emu.info.cluster["far"]
        assert sorted(len(s) for s in placed.values()) == [4, 5, 5], placed
        assert far["underlay_mtu"] == 1500 and far["inner_mtu"] == 1450
        assert far["underlay"]["localhost"] == machines.gateway
        assert emu.net.pingAll(timeout=2) == 0.0

        # a tunnel between two machines: VXLAN between their underlay addresses, shaped, inner MTU
        m1 = machines.machines[0]
        cut = [(a, b) for a, b in emu.info.cluster["cut"] if m1.ssh + ":22" in (emu.placement[a], emu.placement[b])]
        a, b = cut[0]
        site = a if emu.placement[a] == m1.ssh + ":22" else b
        ln = next(x for x in plan.links if {x.a, x.b} == {a, b})
        dev = f"{plan.switch(site).name}-eth{ln.port_a if site == ln.a else ln.port_b}"
        detail = m1.exec("ip", "-d", "link", "show", dev)
        assert f"local {m1.address}" in detail and "mtu 1450" in detail, detail
        assert "htb" in m1.exec("tc", "qdisc", "show", "dev", dev)

        # a task across the tunnel: its classes are installed on the far interfaces, over SSH
        task = Task(id=1, global_site=a, local_sites=(b,), rounds=1)
        schedule = get_scheduler("spff").schedule(NetworkState(model), task)
        emu.install_task(schedule)
        assert "class htb" in m1.exec("tc", "class", "show", "dev", dev)

        # nothing listens beyond loopback but each machine's sshd; here, nothing new at all
        for m in machines.machines:
            assert beyond_loopback(listeners(m.exec("ss", "-ltnpH"))) == [f"{m.address}:22"]
            assert f"127.0.0.1:{emu.controller.of_port}" in m.exec("ss", "-ltnH")  # the controller, forwarded
        during = _ss_here()
        assert set(beyond_loopback(listeners(during))) <= before, during
        run_id = emu.run_id

    for m in machines.machines:
        assert _far_leftovers(m, run_id) == {"bridges": [], "vxlan": [], "processes": []}
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}


#: NSFNET's hubs Houston and Salt Lake City on the first machine, Pittsburgh on the second: transit
#: sites, so that most trees cross a tunnel; the other 11 sites (this machine) are the compute sites.
FAR_SITES = (("Houston", "Salt-Lake-City"), ("Pittsburgh",))


#: The time dilation of both sides of the experiment. At K = 1 the host's share of a broadcast hop
#: differed between three machines and one (14.7 against 7.2 ms on mst's tunnel hops, the loaded
#: host's cost rather than the tunnel's), more than the schedulers' difference, and the latency
#: intervals did not overlap. At K = 16 they overlapped in six pairs but missed in a CI run (mst's hops
#: through the far machines' switches 0.4-1.2 ms longer in emulated time). At K = 32 every pair
#: overlapped, the two sides' means within 0.07 (docs/measurements/cluster.md, "Measured on the test machines").
TIME_DILATION = 32


def _experiment(path: Path, machines: Machines | None) -> Path:
    far = {s for group in FAR_SITES for s in group}
    compute = [s for s in load("sndlib/nobel-us").site_names if s not in far]
    # the process backend, as cluster mode runs it (and no worker image)
    emulation: dict[str, Any] = {"backend": "process", "time_dilation": TIME_DILATION}
    if machines is not None:
        servers = [m.server_entry() | {"sites": list(sites)} for m, sites in zip(machines.machines, FAR_SITES,
                                                                                  strict=True)]
        emulation |= {"cluster": {"servers": ["localhost", *servers]}}
    path.write_text(yaml.safe_dump({
        "name": path.stem, "topology": "sndlib/nobel-us", "schedulers": ["spff", "mst"], "locals": [8],
        "tasks_per_point": 2, "seed": 3, "compute_sites": compute, "task": {"model": "mlp", "rounds": 3},
        "background": {"enabled": True}, "emulation": emulation,
    }))
    return path


def _ratios(db: Any) -> dict[str, Any]:
    tasks = task_summaries(db, 1)
    return {fig: paired_ratio(tasks, n_locals=8, numerator="mst", denominator="spff", figure=fig)
            for fig in ("mean_latency_s", "reserved_mbps")}


def test_nsfnet_experiment_over_three_machines_then_on_one(tmp_path: Path, machines: Machines,
                                                           figures: list[str]) -> None:
    status, stdout, _, db = run_config(_experiment(tmp_path / "three.yaml", machines), tmp_path / "three",
                                       timeout=900)
    assert status == 0, stdout[-3000:]
    assert [t["state"] for t in db.query("SELECT state FROM tasks")] == ["done"] * 4
    cluster = db.run(1)["environment"]["cluster"]
    names = [f"{m.ssh}:22" for m in machines.machines]
    assert {n: sorted(cluster["servers"][n]) for n in names} == {
        names[0]: ["Houston", "Salt-Lake-City"], names[1]: ["Pittsburgh"]}
    assert len(cluster["servers"]["localhost"]) == 11
    tunnels = {tuple(sorted(c)) for c in cluster["cut"]}
    assert ("Houston", "San-Diego") in tunnels and ("Pittsburgh", "Princeton") in tunnels, tunnels
    assert cluster["far"]["inner_mtu"] == 1450
    carried = db.query("SELECT a, b, MAX(ai_mbps) AS ai, MAX(background_mbps) AS bg FROM link_stats GROUP BY a, b")
    over_tunnels = [r for r in carried if tuple(sorted((r["a"], r["b"]))) in tunnels]
    assert max(r["ai"] for r in over_tunnels) > 0, "the tasks' traffic crossed tunnels"
    assert max(r["bg"] for r in over_tunnels) > 0, "so did the background's"
    three = _ratios(db)
    for m in machines.machines:
        assert m.exec("ovs-vsctl", "list-br").split() == [], "nothing of the run is left on a machine"

    status, stdout, _, db = run_config(_experiment(tmp_path / "one.yaml", None), tmp_path / "one", timeout=900)
    assert status == 0, stdout[-3000:]
    one = _ratios(db)
    for fig in three:
        a, b = three[fig], one[fig]
        assert a is not None and b is not None
        figures.append(f"mst/spff {fig} (NSFNET, 8 locals, 2 tasks x 3 rounds, background on): three machines "
                       f"{a.mean:.3f} [{a.low:.3f}, {a.high:.3f}], one machine {b.mean:.3f} [{b.low:.3f}, {b.high:.3f}]")
    # the schedulers decide alike wherever the switches run: the reserved bandwidth's ratio is the same
    bw3, bw1 = three["reserved_mbps"], one["reserved_mbps"]
    assert bw3 is not None and bw1 is not None and bw3.low <= bw1.high and bw1.low <= bw3.high
    # and, dilated (TIME_DILATION), the tunnels do not move mst's latency against spff's
    lat3, lat1 = three["mean_latency_s"], one["mean_latency_s"]
    assert lat3 is not None and lat1 is not None
    assert lat3.low <= lat1.high and lat1.low <= lat3.high, figures[-2:]


def test_a_machine_lost_mid_run_is_reported_and_the_others_are_left_clean(tmp_path: Path,
                                                                          machines: Machines) -> None:
    """Last in the module: it kills the second machine."""
    m1, m2 = machines.machines[:2]
    spec = parse_cluster({"servers": ["localhost", m1.server_entry() | {"sites": ["r2"]},
                                      m2.server_entry() | {"sites": ["r4"]}]})
    emu = Emulation(EmulationPlan.from_model(load("ring:6")), log_dir=tmp_path / "emulation",
                    connectivity=BEST_EFFORT, cluster=spec)
    with emu:
        assert emu.net.pingAll(timeout=1) == 0.0
        subprocess.run(["docker", "kill", m2.name], check=True, capture_output=True)

    assert emu.info is not None
    assert emu.info.cluster["far"]["lost"] == [f"{m2.ssh}:22"]
    assert emu.info.teardown_clean is False, "what is left on the lost machine was not checked"
    assert _far_leftovers(m1, emu.run_id) == {"bridges": [], "vxlan": [], "processes": []}
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}
    assert emu.leftovers() == {"processes": [], "bridges": [], "interfaces": []}
