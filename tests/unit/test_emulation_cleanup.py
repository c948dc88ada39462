"""Run marks and cleanup helpers, on the test's own child processes (no root, no Mininet)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.emulation import cleanup, ctl_dirs
from orchestrator.emulation.cleanup import (
    ENV_RUN,
    RunState,
    kill_pids,
    marked_processes,
    process_run_id,
)
from orchestrator.procs import proc_start_ticks, process_alive


@pytest.fixture
def marked_child() -> Iterator[subprocess.Popen[bytes]]:
    env = {**os.environ, ENV_RUN: "unit-test-run"}
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    # Popen returns once the child's exec has begun (vfork), which can be before the kernel has set up the
    # new environment's address range: /proc/PID/environ reads empty for that moment. Wait it out.
    deadline = time.monotonic() + 10
    while process_run_id(child.pid) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    yield child
    if child.poll() is None:
        child.kill()
    child.wait()


def test_a_child_carries_the_run_mark_and_is_found_by_it(marked_child: subprocess.Popen[bytes]) -> None:
    found = marked_processes({"unit-test-run"})
    other = marked_processes({"some-other-run"})

    assert process_run_id(marked_child.pid) == "unit-test-run"
    assert found == {marked_child.pid: "unit-test-run"}
    assert marked_child.pid not in other
    assert process_run_id(os.getpid()) != "unit-test-run"


def test_kill_pids_stops_the_process_and_start_time_guards_pid_reuse(marked_child: subprocess.Popen[bytes]) -> None:
    ticks = proc_start_ticks(marked_child.pid)

    survivors = kill_pids([marked_child.pid])
    marked_child.wait()

    assert ticks is not None
    assert survivors == []
    assert not process_alive(marked_child.pid, ticks)
    assert not process_alive(os.getpid(), (proc_start_ticks(os.getpid()) or 0) + 1)
    assert process_alive(os.getpid(), proc_start_ticks(os.getpid()))


def test_run_state_round_trips_and_knows_whether_its_owner_lives(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cleanup, "STATE_DIR", tmp_path)
    live = RunState("live-run", os.getpid(), proc_start_ticks(os.getpid()), interfaces=["s1-eth1"])
    dead = RunState("dead-run", os.getpid(), -1)
    live.save()
    dead.save()

    states = {s.run_id: s for s in cleanup.run_states()}

    assert set(states) == {"live-run", "dead-run"}
    assert states["live-run"].interfaces == ["s1-eth1"]
    assert states["live-run"].live and not states["dead-run"].live
    states["dead-run"].remove()
    assert [s.run_id for s in cleanup.run_states()] == ["live-run"]


def test_interfaces_are_found_by_their_alias_mark_and_odd_names_are_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, alias in (("s1-eth2", "netai-run=run-a\n"), ("s2-eth1", "netai-run=run-b\n"),
                        ("eth0", "uplink\n"), ("s3-eth1", "\n"), ("s4-eth1", "netai-run=\n")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ifalias").write_text(alias)
    (tmp_path / "lo").mkdir()  # no ifalias file
    monkeypatch.setattr(cleanup, "SYS_NET", tmp_path)

    assert cleanup.marked_interfaces() == {"s1-eth2": "run-a", "s2-eth1": "run-b"}
    monkeypatch.setattr(cleanup, "existing_interfaces", lambda names: list(names))
    with pytest.raises(ValueError, match="not an interface name or run id"):
        cleanup.mark_interfaces(["s1-eth2", "x y"], "run-a")
    with pytest.raises(ValueError, match="not an interface name or run id"):
        cleanup.mark_interfaces(["s1-eth2"], "run-a\nlink del eth0")


def _fake_system(monkeypatch: pytest.MonkeyPatch, *, marks: dict[str, str], attached: set[str] | None,
                 procs: dict[int, str] | None = None) -> list[str]:
    deleted: list[str] = []
    monkeypatch.setattr(cleanup, "marked_processes", lambda run_ids=None: {
        p: r for p, r in (procs or {}).items() if run_ids is None or r in run_ids})
    monkeypatch.setattr(cleanup, "kill_pids", lambda pids, **_: [])
    monkeypatch.setattr(cleanup, "tagged_bridges", dict)
    monkeypatch.setattr(cleanup, "delete_bridges", lambda names: None)
    monkeypatch.setattr(cleanup, "ovs_port_names", lambda: attached)
    monkeypatch.setattr(cleanup, "marked_interfaces", lambda: dict(marks))
    monkeypatch.setattr(cleanup, "existing_interfaces", lambda names: list(names))
    monkeypatch.setattr(cleanup, "delete_interfaces", deleted.extend)
    monkeypatch.setattr(cleanup, "underlay_runs", list)
    monkeypatch.setattr(cleanup, "delete_underlay", lambda rid: False)
    monkeypatch.setattr(cleanup, "labelled_containers", dict)
    monkeypatch.setattr(cleanup, "delete_stale_probes", lambda netns_dir: ["netai-probe-4545"])
    monkeypatch.setattr(ctl_dirs, "remove_stale", lambda **_kw: [])  # not this machine's temporary folder
    return deleted


def test_a_dead_run_s_names_are_not_deleted_when_another_run_marks_them_or_ovs_cannot_say(
        monkeypatch: pytest.MonkeyPatch) -> None:
    marks = {"s1-eth2": "other-run", "s3-eth1": "dead-run"}
    deleted = _fake_system(monkeypatch, marks=marks, attached={"s2-eth1"})
    report = cleanup.CleanReport()
    cleanup._clean_ids({"dead-run"}, report, interfaces=["s1-eth1", "s1-eth2", "s2-eth1"])
    # unmarked and unattached: the dead run's; s1-eth2 carries another run's mark; s2-eth1 is on a bridge
    assert deleted == ["s1-eth1", "s3-eth1"] and report.interfaces == deleted

    deleted = _fake_system(monkeypatch, marks=marks, attached=None)
    cleanup._clean_ids({"dead-run"}, cleanup.CleanReport(), interfaces=["s1-eth1"])
    assert deleted == []


def test_clean_reads_live_runs_again_after_the_marks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A run that writes its state file while clean() runs (it then makes its marked processes) is live,
    # not an orphan: its processes are left alone.
    me = RunState(run_id="starting", owner_pid=os.getpid(), owner_start_ticks=proc_start_ticks(os.getpid()))
    calls = [0]

    def states() -> list[RunState]:
        calls[0] += 1
        return [] if calls[0] == 1 else [me]

    _fake_system(monkeypatch, marks={}, attached=set(), procs={4242: "starting", 4343: "crashed"})
    killed: list[int] = []
    monkeypatch.setattr(cleanup, "kill_pids", lambda pids, **_: killed.extend(pids) or [])
    monkeypatch.setattr(cleanup, "run_states", states)
    report = cleanup.clean()
    assert killed == [4343] and report.runs == ["crashed"]


def test_clean_removes_the_far_run_folders_of_runs_not_live_here(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A machine that ran site servers for another machine's runs (left by a run whose machine was lost):
    # the folder of a run not live here goes, a live run's stays, and nothing outside the runs folder.
    monkeypatch.setenv("HOME", str(tmp_path))
    runs = tmp_path / cleanup.FAR_RUNS
    for name in ("lost-run", "live-run"):
        (runs / name / "workers" / "tasks").mkdir(parents=True)
        (runs / name / "workers" / "tasks" / "r2.events.jsonl").write_text("{}\n")
    (tmp_path / ".netai" / "deploy").mkdir()
    me = RunState(run_id="live-run", owner_pid=os.getpid(), owner_start_ticks=proc_start_ticks(os.getpid()))
    _fake_system(monkeypatch, marks={}, attached=set(), procs={})
    monkeypatch.setattr(cleanup, "run_states", lambda: [me])

    report = cleanup.clean()

    assert report.folders == [str(runs / "lost-run")] and not report.nothing
    assert report.interfaces == ["netns netai-probe-4545"]  # a kernel probe's namespace whose process is gone
    assert sorted(p.name for p in runs.iterdir()) == ["live-run"]
    assert (tmp_path / ".netai" / "deploy").is_dir()
    assert cleanup.far_run_folders(tmp_path / "elsewhere") == {}


def test_a_kernel_probes_namespace_is_deleted_once_its_process_is_gone(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.emulation import kernel

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stuck = dead.pid + 4_000_000  # beyond pid_max: no process; `ip` fails to delete it
    for name in (f"netai-probe-{dead.pid}", f"netai-probe-{os.getpid()}", "netai-probe-x", "netai-probe-\u0663",
                 "netai-ul-run1", f"netai-probe-{stuck}"):
        (tmp_path / name).touch()
    ran: list[list[str]] = []

    def run(argv: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        ran.append(argv)
        return subprocess.CompletedProcess(argv, 1 if argv[-1].endswith(str(stuck)) else 0)

    monkeypatch.setattr(kernel.subprocess, "run", run)

    gone = kernel.delete_stale_probes(tmp_path)

    # not a live process's, nor a name that is not a probe's, nor one `ip` failed to delete
    assert gone == [f"netai-probe-{dead.pid}"]
    assert sorted(ran) == sorted([["ip", "netns", "del", f"netai-probe-{dead.pid}"],
                                  ["ip", "netns", "del", f"netai-probe-{stuck}"]])
    assert kernel.delete_stale_probes(tmp_path / "missing") == []
