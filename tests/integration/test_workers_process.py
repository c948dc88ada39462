"""The process backend: agents from the venv in plain Mininet hosts of the emulation."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.emulation.network import Emulation
from orchestrator.runtime.backends import emulation_options, open_backend
from orchestrator.runtime.task_runner import FLOptions, missing_events, read_events, run_task
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.tasks import generate_tasks
from topologies.loaders import load
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root, pytest.mark.slow]


@pytest.mark.parametrize("scheduler", ["spff", "mst"])
def test_task_runs_in_mininet_hosts(tmp_path: Path, scheduler: str) -> None:
    model = load("sndlib/nobel-us")
    plan = EmulationPlan.from_model(model)
    (task,) = generate_tasks(model, count=1, locals_per_task=4, seed=2, rounds=2)
    schedule = get_scheduler(scheduler).schedule(NetworkState(model), task)
    with Emulation(plan, log_dir=tmp_path / "emulation", **emulation_options("process", log_dir=tmp_path)) as emu:
        backend = open_backend("process", emu)
        emu.install_task(schedule)
        log_dir = backend.task_log_dir(tmp_path / "task")

        result = run_task(schedule, backend=backend, options=FLOptions(rounds=2), log_dir=log_dir)

        # OVS refreshes OpenFlow counters about every second: poll, bounded
        deadline = time.monotonic() + 10
        while (carried := emu.client.task_bytes(task.id)) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
    events = {n: read_events(log_dir / f"{n}.events.jsonl") for n in schedule.overlay_nodes}
    ready = {n: next(e for e in ev if e["event"] == "ready") for n, ev in events.items()}
    assert missing_events(schedule, events, rounds=2) == []
    assert all(ready[n]["host"] == plan.host(n).ip for n in schedule.overlay_nodes), "agents bind the host IPs"
    assert carried > 2 * result.model_bytes, "the task's traffic took the task's flow entries"
    assert [r.round for r in result.rounds] == [1, 2] and result.rounds[-1].accuracy > 0.3
