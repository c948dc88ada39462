"""Working with a network another process runs, without one: the controller faked, hosts as child processes.

`orchestrator.emulation.running` (topology check, what a scheduler sees, task ids, host pids) and
the namespace backend's marks; the real thing runs in tests/integration/test_running_network.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation import cleanup
from orchestrator.emulation.cleanup import ENV_RUN, RunState, process_run_id
from orchestrator.emulation.running import RunningNetwork, find_running
from orchestrator.emulation.task_paths import task_paths
from orchestrator.errors import ConfigError
from orchestrator.procs import proc_start_ticks
from orchestrator.runtime import backends
from orchestrator.runtime.backends import NamespaceBackend, enter_net_namespace
from orchestrator.scheduling import get_scheduler
from orchestrator.scheduling.tasks import generate_tasks
from topologies.loaders import load
from topologies.plan import EmulationPlan

RUN_ID = "unit-running-net"


class FakeController:
    """The few endpoints `RunningNetwork` reads, over installed `TaskPaths` bodies."""

    base_url = "http://127.0.0.1:1"

    def __init__(self, plan: EmulationPlan) -> None:
        self.plan = plan
        self.installed: dict[int, dict[str, Any]] = {}

    def topology(self) -> dict[str, Any]:
        return {"plan": self.plan.to_dict()}

    def tasks(self) -> list[dict[str, Any]]:
        return [{"task_id": t} for t in sorted(self.installed)]

    def task(self, task_id: int) -> dict[str, Any]:
        return self.installed[task_id]


@pytest.fixture
def plan() -> EmulationPlan:
    return EmulationPlan.from_model(load("sndlib/nobel-us"))


@pytest.fixture
def host() -> Iterator[subprocess.Popen[bytes]]:
    """A child process standing in for a Mininet host shell of run `RUN_ID`."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env={**os.environ, ENV_RUN: RUN_ID})
    yield child
    if child.poll() is None:
        child.kill()
    child.wait()


def running(plan: EmulationPlan, tmp_path: Path, host_pids: dict[str, int] | None = None) -> RunningNetwork:
    state = RunState(run_id=RUN_ID, owner_pid=os.getpid(), owner_start_ticks=proc_start_ticks(os.getpid()),
                     log_dir=str(tmp_path), host_pids=host_pids or {})
    return RunningNetwork(client=FakeController(plan), plan=plan, state=state)  # type: ignore[arg-type]


def test_the_running_topology_is_loaded_by_its_name_and_checked(plan: EmulationPlan, tmp_path: Path) -> None:
    net = running(plan, tmp_path)

    model = net.model()

    assert model.name == "sndlib/nobel-us" and sorted(model.compute_sites) == sorted(h.site for h in plan.hosts)
    with pytest.raises(ConfigError, match="not the one the running network"):
        net.model("ring:14")
    with pytest.raises(ConfigError, match="cannot be loaded"):
        running(EmulationPlan.from_model(load("triangle")), tmp_path).model("no/such-topology")


def test_a_plan_with_fewer_hosts_gets_compute_at_its_hosts_only(tmp_path: Path) -> None:
    plan = EmulationPlan.from_model(load("sndlib/nobel-us", compute_sites=["Boulder", "Houston", "Seattle"]))

    model = running(plan, tmp_path).model()

    assert sorted(model.compute_sites) == ["Boulder", "Houston", "Seattle"]


def test_a_scheduler_sees_the_installed_tasks_reservations_and_ids_stay_unique(
    plan: EmulationPlan, tmp_path: Path
) -> None:
    net = running(plan, tmp_path)
    model = net.model()
    (task,) = generate_tasks(model, count=1, locals_per_task=3, seed=2, first_id=5)
    schedule = get_scheduler("spff").schedule(net.network_state(model), task)
    net.client.installed[5] = task_paths(schedule, bw_scale=plan.bw_scale).to_dict()  # type: ignore[attr-defined]

    state = net.network_state(model)

    edge = schedule.edges[0]
    a, b = edge.path[0], edge.path[1]
    on_it = sum(1 for e in schedule.edges for link in e.links() if link == (a, b))
    assert state.background_mbps[(a, b)] == pytest.approx(on_it * schedule.demand_mbps)
    assert net.free_task_id() == 6
    assert net.free_task_id(taken=[9]) == 10


def test_host_pids_are_checked_against_the_run_mark(
    plan: EmulationPlan, tmp_path: Path, host: subprocess.Popen[bytes]
) -> None:
    site = plan.hosts[0].site
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                env={k: v for k, v in os.environ.items() if k != ENV_RUN})
    try:
        net = running(plan, tmp_path, {site: host.pid, plan.hosts[1].site: stranger.pid})

        assert net.host_pid(site) == host.pid
        with pytest.raises(ConfigError, match="is gone"):
            net.host_pid(plan.hosts[1].site)  # alive, but not a host of this run
        with pytest.raises(ConfigError, match="no host"):
            net.host_pid(plan.hosts[2].site)
    finally:
        stranger.kill()
        stranger.wait()
    host.kill()
    host.wait()
    with pytest.raises(ConfigError, match="is gone"):
        net.host_pid(site)


def test_no_running_network_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cleanup, "STATE_DIR", tmp_path)
    dead = RunState(run_id="dead-run", owner_pid=2**22 + 1, owner_start_ticks=1, rest_url="http://127.0.0.1:9")
    dead.save()

    with pytest.raises(ConfigError, match="no running network"):
        find_running()


def test_a_server_in_a_host_namespace_carries_the_networks_run_mark(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Entering a namespace needs root: here the prefix is left out, the rest is the backend's own.
    monkeypatch.setattr(backends, "enter_net_namespace", lambda _pid: [])
    backend = NamespaceBackend({"A": (1, "10.0.0.1", "h1")}, log_root=tmp_path, run_id=RUN_ID)
    proc = backend._popen("A", [sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while process_run_id(proc.pid) != RUN_ID and time.monotonic() < deadline:
            time.sleep(0.01)  # until the child has exec'd (its environ is the parent's before)
        assert process_run_id(proc.pid) == RUN_ID
        assert (backend.address("A"), backend.host_id("A"), backend.name) == ("10.0.0.1", "h1", "attached")
    finally:
        proc.kill()
        proc.wait()
        backend.ctl_dir.rmdir()


def test_entering_a_namespace_names_only_the_hosts_network_namespace() -> None:
    nsenter, mnexec = shutil.which("nsenter"), shutil.which("mnexec")
    if nsenter is None and mnexec is None:
        pytest.skip("neither nsenter nor mnexec is installed")

    prefix = enter_net_namespace(4242)

    expected = [nsenter, "--net=/proc/4242/ns/net", "--"] if nsenter else [mnexec, "-a", "4242"]
    assert prefix == expected


def test_task_ids_recorded_in_the_networks_results_database_are_not_reused(
    plan: EmulationPlan, tmp_path: Path
) -> None:
    from orchestrator.results.db import ResultsDB

    net = running(plan, tmp_path)
    with ResultsDB(tmp_path / "results.db") as db:
        run_id = db.start_run("net-up", {})
        (task,) = generate_tasks(net.model(), count=1, locals_per_task=2, seed=1, first_id=12)
        db.record_task(run_id, "mst", task)
    assert net.state is not None
    net.state.db_path, net.state.db_run_id = str(tmp_path / "results.db"), run_id

    assert net.recorded_task_ids() == {12}
    assert net.free_task_id() == 13


@pytest.mark.parametrize("argv", [
    ["schedule", "--install", "--locals", "2"],
    ["schedule", "--remove", "3"],
])
def test_working_with_a_running_network_when_none_runs_is_a_usage_error(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    monkeypatch.setattr(cleanup, "STATE_DIR", tmp_path)

    status = main(argv)

    assert status == 2
    assert "no running network found" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--backend", "docker"], "--backend must be auto or process"),
    (["--task-id", "0"], "--task-id must be a positive integer"),
    (["--scheduler", "dijkstra"], "unknown scheduler"),
])
def test_attach_refuses_bad_input_before_anything_starts(
    argv: list[str], message: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str]
) -> None:
    from orchestrator.cli import main

    monkeypatch.setattr(cleanup, "STATE_DIR", tmp_path)

    status = main(["task", "run", "--attach", "--locals", "2", *argv])

    assert status == 2
    assert message in capsys.readouterr().err
