"""The site servers' control-socket folders say whose they are, and those of processes that are gone are
removed by the next run or ``netai clean`` (`orchestrator.emulation.ctl_dirs`, issue 48's leftovers)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from orchestrator.emulation import cleanup, ctl_dirs
from orchestrator.procs import proc_start_ticks
from orchestrator.runtime.forked import new_ctl_dir

BOOT = "0123abcd"


def test_a_new_control_folder_names_this_process_and_is_not_stale(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    # Execute
    made = new_ctl_dir()

    # Assert: owned by this process of this boot, and left alone
    assert made.parent == tmp_path
    assert ctl_dirs.owner(made.name) == (ctl_dirs.boot_tag(), os.getpid(), proc_start_ticks(os.getpid()))
    assert ctl_dirs.stale(tmp_path) == []


def test_a_process_whose_start_cannot_be_read_makes_a_folder_no_one_removes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: this process's start unknown (a /proc of another PID namespace, say)
    monkeypatch.setattr(ctl_dirs, "proc_start_ticks", lambda pid: None)

    # Execute
    made = ctl_dirs.make(tmp_path)

    # Assert: the earlier form, which says no owner, so it is never taken for a dead one's
    assert made.name.startswith(ctl_dirs.PREFIX) and ctl_dirs.owner(made.name) is None
    assert ctl_dirs.stale(tmp_path, alive=lambda pid, ticks: False, boot=BOOT) == []


def test_only_this_boot_s_folders_of_processes_that_are_gone_are_stale(tmp_path: Path) -> None:
    # Prepare: folders of a gone process, of a live one, of another boot (or machine), of the
    # earlier form, and a file with the prefix; `alive` says which processes run
    gone = tmp_path / f"{ctl_dirs.prefix_for(BOOT, 41, 7)}abc"
    live = tmp_path / f"{ctl_dirs.prefix_for(BOOT, 42, 7)}def"
    reused = tmp_path / f"{ctl_dirs.prefix_for(BOOT, 42, 8)}ghi"  # pid 42 now runs, started at 7
    other_boot = tmp_path / f"{ctl_dirs.prefix_for('ffffffff', 41, 7)}jkl"
    earlier = tmp_path / "netai-ctl-k3j4h5g6"
    for folder in (gone, live, reused, other_boot, earlier):
        folder.mkdir()
    (tmp_path / f"{ctl_dirs.prefix_for(BOOT, 41, 7)}file").write_text("")

    # Execute
    found = ctl_dirs.stale(tmp_path, alive=lambda pid, ticks: (pid, ticks) == (42, 7), boot=BOOT)

    # Assert
    assert found == [gone, reused]


def test_remove_stale_removes_and_reports_only_what_it_removed(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: two stale folders, one of which cannot be removed
    kept, removed = tmp_path / "a", tmp_path / "b"
    for folder in (kept, removed):
        folder.mkdir()
    (removed / "h1.sock").write_text("")
    monkeypatch.setattr(ctl_dirs, "stale", lambda root=None: [kept, removed])
    real_rmtree = ctl_dirs.shutil.rmtree
    monkeypatch.setattr(ctl_dirs.shutil, "rmtree",
                        lambda path, ignore_errors=False: None if path == kept else real_rmtree(path))
    lines: list[str] = []

    # Execute
    out = ctl_dirs.remove_stale(log=lines.append, root=tmp_path)

    # Assert
    assert out == [str(removed)] and kept.is_dir() and not removed.exists()
    assert lines == ["removed 1 control-socket folder(s) of processes that are gone"]


def test_names_that_do_not_say_their_owner_are_not_owned() -> None:
    assert ctl_dirs.owner("netai-ctl-0124cd7x") is None
    assert ctl_dirs.owner("netai-ctl-12.34-abc") is None
    assert ctl_dirs.owner("other-0123abcd.12.34-abc") is None
    assert ctl_dirs.owner("netai-ctl-0123abcd.12.34-abc") == ("0123abcd", 12, 34)


def test_a_bring_up_removes_the_folders_a_killed_run_left(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: no dead run state, one control folder of a process of this boot that is gone
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(cleanup, "run_states", lambda: [])
    boot = ctl_dirs.boot_tag()
    assert boot is not None
    gone = tmp_path / f"{ctl_dirs.prefix_for(boot, 2**22 + 1, 1)}abc"  # above any pid_max: never a process
    gone.mkdir()
    lines: list[str] = []

    # Execute
    report = cleanup.clean_dead_runs(log=lines.append)

    # Assert: removed, and said so
    assert report.control_folders == [str(gone)] and not gone.exists() and not report.nothing
    assert any("control-socket folder" in line for line in lines)
