"""A site's memory as a resource (issue 48, `orchestrator.runtime.memory`): a server killed for memory
reported with its site, limit and peak; admission refusing a task a site cannot hold, in one line."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import parse_config
from orchestrator.experiment.runs import check_memory
from orchestrator.lifecycle import states as st
from orchestrator.runtime import memory
from orchestrator.runtime.backends import ExecHandle
from orchestrator.runtime.compute import ComputeManager
from orchestrator.scheduling import NetworkState
from orchestrator.scheduling import memory as need
from tests.unit.lifecycle_fakes import make_rig, small_ring
from topologies.loaders import load

MB = 2**20


def _v2(tmp_path: Path, *, limit: str = "1073741824", peak: int = 1_070_000_000, oom: int = 1) -> Path:
    d = tmp_path / "cg2"
    d.mkdir()
    (d / "memory.max").write_text(limit + "\n")
    (d / "memory.peak").write_text(f"{peak}\n")
    (d / "memory.events").write_text(f"low 0\nhigh 0\nmax 12\noom 1\noom_kill {oom}\n")
    return d


def test_a_v2_cgroup_gives_its_limit_peak_and_oom_kills(tmp_path: Path) -> None:
    assert memory.cgroup_memory(_v2(tmp_path)) == memory.CgroupMemory(1024 * MB, 1_070_000_000, 1)


def test_a_v1_cgroup_gives_the_same_and_no_limit_as_none(tmp_path: Path) -> None:
    d = tmp_path / "cg1"
    d.mkdir()
    (d / "memory.limit_in_bytes").write_text(f"{2**63 - 4096}\n")
    (d / "memory.max_usage_in_bytes").write_text("5000\n")
    (d / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n")

    assert memory.cgroup_memory(d) == memory.CgroupMemory(None, 5000, 0)


def test_a_process_memory_cgroup_is_v1s_when_it_has_one(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    (proc / "7").mkdir(parents=True)
    (proc / "7" / "cgroup").write_text("4:memory:/docker/abc\n1:cpu:/\n0::/system.slice/x.scope\n")
    (proc / "8").mkdir()
    (proc / "8" / "cgroup").write_text("0::/system.slice/docker-abc.scope\n")

    assert memory.cgroup_dir(7, proc=proc, root=Path("/cg")) == Path("/cg/memory/docker/abc")
    assert memory.cgroup_dir(8, proc=proc, root=Path("/cg")) == Path("/cg/system.slice/docker-abc.scope")
    assert memory.cgroup_dir(9, proc=proc, root=Path("/cg")) is None


def test_a_server_killed_for_memory_says_so_with_site_limit_and_peak(tmp_path: Path) -> None:
    got = memory.lost_reason("Gdansk", 137, memory.cgroup_memory(_v2(tmp_path)))

    assert got == ("killed for memory: site Gdansk ran out of its memory (limit 1024 MB, peak 1020 MB; the "
                   "kernel's OOM killer, exit status 137)")


def test_a_137_without_an_oom_kill_is_not_called_memory(tmp_path: Path) -> None:
    got = memory.lost_reason("Gdansk", 137, memory.cgroup_memory(_v2(tmp_path, oom=0)), peak_rss_bytes=900 * MB)

    assert got.startswith("exited with status 137 (SIGKILL: the kernel's OOM killer or a kill; limit 1024 MB, "
                          "peak 1020 MB")
    assert memory.lost_reason("x", 1, None) == "exited with status 1"


def test_the_docker_handle_reads_its_containers_cgroup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a container whose init process is in a cgroup that counted an OOM kill
    cg = _v2(tmp_path)
    container = SimpleNamespace(attrs={"State": {"Pid": 4242}}, reload=lambda: None)
    handle = ExecHandle(SimpleNamespace(container=container, memory_mb=1024), "exec-1")
    monkeypatch.setattr(memory, "cgroup_dir", lambda pid: cg if pid == 4242 else None)

    # Execute
    got = handle.memory()

    # Assert
    assert got == memory.CgroupMemory(1024 * MB, 1_070_000_000, 1)
    assert handle.memory_mb == 1024


def test_the_manager_reports_a_lost_server_with_its_memory(tmp_path: Path) -> None:
    # Prepare: a server handle that exited 137 in a cgroup that counted an OOM kill
    cg = memory.cgroup_memory(_v2(tmp_path))
    srv = SimpleNamespace(site="Gdansk", proc=SimpleNamespace(memory=lambda: cg, memory_mb=1024))
    manager: Any = SimpleNamespace(peak_rss={"Gdansk": 1_000 * MB})

    # Execute
    why = ComputeManager._exit_reason(manager, srv, 137)  # type: ignore[arg-type]

    # Assert
    assert why.startswith("killed for memory: site Gdansk")


def test_admission_blocks_a_task_whose_site_lacks_the_memory(tmp_path: Path) -> None:
    # Prepare: a model of 200 MB: G needs about 230 + 96 + 12 x 200 MB, more than 1024 MB
    rig = make_rig(tmp_path, model=small_ring())
    task = rig.task(1, ["r2", "r3"])
    big = type(task)(**{**task.__dict__, "model_bytes": 200 * MB})

    # Execute
    live = rig.start("spff", big, NetworkState(rig.model))

    # Assert
    assert live.status == st.BLOCKED
    assert live.reason.startswith("site r1 has 1024 MB of memory; its server and global role(s) need about 2726 MB")


def test_a_run_is_refused_before_it_starts_when_a_site_cannot_hold_a_task() -> None:
    cfg = parse_config({"name": "big", "topology": "triangle", "schedulers": ["spff"], "locals": [2],
                        "tasks_per_point": 1})

    with pytest.raises(ConfigError, match=r"cannot run: site \S+ has 1024 MB of memory; its server and local"):
        check_memory(cfg, load("triangle"), 200 * MB)
    check_memory(cfg, load("triangle"), 10 * MB)  # fits: no error


def test_a_sites_need_counts_its_server_once_and_each_role() -> None:
    roles = need.roles_by_site("a", ["a", "b"], ["a", "b", "c"])

    assert roles == {"a": ["global", "local"], "b": ["local"], "c": ["relay"]}
    assert need.site_need_bytes(roles["a"], MB) == need.SERVER_BASE_BYTES + 2 * need.ROLE_BASE_BYTES + 24 * MB
    assert need.site_need_bytes(roles["c"], MB) == need.SERVER_BASE_BYTES + need.ROLE_BASE_BYTES + 12 * MB


def test_a_stopped_server_is_lost_at_its_request_timeout_and_said_to_be_stopped() -> None:
    import signal
    import socket
    import subprocess
    import threading

    from orchestrator.runtime.compute import ServerLost, _Server

    # Prepare: a server process stopped with SIGSTOP, whose control connection answers nothing
    child = subprocess.Popen(["sleep", "30"])
    os.kill(child.pid, signal.SIGSTOP)
    ours, theirs = socket.socketpair()
    ours.settimeout(0.2)  # the request timeout (REQUEST_TIMEOUT_S in a run)
    manager: Any = ComputeManager.__new__(ComputeManager)
    manager.lost, manager.peak_rss, manager._lock = {}, {}, threading.Lock()
    manager.servers = {"Gdansk": _Server(site="Gdansk", proc=SimpleNamespace(poll=lambda: None), sock_path=Path("x"),
                                         conn=ours, pid=child.pid)}
    try:
        # Execute
        with pytest.raises(ServerLost) as got:
            manager._request("Gdansk", {"op": "status"})
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        theirs.close()

    # Assert
    assert "Gdansk" in manager.lost
    assert f"its process {child.pid} is stopped (SIGSTOP" in str(got.value)


# -- real site servers on loopback: the admission's bound holds, and nothing piles up -----------------------
@pytest.mark.slow
def test_real_servers_stay_within_the_admissions_bound_and_free_each_tasks_memory(tmp_path: Path) -> None:
    from tests.site_memory import relay_tree, run_tasks

    # Prepare: a ~10 MB model, the same relay tree three times (a relay with three children).
    model_args = {"hidden": 1600}

    # Execute
    base, model_bytes, tasks = run_tasks(tmp_path, [relay_tree(i) for i in (1, 2, 3)], model="large",
                                          model_args=model_args, rounds=2)

    # Assert: every site's peak within what admission counts for its roles (its server and the copies)
    assert model_bytes > 8 * MB
    for t in tasks:
        for site, roles in t.roles.items():
            assert t.peak_bytes[site] <= need.site_need_bytes(roles, model_bytes), \
                (site, roles, t.peak_bytes[site], "own memory", base[site])
    # an ended task's memory is given back: the same task again leaves the servers about where the first
    # did (before the roles were released, the servers grew by a mean of 11.8 copies of the model over
    # these three tasks; with a heap per thread, up to 16 on two cores, by up to 7 copies a server, and
    # a CI run's local peaked past admission's bound; with the two heaps `workers.learning` sets, by
    # at most 2)
    first, last = tasks[0].after_bytes, tasks[-1].after_bytes
    grown = {s: (last[s] - first[s]) / model_bytes for s in first}
    assert sum(grown.values()) / len(grown) <= 3.0, grown
