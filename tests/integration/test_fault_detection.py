"""Faults noticed within their stated timeouts, for real (issue 48; docs/long-runs.md, "Which
timeouts hold"): a controller killed while it starts, before the Mininet build; a site server
stopped (SIGSTOP) on the process and the docker backends; a site server killed by its container's
memory limit; a disk that fills while a run writes its results. Each test prints what it measured;
those of a timeout assert the time from the fault to its notice against the timeout plus 2 s, the
full disk its one line, a whole database and a resume to the run's end."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation import network
from orchestrator.emulation.controller_client import POLL_INTERVAL_S
from orchestrator.emulation.network import Emulation, EmulationError
from orchestrator.runtime import compute
from orchestrator.runtime.backends import emulation_options, open_compute
from tests.integration.test_emulation_teardown import NOTHING, leftovers
from tests.kill_campaign import netai, sim_leftovers
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root]

#: The issue's allowance over a fault's stated timeout.
GRACE_S = 2.0


def _model(memory_mb: int = 1024) -> NetworkModel:
    """A triangle of three sites of `memory_mb` each, joined by 100 Mbit/s links."""
    sites = [{"name": n, "memory_mb": memory_mb} for n in ("A", "B", "C")]
    links = [{"a": a, "b": b, "capacity_mbps": 100.0, "wavelengths": 1, "length_km": 100.0}
             for a, b in (("A", "B"), ("B", "C"), ("A", "C"))]
    return NetworkModel.build("fault-triangle", sites, links)


def _plan(memory_mb: int = 1024) -> EmulationPlan:
    return EmulationPlan.from_model(_model(memory_mb))


def test_a_controller_killed_while_it_starts_is_noticed_before_the_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, figures: list[str],
) -> None:
    # Prepare: the real controller, killed 0.3 s after its launch (its imports take longer: it dies
    # in its start-up); the bring-up's look at its process records when it first saw it gone; the
    # Mininet build records that it ran
    plan = _plan()
    killed_at: list[float] = []
    seen_at: list[float] = []
    built: list[str] = []
    timers: list[threading.Timer] = []
    real_start, real_exited = network.ControllerProcess.start, network.ControllerProcess.exited

    def start_then_die(self: Any) -> None:
        real_start(self)

        def kill() -> None:
            killed_at.append(time.monotonic())
            os.killpg(self.proc.pid, signal.SIGKILL)

        timers.append(threading.Timer(0.3, kill))
        timers[-1].start()

    def exited(self: Any) -> str | None:
        why = real_exited(self)
        if why is not None and not seen_at:
            seen_at.append(time.monotonic())
        return why

    real_build = Emulation._start_mininet

    def build(self: Emulation, **kw: Any) -> None:
        built.append("mininet")
        real_build(self, **kw)

    monkeypatch.setattr(network.ControllerProcess, "start", start_then_die)
    monkeypatch.setattr(network.ControllerProcess, "exited", exited)
    monkeypatch.setattr(Emulation, "_start_mininet", build)
    emu = Emulation(plan, log_dir=tmp_path / "emulation")

    # Execute
    try:
        with pytest.raises(EmulationError, match="controller exited with status -9") as got:
            emu.start()
        raised_at = time.monotonic()
    finally:
        for timer in timers:
            timer.cancel()
            timer.join()
        emu.stop()  # a bring-up that did not fail as it should is torn down here

    # Assert: seen gone within its poll (POLL_INTERVAL_S) plus the grace, before anything was built; nothing left
    assert killed_at and seen_at, "the controller was not killed during its start-up"
    noticed_s, raised_s = seen_at[0] - killed_at[0], raised_at - killed_at[0]
    figures.append(f"fault detection: a controller killed at start-up seen gone {noticed_s:.2f} s after the kill "
                   f"(its process looked at every {POLL_INTERVAL_S:g} s), the bring-up's error {raised_s:.2f} s after it (its "
                   f"teardown included), before the Mininet build")
    assert built == []
    assert noticed_s <= POLL_INTERVAL_S + GRACE_S, got.value
    assert leftovers(emu.run_id, plan) == NOTHING


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_a_stopped_site_server_is_lost_within_the_request_timeout(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, figures: list[str],
) -> None:
    # Prepare: real site servers on the emulation, their control requests timing out after 3 s
    # (REQUEST_TIMEOUT_S, 30 s in a run: the same code path, a shorter wait)
    timeout_s = 3.0
    monkeypatch.setattr(compute, "REQUEST_TIMEOUT_S", timeout_s)
    plan = _plan()
    with Emulation(plan, log_dir=tmp_path / "emulation", **emulation_options(kind, log_dir=tmp_path / "workers")) as emu, \
            open_compute(kind, emu, log_root=tmp_path / "workers") as cm:
        srv = cm.servers["B"]
        victim = int(getattr(srv.proc, "host_pid", None) or srv.pid)
        assert set(cm.poll()) == {"A", "B", "C"}

        # Execute: SIGSTOP, then the run's poll loop (every 0.05 s), bounded
        os.kill(victim, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            while "B" not in cm.lost and time.monotonic() - stopped_at < 4 * timeout_s:
                cm.poll()
                time.sleep(0.05)
            noticed_s = time.monotonic() - stopped_at
        finally:
            os.kill(victim, signal.SIGCONT)

        # Assert: lost, said to be stopped, within the timeout plus the grace; the others still answer
        figures.append(f"fault detection ({kind} backend): a site server stopped (SIGSTOP) lost {noticed_s:.2f} s "
                       f"later, against a request timeout of {timeout_s:g} s")
        assert f"its process {victim} is stopped (SIGSTOP" in cm.lost.get("B", ""), cm.lost
        assert noticed_s <= timeout_s + GRACE_S
        assert set(cm.poll()) == {"A", "C"}
    assert leftovers(emu.run_id, plan) == NOTHING


@pytest.mark.slow
@pytest.mark.docker
def test_a_site_server_killed_for_memory_is_reported_with_its_limit_and_peak(
    tmp_path: Path, figures: list[str],
) -> None:
    from orchestrator.runtime.memory import cgroup_memory, container_cgroup
    from orchestrator.runtime.task_runner import FLOptions, run_task
    from orchestrator.scheduling import NetworkState, get_scheduler
    from orchestrator.scheduling.tasks import generate_tasks

    # Prepare: sites of 400 MB, a task of a 65 MB model run past admission (which would refuse it);
    # a watcher reads the site containers' memory cgroups (their files, found once) every 10 ms for
    # the moment of the OOM kill
    limit_mb = 400
    model = _model(memory_mb=limit_mb)
    plan = EmulationPlan.from_model(model)
    (task,) = generate_tasks(model, count=1, locals_per_task=2, seed=1, rounds=2, demand_mbps=10)
    schedule = get_scheduler("spff").schedule(NetworkState(model), task)
    assert not schedule.blocked, schedule.reason
    with Emulation(plan, log_dir=tmp_path / "emulation", **emulation_options("docker", log_dir=tmp_path / "w")) as emu, \
            open_compute("docker", emu, log_root=tmp_path / "w") as cm:
        emu.install_task(schedule)
        oom_at: list[float] = []
        marked_at: list[float] = []
        done = threading.Event()
        mark_lost = cm._mark_lost

        def marking(srv: Any, why: str) -> None:
            mark_lost(srv, why)
            marked_at.append(time.monotonic())

        cm._mark_lost = marking  # type: ignore[method-assign]

        groups = [container_cgroup(srv.proc.host.container) for srv in cm.servers.values()]
        assert all(groups), groups

        def watch() -> None:
            while not done.is_set() and not oom_at:
                if any(cgroup_memory(g).oom_kills > 0 for g in groups if g is not None):
                    oom_at.append(time.monotonic())
                time.sleep(0.01)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()

        # Execute
        try:
            with pytest.raises(RuntimeError, match="its site server is gone") as got:
                run_task(schedule, manager=cm, options=FLOptions(rounds=2, model="mlp",
                                                                 model_args={"hidden": 4000, "layers": 2}),
                         log_dir=cm.task_dir("oom"))
            noticed = time.monotonic()
        finally:
            done.set()
            watcher.join()
        lost = dict(cm.lost)

    # Assert: reported as killed for memory, with the site's limit and its peak; the server found lost
    # within the status poll (0.05 s) plus the grace
    assert oom_at, f"no OOM kill seen in the sites' cgroups: {lost}"
    site, reason = next(iter(lost.items()))
    assert reason.startswith("killed for memory") and f"limit {limit_mb} MB" in reason and "peak" in reason, reason
    assert f"{site}: its site server is gone (killed for memory" in str(got.value)
    lost_s, failed_s = marked_at[0] - oom_at[0], noticed - oom_at[0]
    figures.append(f"fault detection (docker backend): a site server killed for memory found lost {lost_s:.2f} s "
                   f"after its cgroup's OOM kill, its task failed {failed_s:.2f} s after it: {site}: {reason}")
    assert lost_s <= 0.05 + GRACE_S, got.value
    assert leftovers(emu.run_id, plan) == NOTHING


SIM_CONFIG = """\
name: full-disk
engine: simulation
topology: sndlib/nobel-us
schedulers: [spff, mst]
locals: [2, 4]
tasks_per_point: 20
seed: 3
task: {model: mlp, rounds: 3}
simulation: {calibration: "a test's: the model's defaults"}
"""


@pytest.mark.slow
def test_a_disk_that_fills_while_results_are_written_gives_one_line_a_whole_database_and_a_resume(
    tmp_path: Path, figures: list[str],
) -> None:
    from orchestrator.results.durability import reap_all

    # Prepare: a real file system of 8 MB (tmpfs) for the run's folder, all but 1,000 KB of it taken
    # by a file: room for the run's start, not for its 80 task runs (a database of about 1 MB, and its
    # write-ahead log of up to 4.7 MB while the run writes)
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "netai-full-disk-test", str(disk)], check=True)
    try:
        config = tmp_path / "full.yaml"
        config.write_text(SIM_CONFIG)
        filler = disk / "filler"
        filler.write_bytes(b"\0" * (8 * 2**20 - 1000 * 2**10))

        # Execute: the run fills the disk; space freed; the run resumed
        full = _netai("experiment", str(config), "--out", str(disk), "--no-progress", "--no-figures")
        (run_dir,) = [d for d in disk.iterdir() if d.is_dir()]
        filler.unlink()
        conn = sqlite3.connect(run_dir / "results.db")
        try:
            integrity = conn.execute("PRAGMA integrity_check").fetchone()
            whole = conn.execute("SELECT count(*) FROM tasks WHERE complete = 1").fetchone()[0]
            half = conn.execute("SELECT count(*) FROM tasks WHERE complete = 0").fetchone()[0]
            reap_all(conn)  # what the next look at the database does: a run left running by a gone process
            marked = conn.execute("SELECT status, note FROM runs").fetchone()
            after = conn.execute("SELECT sum(complete = 1), sum(complete = 0) FROM tasks").fetchone()
        finally:
            conn.close()
        resumed = _netai("experiment", "--resume", str(run_dir), "--no-progress", "--no-figures")

        # Assert: one clear line and a non-zero exit; the database whole, the run marked (failed, or
        # found crashed where even that could not be written), no task half recorded; the resume
        # completes the run, every task run once
        errors = [ln for ln in full.stderr.splitlines() if ln.startswith("netai: error")]
        assert full.returncode == 1, full.stdout[-2000:] + full.stderr[-2000:]
        assert len(errors) == 1 and errors[0].startswith("netai: error: the disk is full"), full.stderr[-2000:]
        assert integrity == ("ok",)
        assert whole < 80, whole  # the disk filled before the run's end (the simulation seals its tasks at its end)
        assert (marked[0] in ("failed", "crashed") and "disk is full" in (marked[1] or "")) or marked[0] == "crashed", marked
        # the half-recorded task runs (those running when the disk filled) are discarded, the whole kept
        assert tuple(n or 0 for n in after) == (whole, 0), (whole, half, after)
        assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
        conn = sqlite3.connect(run_dir / "results.db")
        try:
            status = conn.execute("SELECT status FROM runs").fetchone()[0]
            done = conn.execute("SELECT count(*) FROM tasks WHERE complete = 1").fetchone()[0]
            twice = conn.execute("SELECT count(*) FROM (SELECT 1 FROM task_events WHERE state IN ('done', 'failed', "
                                 "'blocked') GROUP BY scheduler, task_id HAVING count(*) > 1)").fetchone()[0]
        finally:
            conn.close()
        figures.append(f"fault detection: a full disk (tmpfs, 1,000 KB free): exit 1 with {errors[0]!r}; "
                       f"{whole} of 80 task runs whole and {half} half recorded, the run {marked[0]} "
                       f"({(marked[1] or '')[:70]}); resumed to {status}, {done} task runs")
        assert sim_leftovers(disk) == []
        assert (status, done, twice) == ("completed", 80, 0)
    finally:
        if subprocess.run(["umount", str(disk)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(disk)], check=False)  # a process still in it: detached
        assert not os.path.ismount(disk)


def _netai(*args: str) -> subprocess.CompletedProcess[str]:
    """`netai` with `args` in a session of its own, its whole group killed if it outlives 300 s (its
    simulation engines included: they keep files open in the run's folder)."""
    proc = subprocess.Popen(netai(*args), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
