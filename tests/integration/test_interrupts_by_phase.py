"""Ctrl-C at each phase of ``netai task run`` (bring-up, site servers starting, rounds running):
exit status 130 and nothing of the run left behind, every time."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from orchestrator.emulation.cleanup import STATE_DIR
from tests.integration.test_emulation_teardown import NOTHING, leftovers
from topologies.loaders import load
from topologies.plan import EmulationPlan

pytestmark = [pytest.mark.root, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _new_state(before: set[Path]) -> Path | None:
    new = set(STATE_DIR.glob("run-*.json")) - before
    return min(new) if new else None


def _rounds_started(log: Path) -> bool:
    return any("round_start" in p.read_text() for p in log.glob("workers/tasks/agents/*.events.jsonl"))


PHASES: dict[str, Callable[[Path, set[Path]], bool]] = {
    "bring-up": lambda log, before: _new_state(before) is not None,
    # a site server's output file: made as it is launched (the fork server's is made before the bring-up)
    "servers starting": lambda log, before: any(p.name != "forkserver.out.txt"
                                                for p in (log / "workers" / "servers").glob("*.out.txt")),
    "rounds running": lambda log, before: _rounds_started(log),
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_ctrl_c_exits_130_and_leaves_nothing(tmp_path: Path, phase: str) -> None:
    before = set(STATE_DIR.glob("run-*.json"))
    log = tmp_path / "logs"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "task", "run", "--topology", "triangle",
                             "--locals", "2", "--backend", "process", "--rounds", "1000", "--log-dir", str(log)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_state: Path | None = None
    try:
        deadline = time.monotonic() + 120
        while not PHASES[phase](log, before):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, f"the run did not reach {phase} within 120 s"
            time.sleep(0.05)
        run_state = _new_state(before)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err[-2000:]
    assert "netai: interrupted" in err
    # each server stopped cleanly: none's stop failed (an interrupted request's reply read by the next one)
    assert "stopping the site server of" not in err, err[-2000:]
    assert run_state is not None, "the run wrote no state file"
    run_id = run_state.stem.removeprefix("run-")
    assert leftovers(run_id, EmulationPlan.from_model(load("triangle"))) == NOTHING
