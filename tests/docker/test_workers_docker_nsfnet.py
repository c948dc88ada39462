"""NSFNET in Mininet with every host a worker container: an `mst` task with 8 local models runs
3 rounds end to end on the site servers, each in its site's container; a topology with awkward
site names and a user's model file (shipped by content, no image rebuild) run too; no container is
left afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.emulation.network import Emulation
from orchestrator.runtime.backends import (
    RUN_LABEL,
    docker_client,
    emulation_options,
    open_compute,
    remove_containers,
)
from orchestrator.runtime.summaries import missing_events, read_events
from orchestrator.runtime.task_runner import FLOptions, run_task
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.tasks import generate_tasks
from topologies.loaders import load
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow]


def test_nsfnet_mst_task_in_containers(tmp_path: Path) -> None:
    model = load("sndlib/nobel-us")
    plan = EmulationPlan.from_model(model)
    (task,) = generate_tasks(model, count=1, locals_per_task=8, seed=4, rounds=3)
    schedule = get_scheduler("mst").schedule(NetworkState(model), task)
    assert not schedule.blocked, schedule.reason
    client = docker_client()
    run_id = ""
    try:
        with Emulation(plan, log_dir=tmp_path / "emulation",
                       **emulation_options("docker", log_dir=tmp_path / "workers")) as emu:
            run_id = emu.run_id
            containers = client.containers.list(filters={"label": f"{RUN_LABEL}={run_id}"})
            assert len(containers) == len(plan.hosts), "every emulated host is a container"
            limits = {c.labels["org.netai.site"]: (c.attrs["HostConfig"]["NanoCpus"], c.attrs["HostConfig"]["Memory"],
                                                   c.attrs["HostConfig"]["MemorySwap"])
                      for c in containers}
            # a site's memory is its memory: no swap beyond it
            assert limits == {h.name: (int(h.cpu * 1e9), h.memory_mb * 2**20, h.memory_mb * 2**20) for h in plan.hosts}
            with open_compute("docker", emu, log_root=tmp_path / "workers") as manager:
                emu.install_task(schedule)
                log_dir = manager.task_dir("task")

                result = run_task(schedule, manager=manager, options=FLOptions(rounds=3, model="mlp"),
                                  log_dir=log_dir)

                ran_in = {s: client.api.exec_inspect(srv.proc.exec_id)["ContainerID"]
                          for s, srv in manager.servers.items()}
                expected = {h.site: manager.backend.container(h.site).id for h in plan.hosts}
                running = {s: srv.proc.poll() for s, srv in manager.servers.items()}
                emu.client.remove_task(task.id)
    finally:
        left = client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}) if run_id else []
        remove_containers(client, run_id=run_id or None)

    assert left == [], f"containers left after the emulation: {[c.name for c in left]}"
    assert ran_in == expected, "each site's server runs in its own site's container"
    assert set(running.values()) == {None}, "the servers outlive the task"
    events = {n: read_events(manager.events_file(log_dir, n)) for n in schedule.overlay_nodes}
    assert missing_events(schedule, events, rounds=3) == []
    assert [r.round for r in result.rounds] == [1, 2, 3]
    print("\nNSFNET/mst/8 locals in containers, per round: "
          + "; ".join(f"r{r.round} {r.latency_s * 1e3:.1f} ms (b {r.broadcast_s * 1e3:.1f}, t {r.train_s * 1e3:.1f}, "
                      f"u {r.upload_s * 1e3:.1f}) acc {r.accuracy:.3f}" for r in result.rounds))
    assert all(r.num_examples > 0 and r.stragglers == () for r in result.rounds)
    assert result.rounds[-1].accuracy > result.rounds[0].accuracy


def test_awkward_names_and_a_user_model_in_containers(tmp_path: Path) -> None:
    from tests.integration.test_workers_process import awkward_task

    plan, schedule, user = awkward_task(tmp_path)
    client = docker_client()
    run_id = ""
    try:
        with Emulation(plan, log_dir=tmp_path / "emulation",
                       **emulation_options("docker", log_dir=tmp_path / "workers")) as emu:
            run_id = emu.run_id
            with open_compute("docker", emu, log_root=tmp_path / "workers") as manager:
                emu.install_task(schedule)
                result = run_task(schedule, manager=manager, options=FLOptions(rounds=2, model=user),
                                  log_dir=manager.task_dir("task"))
                mounts = {m["Destination"] for c in client.containers.list(filters={"label": f"{RUN_LABEL}={run_id}"})
                          for m in c.attrs["Mounts"]}
    finally:
        remove_containers(client, run_id=run_id or None)

    assert [r.round for r in result.rounds] == [1, 2]
    assert result.model_bytes == (64 * 16 + 16 + 16 * 10 + 10) * 4, "the user's model was shipped and built"
    assert mounts == {"/netai/run", "/netai/ctl"}, "no bind mount of the user's paths"
