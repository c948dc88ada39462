"""The site servers' control-socket folders say whose they are, and those of processes that are gone are
removed by the next run or ``netai clean`` (`orchestrator.emulation.ctl_dirs`, issue 48's leftovers)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from orchestrator.emulation import cleanup, ctl_dirs
from orchestrator.emulation.procs import proc_start_ticks
from orchestrator.runtime.forked import new_ctl_dir


def _gone_process() -> tuple[int, int]:
    """(pid, start ticks) of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.05)"])
    ticks = proc_start_ticks(proc.pid)
    proc.wait()
    assert ticks is not None
    return proc.pid, ticks


def test_a_new_control_folder_names_this_process_and_is_not_stale(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    # Execute
    made = new_ctl_dir()

    # Assert: owned by this process, private, short enough for a socket path, and left alone
    assert made.parent == tmp_path
    assert ctl_dirs.owner(made.name) == (os.getpid(), proc_start_ticks(os.getpid()))
    assert made.stat().st_mode & 0o777 == 0o700
    assert ctl_dirs.stale(tmp_path) == []


def test_only_the_folders_of_processes_that_are_gone_are_removed(tmp_path: Path) -> None:
    # Prepare: a folder of a process that exited, one of a reused pid (this process, another start
    # time), one of this process, one of the earlier form, and a file with the prefix
    pid, ticks = _gone_process()
    gone = tmp_path / f"{ctl_dirs.prefix_for(pid, ticks)}abc"
    reused = tmp_path / f"{ctl_dirs.prefix_for(os.getpid(), 1)}def"
    mine = ctl_dirs.make(tmp_path)
    earlier = tmp_path / "netai-ctl-k3j4h5g6"
    for folder in (gone, reused, earlier):
        folder.mkdir()
    (gone / "h1.sock").write_text("")
    (tmp_path / f"{ctl_dirs.prefix_for(pid, ticks)}file").write_text("")
    lines: list[str] = []

    # Execute
    removed = ctl_dirs.remove_stale(log=lines.append, root=tmp_path)

    # Assert
    assert sorted(removed) == sorted([str(gone), str(reused)])
    assert not gone.exists() and not reused.exists()
    assert mine.is_dir() and earlier.is_dir() and (tmp_path / f"{ctl_dirs.prefix_for(pid, ticks)}file").exists()
    assert lines == ["removed 2 control-socket folder(s) of processes that are gone"]


def test_names_that_do_not_say_their_owner_are_not_owned() -> None:
    assert ctl_dirs.owner("netai-ctl-0124cd7x") is None
    assert ctl_dirs.owner("netai-ctl-12.34") is None
    assert ctl_dirs.owner("other-12.34-abc") is None
    assert ctl_dirs.owner("netai-ctl-12.34-abc") == (12, 34)


def test_a_bring_up_removes_the_folders_a_killed_run_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: no dead run state, one control folder of a process that is gone
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(cleanup, "run_states", lambda: [])
    pid, ticks = _gone_process()
    gone = tmp_path / f"{ctl_dirs.prefix_for(pid, ticks)}abc"
    gone.mkdir()
    lines: list[str] = []

    # Execute
    report = cleanup.clean_dead_runs(log=lines.append)

    # Assert: removed, and said so
    assert report.folders == [str(gone)] and not gone.exists()
    assert any("control-socket folder" in line for line in lines)
