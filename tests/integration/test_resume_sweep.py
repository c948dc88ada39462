"""Issue 48: Ctrl-C twice during a sweep, then ``netai experiment --resume`` twice: the sweep completes,
and no task runs twice (`task_events`). On the simulation (no root): the command line's own signal
handling, the sweep's runs and their resumes are the emulation's."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from tests.kill_campaign import ROOT, netai, sim_leftovers

pytestmark = [pytest.mark.slow]

SWEEP = """\
name: survive-sweep
engine: simulation
topology: sndlib/nobel-us
schedulers: [spff, mst]
locals: [2, 4]
tasks_per_point: 4
seed: 5
task: {model: mlp, model_args: {hidden: 64, layers: 1}, rounds: 2, demand_mbps: 1000, partition: iid}
emulation: {max_link_mbps: 100}
background: {enabled: false}
simulation: {calibration: "resume test: the model's defaults"}
sweep:
  - task: {model_args: {hidden: 64, layers: 1}}
  - task: {model_args: {hidden: 200, layers: 1}}
  - task: {model_args: {hidden: 400, layers: 1}}
"""


def _runs(out: Path) -> list[Path]:
    return sorted(out.glob("*/*/results.db"))


def _interrupt_when(argv: list[str], ready: int) -> int:
    """Run `argv` and send SIGINT to its process group (a terminal's Ctrl-C) once `ready` runs of the
    sweep have a database; its exit status."""
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    out = Path(argv[argv.index("--out") + 1]) if "--out" in argv else Path(argv[argv.index("--resume") + 1]).parent
    deadline = time.monotonic() + 120
    while proc.poll() is None and len(_runs(out)) < ready and time.monotonic() < deadline:
        time.sleep(0.01)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGINT)
    proc.communicate(timeout=120)
    return proc.returncode


def test_ctrl_c_twice_then_resume_twice_completes_and_runs_no_task_twice(tmp_path: Path) -> None:
    # Prepare
    config = tmp_path / "sweep.yaml"
    config.write_text(SWEEP)
    out = tmp_path / "runs"

    # Execute: Ctrl-C once the second run started; resume, Ctrl-C once the third started; resume to the end.
    first = _interrupt_when(netai("experiment", str(config), "--out", str(out), "--no-figures"), 2)
    sweep_dir = next(out.iterdir())
    second = _interrupt_when(netai("experiment", "--resume", str(sweep_dir), "--no-figures"), 3)
    last = subprocess.run(netai("experiment", "--resume", str(sweep_dir), "--no-figures"), cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    again = subprocess.run(netai("experiment", "--resume", str(sweep_dir), "--no-figures"), cwd=ROOT,
                           capture_output=True, text=True, timeout=300)

    # Assert
    assert (first, second) == (130, 130)
    assert last.returncode == 0, last.stdout[-2000:] + last.stderr[-2000:]
    assert again.returncode == 0 and "complete: nothing to resume" in again.stdout
    dbs = _runs(out)
    assert len(dbs) == 3
    for db in dbs:
        conn = sqlite3.connect(db)
        twice = conn.execute("SELECT scheduler, task_id, count(*) FROM task_events WHERE state IN ('done', 'failed', "
                             "'blocked') GROUP BY scheduler, task_id HAVING count(*) > 1").fetchall()
        tasks = conn.execute("SELECT count(*) FROM tasks WHERE complete = 1 AND state = 'done'").fetchone()[0]
        status = conn.execute("SELECT status FROM runs").fetchone()[0]
        conn.close()
        assert twice == [] and tasks == 16 and status == "completed", (db, twice, tasks, status)
    assert (sweep_dir / "report.md").exists()
    assert sim_leftovers(out) == []  # no engine file, no process of the interrupted runs
