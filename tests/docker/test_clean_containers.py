"""`netai clean` removes worker containers of runs that are not live, and only those."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from orchestrator import procs
from orchestrator.emulation import cleanup
from orchestrator.runtime.backends import DEFAULT_IMAGE, RUN_LABEL

pytestmark = [pytest.mark.root, pytest.mark.docker]


def start(label_value: str, name: str) -> str:
    out = subprocess.run(
        ["docker", "run", "-d", "--rm", "--network", "none", "--name", name, "--label", f"{RUN_LABEL}={label_value}",
         DEFAULT_IMAGE, "sleep", "120"],
        capture_output=True, text=True, check=True,
    )
    return out.stdout.strip()


def test_clean_removes_containers_of_dead_runs_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if subprocess.run(["docker", "image", "inspect", DEFAULT_IMAGE], capture_output=True).returncode != 0:
        pytest.fail(f"the worker image {DEFAULT_IMAGE} is missing: make setup builds it")
    monkeypatch.setattr(cleanup, "STATE_DIR", tmp_path)
    live = cleanup.RunState(run_id="livetest", owner_pid=os.getpid(),
                            owner_start_ticks=procs.proc_start_ticks(os.getpid()))
    dead_id = start("deadtest", "netai-test-dead")
    live_id = start("livetest", "netai-test-live")
    try:
        assert cleanup.CONTAINER_LABEL == RUN_LABEL
        live.save()

        report = cleanup.clean()

        remaining = cleanup.labelled_containers()
        assert dead_id[:12] in [c[:12] for c in report.containers]
        assert not any(c.startswith(dead_id[:12]) for c in remaining)
        assert any(c.startswith(live_id[:12]) for c in remaining)
        assert report.skipped_live == ["livetest"]
    finally:
        subprocess.run(["docker", "rm", "-f", "netai-test-dead", "netai-test-live"], capture_output=True)
