"""Run marks and cleanup helpers, on the test's own child processes (no root, no Mininet)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.emulation import cleanup
from orchestrator.emulation.cleanup import (
    ENV_RUN,
    RunState,
    kill_pids,
    marked_processes,
    proc_start_ticks,
    process_alive,
    process_run_id,
)


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
