"""A run that finds what a crashed or killed run of this machine left cleans it up before it starts, only
the project's own, and says what it removed (issue 48, `cleanup.clean_dead_runs`)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from orchestrator.emulation import cleanup
from orchestrator.emulation.cleanup import CleanReport, RunState, clear_the_way, proc_start_ticks


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
