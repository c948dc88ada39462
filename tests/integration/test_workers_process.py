"""The process backend: site servers from the venv in plain Mininet hosts of the emulation."""

from __future__ import annotations

import itertools
import os
import time
from pathlib import Path

import pytest

from orchestrator.emulation.network import Emulation
from orchestrator.runtime.backends import emulation_options, open_compute
from orchestrator.runtime.summaries import missing_events, read_events
from orchestrator.runtime.task_runner import FLOptions, broadcast_lanes, run_task
from orchestrator.scheduling import NetworkState, Schedule, get_scheduler
from orchestrator.scheduling.tasks import generate_tasks
from topologies.loaders import load
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root, pytest.mark.slow]

AWKWARD_TOPOLOGY = """\
name: awkward
defaults: {wavelengths: 8, wavelength_mbps: 10000}
sites:
  - {name: Kansas City}
  - {name: São Paulo}
  - {name: "$(touch pwned);"}
  - {name: New York}
links:
  - {a: Kansas City, b: São Paulo, length_km: 100}
  - {a: São Paulo, b: "$(touch pwned);", length_km: 100}
  - {a: "$(touch pwned);", b: New York, length_km: 100}
  - {a: New York, b: Kansas City, length_km: 150}
"""

USER_MODEL = """\
from torch import nn


def make(*, input_shape, num_classes, width=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))
"""


@pytest.mark.parametrize("scheduler", ["spff", "mst"])
def test_task_runs_in_mininet_hosts(tmp_path: Path, scheduler: str) -> None:
    model = load("sndlib/nobel-us")
    plan = EmulationPlan.from_model(model)
    (task,) = generate_tasks(model, count=1, locals_per_task=4, seed=2, rounds=2)
    schedule = get_scheduler(scheduler).schedule(NetworkState(model), task)
    with Emulation(plan, log_dir=tmp_path / "emulation", **emulation_options("process", log_dir=tmp_path)) as emu, \
            open_compute("process", emu, log_root=tmp_path / "workers") as manager:
        emu.install_task(schedule)
        log_dir = manager.task_dir("task")
        # each server (forked from the warmed fork server) runs in its own host's network namespace
        for site, srv in manager.servers.items():
            host = emu.net.get(plan.host(site).name)
            assert os.stat(f"/proc/{srv.pid}/ns/net").st_ino == os.stat(f"/proc/{host.pid}/ns/net").st_ino, site
        assert len({os.stat(f"/proc/{srv.pid}/ns/net").st_ino for srv in manager.servers.values()}) == \
            len(manager.servers)

        result = run_task(schedule, manager=manager, options=FLOptions(rounds=2), log_dir=log_dir)

        # OVS refreshes OpenFlow counters about every second: read until two reads 1.2 s apart agree
        deadline, carried = time.monotonic() + 15, -1
        while (now := emu.client.task_bytes(task.id)) != carried and time.monotonic() < deadline:
            carried = now
            time.sleep(1.2)
    events = {n: read_events(manager.events_file(log_dir, n)) for n in schedule.overlay_nodes}
    ready = {n: next(e for e in ev if e["event"] == "ready") for n, ev in events.items()}
    assert missing_events(schedule, events, rounds=2) == []
    assert all(ready[n]["host"] == plan.host(n).ip for n in schedule.overlay_nodes), "roles bind the host IPs"
    assert carried > 2 * result.model_bytes, "the task's traffic took the task's flow entries"
    assert [r.round for r in result.rounds] == [1, 2] and result.rounds[-1].accuracy > 0.3
    assert result.connections_lost == 0, "children closing after their last update are not lost"
    # copies on a shared link go one after another: a lane's next copy starts after the last left whole
    lanes = {n: broadcast_lanes(schedule, n) for n in schedule.overlay_nodes}
    assert any(lanes.values()) == (scheduler == "spff"), lanes
    for n, node_lanes in lanes.items():
        at = {(e["event"], e["round"], e.get("peer")): e["t"] for e in events[n] if "round" in e}
        for lane in node_lanes:
            for r in (1, 2):
                for a, b in itertools.pairwise(lane):
                    assert at[("copy_sent", r, a)] <= at[("forward_first", r, b)], (n, r, a, b)


def awkward_task(tmp_path: Path) -> tuple[EmulationPlan, Schedule, str]:
    """The awkward topology's plan, an mst schedule of 3 locals on it, and a user model file's spec."""
    topo = tmp_path / "awkward.yaml"
    topo.write_text(AWKWARD_TOPOLOGY, encoding="utf-8")
    user = tmp_path / "user models" / "tiny.py"
    user.parent.mkdir()
    user.write_text(USER_MODEL)
    model = load(str(topo))
    (task,) = generate_tasks(model, count=1, locals_per_task=3, seed=1, rounds=2)
    return EmulationPlan.from_model(model), get_scheduler("mst").schedule(NetworkState(model), task), f"{user}:make"


def test_awkward_site_names_and_a_user_model_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    plan, schedule, user = awkward_task(tmp_path)
    with Emulation(plan, log_dir=tmp_path / "emulation") as emu, \
            open_compute("process", emu, log_root=tmp_path / "workers") as manager:
        emu.install_task(schedule)
        result = run_task(schedule, manager=manager, options=FLOptions(rounds=2, model=user),
                          log_dir=manager.task_dir("task"))

    assert [r.round for r in result.rounds] == [1, 2]
    assert result.model_bytes == (64 * 16 + 16 + 16 * 10 + 10) * 4, "the user's model was shipped and built"
    assert not any(p.name == "pwned" for p in tmp_path.rglob("pwned")) and not Path("/pwned").exists()
