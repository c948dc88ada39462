"""The switch datapath's priority (orchestrator.emulation.datapath_priority): which processes it
finds, what it records, and that a refusal is recorded and never raised."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation import datapath_priority as dp


def test_only_processes_named_ovs_vswitchd_are_found(tmp_path: Path) -> None:
    for pid, comm in ((10, "ovs-vswitchd"), (11, "monitor"), (12, "ovs-vswitchd-x"), (13, "ovsdb-server")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "comm").write_text(comm + "\n")
    (tmp_path / "self").mkdir()

    assert dp.daemon_pids(proc=tmp_path) == [10]


def test_the_record_says_when_no_daemon_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dp, "daemon_pids", lambda: [])
    info = type("Info", (), {})()

    record = dp.raise_datapath(info)

    assert record["applied"] is False and "no ovs-vswitchd" in record["note"]
    assert info.datapath_priority is record  # type: ignore[attr-defined]


def test_a_refused_raise_is_recorded_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_a: Any) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(dp, "daemon_pids", lambda: [os.getpid()])
    monkeypatch.setattr(os, "setpriority", refuse)

    record = dp.raise_datapath()

    assert record["applied"] is False
    assert "CAP_SYS_NICE" in record["note"] and "Permission denied" in record["note"]


@pytest.mark.skipif(os.geteuid() != 0, reason="raising a thread needs root")
def test_every_thread_of_the_process_is_set_and_read_back() -> None:
    """On this test process's own threads (a helper thread included): each is set and /proc says so."""
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    me = os.getpid()
    try:
        before = dp.set_threads_nice(me, -5)
        seen = {tid: dp.thread_sched(me, tid) for tid in dp.thread_ids(me)}
    finally:
        for tid, nice in before.items():
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        stop.set()

    assert helper.native_id in seen and threading.get_native_id() in seen
    assert set(seen.values()) == {(0, -5)}
