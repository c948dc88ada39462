"""NSFNET in Mininet with every host a worker container: an `mst` task with 8 local models runs
3 rounds end to end; every agent runs in its site's container; no container is left afterwards."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.emulation.network import Emulation
from orchestrator.runtime.backends import (
    RUN_LABEL,
    docker_client,
    emulation_options,
    open_backend,
    remove_containers,
)
from orchestrator.runtime.task_runner import FLOptions, missing_events, read_events, run_task
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
            limits = {c.labels["org.netai.site"]: (c.attrs["HostConfig"]["NanoCpus"], c.attrs["HostConfig"]["Memory"])
                      for c in containers}
            assert limits == {h.name: (int(h.cpu * 1e9), h.memory_mb * 2**20) for h in plan.hosts}
            backend = open_backend("docker", emu)
            emu.install_task(schedule)
            log_dir = backend.task_log_dir(tmp_path / "task")

            result = run_task(schedule, backend=backend, options=FLOptions(rounds=3, model="mlp"),
                              log_dir=log_dir)

            ran_in = {h.site: client.api.exec_inspect(h.exec_id)["ContainerID"] for h in backend.started}
            expected = {site: backend.container(site).id for site in schedule.overlay_nodes}
            exit_codes = {h.site: h.poll() for h in backend.started}
            backend.after_task(log_dir)
            emu.client.remove_task(task.id)
    finally:
        left = client.containers.list(all=True, filters={"label": f"{RUN_LABEL}={run_id}"}) if run_id else []
        remove_containers(client, run_id=run_id or None)

    assert left == [], f"containers left after the emulation: {[c.name for c in left]}"
    assert ran_in == expected, "each agent runs in its own site's container"
    assert set(exit_codes.values()) == {0}
    events = {n: read_events(log_dir / f"{n}.events.jsonl") for n in schedule.overlay_nodes}
    assert missing_events(schedule, events, rounds=3) == []
    assert [r.round for r in result.rounds] == [1, 2, 3]
    print("\nNSFNET/mst/8 locals in containers, per round: "
          + "; ".join(f"r{r.round} {r.latency_s * 1e3:.1f} ms (b {r.broadcast_s * 1e3:.1f}, t {r.train_s * 1e3:.1f}, "
                      f"u {r.upload_s * 1e3:.1f}) acc {r.accuracy:.3f}" for r in result.rounds))
    assert all(r.num_examples > 0 and r.stragglers == () for r in result.rounds)
    assert result.rounds[-1].accuracy > result.rounds[0].accuracy
