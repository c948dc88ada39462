"""`run_attached` without Mininet: the controller faked, the hosts' servers on loopback (real site
servers and roles), the running network's results database a real file.

The real thing (``netai net up`` + ``netai task run --attach``) is in
tests/integration/test_running_network.py.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation.cleanup import RunState
from orchestrator.emulation.running import RunningNetwork
from orchestrator.errors import ConfigError
from orchestrator.experiment import attach
from orchestrator.experiment.attach import AttachRequest, run_attached
from orchestrator.results.db import ResultsDB
from orchestrator.runtime.backends import LoopbackBackend
from orchestrator.runtime.compute import check_model
from orchestrator.runtime.task_runner import FLOptions
from tests.unit.test_running_network import FakeController as ReadOnlyController
from topologies.loaders import load
from topologies.plan import EmulationPlan


class FakeController(ReadOnlyController):
    """Installed tasks as the controller keeps them; byte counters that grow once per read."""

    def __init__(self, plan: EmulationPlan) -> None:
        super().__init__(plan)
        self.log: list[tuple[str, int]] = []

    def install_task(self, paths: Any) -> dict[str, Any]:
        body = paths.to_dict()
        self.installed[body["task_id"]] = body
        self.log.append(("install", body["task_id"]))
        return {"task_id": body["task_id"], "entries": 4 * len(body["paths"]),
                "reservation": {"enforced": False, "reason": "fake controller"}}

    def remove_task(self, task_id: int) -> dict[str, Any]:
        self.installed.pop(task_id)
        self.log.append(("remove", task_id))
        return {"task_id": task_id}

    def task_bytes(self, task_id: int) -> int:
        if task_id not in self.installed:
            raise RuntimeError(f"no task {task_id}")
        return 123_456


class LoopbackNetwork(RunningNetwork):
    """A running network whose hosts are loopback addresses (no namespaces to enter)."""

    def host_pid(self, site: str) -> int:
        return os.getpid()


@pytest.fixture
def network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LoopbackNetwork:
    plan = EmulationPlan.from_model(load("triangle"))
    db = ResultsDB(tmp_path / "results.db")
    run_id = db.start_run("net-up", {"topology": "triangle"})
    db.close()
    state = RunState(run_id="unit-attach", owner_pid=os.getpid(), owner_start_ticks=None, log_dir=str(tmp_path),
                     db_path=str(tmp_path / "results.db"), db_run_id=run_id, clock_zero=1.0)
    # The servers go where the namespace backend would put them, on 127.0.0.x instead.
    monkeypatch.setattr(attach, "NamespaceBackend",
                        lambda hosts, *, log_root, run_id: LoopbackBackend(list(hosts), log_root=log_root))
    return LoopbackNetwork(client=FakeController(plan), plan=plan, state=state)  # type: ignore[arg-type]


def request(tmp_path: Path, **over: Any) -> AttachRequest:
    options = FLOptions(model="mlp", rounds=2, local_epochs=1)
    fields: dict[str, Any] = {"scheduler": "mst", "locals": 2, "seed": 1, "options": options,
                              "model_bytes": check_model("mlp", {}), "log_root": tmp_path / "logs"}
    return AttachRequest(**(fields | over))


@pytest.mark.slow
def test_an_attached_task_runs_its_rounds_is_recorded_and_leaves_no_paths(
    network: LoopbackNetwork, tmp_path: Path
) -> None:
    rounds_seen: list[int] = []

    out = run_attached(network, request(tmp_path), on_round=lambda r: rounds_seen.append(r.round))

    client: FakeController = network.client  # type: ignore[assignment]
    assert [r.round for r in out.result.rounds] == [1, 2] and rounds_seen == [1, 2]
    assert client.log == [("install", out.task.id), ("remove", out.task.id)] and client.installed == {}
    assert out.recorded_in == str(tmp_path / "results.db")
    with sqlite3.connect(tmp_path / "results.db") as db:
        task = db.execute("SELECT state, arrival_s, admitted_s, finished_s, carried_bytes FROM tasks").fetchone()
        events = [r[0] for r in db.execute("SELECT state FROM task_events ORDER BY t_s")]
        rounds = db.execute("SELECT count(*), min(lower_bound_s) FROM rounds").fetchone()
        nodes = db.execute("SELECT count(*) FROM node_rounds").fetchone()[0]
    state, arrival, admitted, finished, carried = task
    assert state == "done" and carried == 123_456
    assert arrival <= admitted <= finished  # on the network's run clock
    assert events == ["pending", "scheduled", "running", "done"]
    assert rounds[0] == 2 and rounds[1] > 0
    assert nodes == 2 * len(out.schedule.overlay_nodes)


def test_an_installed_task_id_is_refused_before_anything_is_recorded(
    network: LoopbackNetwork, tmp_path: Path
) -> None:
    client: FakeController = network.client  # type: ignore[assignment]
    client.installed[4] = {"task_id": 4, "paths": []}

    with pytest.raises(ConfigError, match="task 4 is already installed"):
        run_attached(network, request(tmp_path, task_id=4))

    with sqlite3.connect(tmp_path / "results.db") as db:
        assert db.execute("SELECT count(*) FROM tasks").fetchone() == (0,)
    assert client.log == []


def test_a_task_the_scheduler_blocks_is_recorded_blocked_and_nothing_is_installed(
    network: LoopbackNetwork, tmp_path: Path
) -> None:
    client: FakeController = network.client  # type: ignore[assignment]
    plan = network.plan
    # Every link already carries more than it can: an earlier task reserved it all (emulated Mbit/s).
    full = [{"src": ln.a, "dst": ln.b, "sites": [ln.a, ln.b], "reserved_mbps": 2 * ln.emulated_mbps}
            for ln in plan.links] + [{"src": ln.b, "dst": ln.a, "sites": [ln.b, ln.a],
                                      "reserved_mbps": 2 * ln.emulated_mbps} for ln in plan.links]
    client.installed[1] = {"task_id": 1, "paths": full}

    with pytest.raises(ConfigError, match="cannot place task 2"):
        run_attached(network, request(tmp_path))

    with sqlite3.connect(tmp_path / "results.db") as db:
        assert db.execute("SELECT task_id, state FROM tasks").fetchall() == [(2, "blocked")]
    assert client.log == []
