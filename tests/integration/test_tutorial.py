"""docs/tutorial.md, run for real: every marked bash block in order, as a reader would type them
(the markers: `tests.unit.test_tutorial_commands`). Mininet, Open vSwitch, the controller, real FL
tasks, the dashboard's replay, a sweep at the K its trials choose, and a simulation at scale.

The commands run as written, from the repository's root, with three changes: ``sudo`` is a shim
that runs its command as it is (the test runs as root), ``.venv/bin/netai`` and ``netai`` run this
interpreter's ``orchestrator.cli``, and the run folders go under the test's temporary folder instead
of ``runs/``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_experiment import leftovers
from tests.unit.test_tutorial_commands import TUTORIAL, Step, tutorial_steps

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.root, pytest.mark.slow]
#: How long the block after a background one is retried (the network, or the server, coming up).
READY_S = 180.0
#: What `netai net up --no-cli` prints once every switch is connected and the network is up.
NET_UP_SAYS = "*** running;"
#: The longest a block may take (the sweep's trials and runs are the longest).
BLOCK_TIMEOUT_S = 1800
#: How long a background command may take to end after Ctrl-C (a network's teardown).
STOP_S = 120


def shims(folder: Path) -> dict[str, str]:
    """`folder` with ``sudo`` and ``netai`` shims; the environment that puts them first on the PATH."""
    folder.mkdir()
    (folder / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    (folder / "netai").write_text(f'#!/bin/sh\nexec {sys.executable} -m orchestrator.cli "$@"\n')
    for name in ("sudo", "netai"):
        (folder / name).chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ.get('PATH', '')}"}


def said(log: Path, text: str, *, within_s: float) -> bool:
    """Whether a background command's output shows `text` within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return True
        time.sleep(0.5)
    return False


def rewritten(step: Step, runs: Path) -> str:
    return step.text.replace(".venv/bin/netai", "netai").replace("runs/tutorial", str(runs))


def run_block(script: str, env: dict[str, str], *, retry_s: float) -> subprocess.CompletedProcess[str]:
    """Run a block with bash (-e, pipefail); retried for `retry_s` until it exits 0."""
    deadline = time.monotonic() + retry_s
    while True:
        res = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=ROOT, env=env, text=True,
                             capture_output=True, timeout=BLOCK_TIMEOUT_S)
        if res.returncode == 0 or time.monotonic() > deadline:
            return res
        time.sleep(0.5)  # poll interval while a background command comes up, bounded by READY_S


def stop(background: list[subprocess.Popen[str]]) -> None:
    """Ctrl-C to each background command's process group, then SIGKILL to what has not ended."""
    for proc in background:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)
    for proc in background:
        try:
            proc.wait(timeout=STOP_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    background.clear()


def test_the_tutorial_runs_as_written(tmp_path: Path, figures: list[str]) -> None:
    # Prepare: the shims, and the tutorial's steps
    env = shims(tmp_path / "bin")
    runs = tmp_path / "runs" / "tutorial"
    steps = tutorial_steps(TUTORIAL.read_text(encoding="utf-8"))
    background: list[subprocess.Popen[str]] = []
    after_background = False

    # Execute: every marked block in order; background ones stay up until their stop marker
    try:
        for step in steps:
            if step.kind == "stop":
                stop(background)
            elif step.kind == "background":
                log = tmp_path / f"background-{len(background)}.log"
                with log.open("w") as out:
                    background.append(subprocess.Popen(["bash", "-c", rewritten(step, runs)], cwd=ROOT, env=env,
                                                       text=True, stdout=out, stderr=subprocess.STDOUT,
                                                       start_new_session=True))
                if "net up" in step.text:  # the reader goes on "once it says the network is up"
                    assert said(log, NET_UP_SAYS, within_s=READY_S), f"docs/tutorial.md:{step.line}: never up"
                after_background = True
            elif step.kind == "run":
                started = time.monotonic()
                res = run_block(rewritten(step, runs), env, retry_s=READY_S if after_background else 0.0)
                figures.append(f"tutorial, docs/tutorial.md:{step.line}: {time.monotonic() - started:.1f} s "
                               f"({step.text.splitlines()[0][:60]})")
                after_background = False
                # Assert: each block exits 0
                assert res.returncode == 0, (f"docs/tutorial.md:{step.line}: {step.text}\n"
                                             f"{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
    finally:
        stop(background)

    # Assert: the runs the tutorial made, and nothing left behind
    assert sorted(p.name.split("-2")[0] for p in runs.iterdir()) == ["tutorial", "tutorial-scale-sim",
                                                                      "tutorial-sweep"]
    assert all(not v for v in leftovers().values()), leftovers()
