"""Ending a process of ours: SIGTERM, a grace period, then SIGKILL (`orchestrator.emulation.cluster.end_process`),
and the handles that stop their processes that way (a local site server, a far one's ssh and forward, the
controller's forwards to far machines), plus `ForkedHandle.stop`, which does the same through the fork server.
Every child is a real process; none outlives its test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

import orchestrator.runtime.forked as forked
from orchestrator.emulation.cluster import LOCAL, ClusterServer, ClusterSpec, end_process
from orchestrator.emulation.cluster_far import FarSide
from orchestrator.runtime.backends import ProcessHandle
from orchestrator.runtime.far_servers import FarHandle
from orchestrator.runtime.forked import ForkedHandle, ForkServerClient

#: A short grace period: a child that ignores SIGTERM costs the test this long, twice at most.
GRACE_S = 0.3
FAR = ClusterServer(name="root@10.9.0.2:22", user="root", host="10.9.0.2", key="/k", known_hosts="/kh",
                    sites=("r2",))

#: How each kind of child answers SIGTERM. Each prints ``ready`` once its disposition is set.
CHILDREN = {
    # SIG_IGN survives exec: a real `sleep` that only SIGKILL ends.
    "ignores": ["sh", "-c", "trap '' TERM; echo ready; exec sleep 60"],
    # A handler that exits with its own status.
    "exits 3": [sys.executable, "-c", "import signal, sys, time\n"
                "signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))\n"
                "print('ready', flush=True)\ntime.sleep(60)"],
    # The default disposition: SIGTERM ends it.
    "default": ["sh", "-c", "echo ready; exec sleep 60"],
}


@pytest.fixture
def child() -> Iterator[Any]:
    """Start children by kind (`CHILDREN`), each ready when returned; SIGKILL and reap any left at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(kind: str) -> subprocess.Popen[bytes]:
        proc = subprocess.Popen(CHILDREN[kind], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        started.append(proc)
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.parametrize(("kind", "status"), [
    ("ignores", -signal.SIGKILL),
    ("exits 3", 3),
    ("default", -signal.SIGTERM),
])
def test_end_process_terminates_then_kills_and_returns_the_status(child: Any, kind: str, status: int) -> None:
    proc = child(kind)

    got = end_process(proc, GRACE_S)

    assert got == status == proc.returncode
    assert not Path(f"/proc/{proc.pid}").exists(), "reaped, not a zombie"


def test_end_process_only_reaps_a_process_that_already_exited() -> None:
    # Prepare: a child that has exited (a zombie, not reaped yet: WNOWAIT leaves it to end_process).
    proc = subprocess.Popen(["sh", "-c", "exit 7"])
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)

    got = end_process(proc, GRACE_S)

    assert got == 7
    assert not Path(f"/proc/{proc.pid}").exists()


def test_the_local_and_far_handles_end_their_processes(child: Any, tmp_path: Path) -> None:
    # Prepare: a local site server's handle, a far one's (its ssh and its socket forward), the controller's
    # forwards to two far machines; one process had already exited.
    local = ProcessHandle(child("default"))
    far = FarHandle(child("exits 3"), [], "/far/s.sock", FAR, tmp_path)
    far.forward = child("default")
    side = FarSide(ClusterSpec((ClusterServer(LOCAL), FAR)), tmp_path, {}, 1500)
    side.forwards = {"a": child("default"), "b": subprocess.Popen(["true"])}
    side.forwards["b"].wait()

    local.stop()
    far.stop()
    side.stop()

    assert local.popen.returncode == -signal.SIGTERM
    assert (far.popen.returncode, far.forward.returncode) == (3, -signal.SIGTERM)
    assert {k: p.returncode for k, p in side.forwards.items()} == {"a": -signal.SIGTERM, "b": 0}


class _Reaper:
    """The two requests `ForkedHandle` makes of its fork server, done on a real child of this process as
    the fork server does on its own children (the signal sent; the status as `Popen.poll` gives it)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.signals: list[int] = []

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        assert msg["pid"] == self.proc.pid
        if msg["op"] == "signal":
            self.signals.append(msg["signal"])
            os.kill(msg["pid"], msg["signal"])
            return {"ok": True}
        assert msg["op"] == "status"
        return {"ok": True, "status": self.proc.poll()}


@pytest.mark.parametrize(("kind", "signals", "status"), [
    ("ignores", [signal.SIGTERM, signal.SIGKILL], -signal.SIGKILL),
    ("exits 3", [signal.SIGTERM], 3),
])
def test_a_forked_server_is_terminated_then_killed(child: Any, monkeypatch: pytest.MonkeyPatch, kind: str,
                                                   signals: list[int], status: int) -> None:
    monkeypatch.setattr(forked, "STOP_GRACE_S", GRACE_S)
    proc = child(kind)
    reaper = _Reaper(proc)
    handle = ForkedHandle(cast(ForkServerClient, reaper), proc.pid)

    handle.stop()

    assert reaper.signals == signals
    assert handle.poll() == status


def test_a_forked_server_that_already_exited_gets_no_signal(child: Any) -> None:
    proc = child("default")
    proc.kill()
    proc.wait()
    reaper = _Reaper(proc)

    ForkedHandle(cast(ForkServerClient, reaper), proc.pid).stop()

    assert reaper.signals == []
