"""The emulation across servers (Mininet's cluster mode, `orchestrator.emulation.cluster`), for real.

localhost is the second "server": an sshd bound to 127.0.0.1 on a spare port with keys made for
the test. Half of a 20-site ring runs there (its switches and hosts started over SSH; ten
switches, whose batched start-up is longer than a terminal line), the two ring links between the
halves are VXLAN tunnels; every host reaches every other, and a task whose
tree spans both servers runs its rounds. An experiment config with a cluster runs to its report.
A wrong host key is refused before anything starts.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from controller.flows import BEST_EFFORT
from orchestrator.emulation.cleanup import underlay_exists, underlay_netns
from orchestrator.emulation.cluster import ClusterServer, ClusterSpec
from orchestrator.emulation.network import Emulation
from orchestrator.errors import ConfigError
from orchestrator.runtime.backends import emulation_options, open_compute
from orchestrator.runtime.summaries import missing_events, read_events
from orchestrator.runtime.task_runner import FLOptions, run_task
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.tasks import Task
from tests.integration.sshd import Sshd
from tests.integration.test_experiment import leftovers, run_config
from topologies.loaders import load
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root, pytest.mark.slow]


def _spec(sshd: Sshd, known_hosts: Path) -> ClusterSpec:
    far = ClusterServer(name=f"root@127.0.0.1:{sshd.port}", user="root", host="127.0.0.1", port=sshd.port,
                        key=str(sshd.client_key), known_hosts=str(known_hosts))
    return ClusterSpec((ClusterServer("localhost"), far))


def _ancestors(pid: int) -> list[str]:
    names = []
    while pid > 1:
        status = dict(line.split(":\t", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
                      if ":\t" in line)
        names.append(status["Name"].strip())
        pid = int(status["PPid"])
    return names


def _pgrep(pattern: str) -> list[str]:
    return subprocess.run(["pgrep", "-f", pattern], capture_output=True, text=True).stdout.split()


def _eventually(check: Callable[[], object], timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_ring_over_two_servers_reaches_every_host_and_runs_a_task(tmp_path: Path, sshd: Sshd) -> None:
    model = load("ring:20")
    plan = EmulationPlan.from_model(model)
    spec = _spec(sshd, sshd.known_hosts)
    far = spec.servers[1].name
    with Emulation(plan, log_dir=tmp_path / "emulation", connectivity=BEST_EFFORT, cluster=spec,
                   **emulation_options("process", log_dir=tmp_path)) as emu, \
            open_compute("process", emu, log_root=tmp_path / "workers") as manager:
        placed = emu.info.cluster["servers"]
        assert sorted(len(s) for s in placed.values()) == [10, 10], placed
        assert len(emu.info.cluster["cut"]) == 2, "a ring cut in two contiguous halves cuts two links"
        for site in model.site_names:
            remote = emu.placement[site] == far
            host, switch = emu.host(site), emu.switch(site)
            assert host.isRemote == remote and switch.isRemote == remote
            # a remote host's shell is a child of sshd (it was started over SSH), a local one is not
            assert ("sshd" in _ancestors(int(host.pid))) == remote, (site, _ancestors(int(host.pid)))
        for a, b in emu.info.cluster["cut"]:
            ln = next(x for x in plan.links if {x.a, x.b} == {a, b})
            for sw, port in ((plan.switch(ln.a).name, ln.port_a), (plan.switch(ln.b).name, ln.port_b)):
                detail = subprocess.run(["ip", "-d", "link", "show", f"{sw}-eth{port}"], capture_output=True,
                                        text=True, check=True).stdout
                assert "vxlan id" in detail and "link-netns " + underlay_netns(emu.run_id) in detail, detail
                qdisc = subprocess.run(["tc", "qdisc", "show", "dev", f"{sw}-eth{port}"], capture_output=True,
                                       text=True, check=True).stdout
                assert "htb" in qdisc, "a tunnel is shaped like every switch link"

        loss = emu.net.pingAll(timeout=2)
        assert loss == 0.0

        # a process started over SSH ends with its local handle (the far side gets the hangup)
        proc = emu.host(next(s for s in model.site_names if emu.placement[s] == far)).popen(["sleep", "4447"])
        assert _eventually(lambda: _pgrep("^sleep 4447$")), "the far process started"
        proc.kill()
        proc.wait(timeout=10)
        assert _eventually(lambda: not _pgrep("^sleep 4447$")), "the far process ended with its handle"

        local_site = next(s for s in model.site_names if emu.placement[s] == "localhost")
        far_sites = [s for s in model.site_names if emu.placement[s] == far]
        task = Task(id=1, global_site=local_site, local_sites=tuple(far_sites[:2]), rounds=2)
        schedule = get_scheduler("spff").schedule(NetworkState(model), task)
        emu.install_task(schedule)
        log_dir = manager.task_dir("task")
        result = run_task(schedule, manager=manager, options=FLOptions(rounds=2), log_dir=log_dir)
        events = {n: read_events(manager.events_file(log_dir, n)) for n in schedule.overlay_nodes}
        run_id = emu.run_id

    assert missing_events(schedule, events, rounds=2) == []
    assert [r.round for r in result.rounds] == [1, 2]
    assert all(r.trained == 2 for r in result.rounds)
    log = sshd.log.read_text()
    assert "Accepted publickey for root" in log, log[-2000:]
    assert not underlay_exists(run_id), "the run's underlay namespace is removed"
    deadline = time.monotonic() + 10
    while (left := leftovers()) != {"bridges": [], "veths": [], "controller": [], "containers": []} \
            and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == {"bridges": [], "veths": [], "controller": [], "containers": []}


def test_a_wrong_host_key_is_refused_before_anything_starts(tmp_path: Path, sshd: Sshd) -> None:
    plan = EmulationPlan.from_model(load("ring:4"))
    emu = Emulation(plan, log_dir=tmp_path / "emulation", cluster=_spec(sshd, sshd.wrong_known_hosts))

    with pytest.raises(ConfigError, match=r"host key is not the one in .*wrong_known_hosts"):
        emu.start()

    assert emu.controller is None, "nothing was started"
    assert not underlay_exists(emu.run_id)
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}


def test_an_experiment_runs_on_a_cluster(tmp_path: Path, sshd: Sshd) -> None:
    config = tmp_path / "cluster.yaml"
    far = {"ssh": f"root@127.0.0.1:{sshd.port}", "key": str(sshd.client_key), "known_hosts": str(sshd.known_hosts)}
    config.write_text(yaml.safe_dump({
        "name": "cluster", "topology": "ring:6", "schedulers": ["spff", "mst"], "locals": [3],
        "tasks_per_point": 1, "seed": 1, "task": {"model": "mlp", "rounds": 2},
        "emulation": {"cluster": {"servers": ["localhost", far]}}, "background": {"enabled": False},
    }))

    status, stdout, _, db = run_config(config, tmp_path / "runs", timeout=600)

    assert status == 0, stdout[-3000:]
    run = db.run(1)
    assert run["status"] == "completed"
    env = run["environment"]
    assert env["backend"] == "process"
    assert sorted(len(s) for s in env["cluster"]["servers"].values()) == [3, 3]
    assert [t["state"] for t in db.query("SELECT state FROM tasks")] == ["done", "done"]
    assert len(db.query("SELECT * FROM rounds")) == 4
    assert str(sshd.client_key) not in stdout and "PRIVATE KEY" not in stdout
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}
