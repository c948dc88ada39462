"""A run that finds what a crashed or killed run of this machine left cleans it up before it starts, only
the project's own, and says what it removed (issue 48, `cleanup.clean_dead_runs`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation import cleanup, ctl_dirs
from orchestrator.emulation.cleanup import CleanReport, RunState, clear_the_way
from orchestrator.procs import proc_start_ticks


@pytest.fixture(autouse=True)
def _no_control_folders(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine's temporary folder is not the tests' (`tests/unit/test_ctl_dirs.py` covers it)."""
    monkeypatch.setattr(ctl_dirs, "remove_stale", lambda **_kw: [])


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_bring_up_cleans_the_dead_runs_and_leaves_the_live_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: one run whose owner is gone, one of this (live) process; a container of each
    dead = RunState(run_id="dead-1", owner_pid=_dead_pid(), owner_start_ticks=1)
    live = RunState(run_id="live-1", owner_pid=os.getpid(), owner_start_ticks=proc_start_ticks(os.getpid()))
    cleaned: list[str] = []
    removed: list[str] = []
    lines: list[str] = []

    def clean_run(state: RunState, *, report: CleanReport | None = None) -> CleanReport:
        cleaned.append(state.run_id)
        assert report is not None
        report.processes += [111, 112]
        return report

    monkeypatch.setattr(cleanup, "run_states", lambda: [dead, live])
    monkeypatch.setattr(cleanup, "clean_run", clean_run)
    monkeypatch.setattr(cleanup, "labelled_containers", lambda: {"c-dead": "dead-1", "c-live": "live-1"})
    monkeypatch.setattr(cleanup, "delete_containers", lambda ids: removed.extend(ids))
    monkeypatch.setattr(cleanup, "existing_interfaces", lambda names: [])

    # Execute
    held: dict[str, Any] = clear_the_way(["s1-eth1"], log=lines.append)

    # Assert: the dead run cleaned and said so; the live run and its container untouched
    assert held == {}
    assert cleaned == ["dead-1"] and removed == ["c-dead"]
    assert any("cleaning run dead-1: its process" in line for line in lines)
    assert any("removed 2 process(es)" in line and "1 container(s)" in line for line in lines)


def test_nothing_dead_nothing_done(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cleanup, "run_states", lambda: [])
    monkeypatch.setattr(cleanup, "labelled_containers", lambda: pytest.fail("no run to clean: no docker call"))

    report = cleanup.clean_dead_runs()

    assert report.nothing


def test_a_run_of_an_earlier_boot_is_dead_and_cleaned_whatever_has_its_pid_now(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a run cut off by a reboot; its owner's pid and start time are this live process's
    # (they name a process within one boot only); its state file outlived the reboot
    monkeypatch.setattr(cleanup, "STATE_DIR", tmp_path)
    me = os.getpid()
    earlier = RunState(run_id="before-reboot", owner_pid=me, owner_start_ticks=proc_start_ticks(me),
                       boot_id="an-earlier-boot")
    earlier.save()
    cleaned: list[str] = []
    monkeypatch.setattr(cleanup, "_clean_ids", lambda ids, report, **_kw: cleaned.extend(ids))
    monkeypatch.setattr(cleanup, "labelled_containers", lambda: {"c-old": "before-reboot"})
    monkeypatch.setattr(cleanup, "delete_containers", lambda ids: cleaned.extend(ids))
    lines: list[str] = []

    # Execute
    report = cleanup.clean_dead_runs(log=lines.append)

    # Assert: dead, its bridges and containers (what a reboot leaves) removed, its state file gone
    assert not earlier.live
    assert cleaned == ["before-reboot", "c-old"] and report.runs == ["before-reboot"]
    assert cleanup.run_states() == [] and any("cleaning run before-reboot" in line for line in lines)


def test_a_run_with_a_surviving_process_keeps_its_state_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a dead run one of whose processes outlives SIGKILL (stuck in the kernel)
    monkeypatch.setattr(cleanup, "STATE_DIR", tmp_path)
    stuck = RunState(run_id="stuck", owner_pid=_dead_pid(), owner_start_ticks=1)
    stuck.save()

    def clean_ids(ids: set[str], report: CleanReport, **_kw: Any) -> None:
        report.survivors.append(4242)

    monkeypatch.setattr(cleanup, "_clean_ids", clean_ids)

    # Execute
    report = cleanup.clean_run(stuck)

    # Assert: reported, and still known by its state file, so the next bring-up tries again
    assert report.survivors == [4242]
    assert [s.run_id for s in cleanup.run_states()] == ["stuck"]
    monkeypatch.setattr(cleanup, "_clean_ids", lambda ids, report, **_kw: None)
    cleanup.clean_run(stuck)
    assert cleanup.run_states() == []


def test_the_earlier_versions_state_files_are_read_and_removed_too(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: the default folder, and a live run's state file where earlier versions kept it
    here, legacy = tmp_path / "var", tmp_path / "run"
    monkeypatch.setattr(cleanup, "DEFAULT_STATE_DIR", here)
    monkeypatch.setattr(cleanup, "STATE_DIR", here)
    monkeypatch.setattr(cleanup, "LEGACY_STATE_DIR", legacy)
    legacy.mkdir()
    me = os.getpid()
    old = RunState(run_id="older", owner_pid=me, owner_start_ticks=proc_start_ticks(me))
    (legacy / "run-older.json").write_text(json.dumps({k: v for k, v in old.__dict__.items() if k != "boot_id"}))
    RunState(run_id="newer", owner_pid=me, owner_start_ticks=proc_start_ticks(me)).save()

    # Execute
    states = {s.run_id: s for s in cleanup.run_states()}

    # Assert: both known and live (a file without a boot is of this one); removal finds the old one
    assert set(states) == {"older", "newer"} and all(s.live for s in states.values())
    assert (here / "run-newer.json").is_file()
    states["older"].remove()
    assert not (legacy / "run-older.json").exists() and [s.run_id for s in cleanup.run_states()] == ["newer"]
