"""The experiment end to end, for real: Mininet, OVS, the controller, worker containers (Docker
where a daemon and the image exist, else processes), iperf3 background traffic.

CI runs a trimmed copy of experiments/quick.yaml (one task of 8 locals per scheduler, 2 rounds)
and an interrupted run (SIGINT while rounds are running).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.results.db import ResultsDB
from orchestrator.results.summary import run_summary
from orchestrator.results.summary_figures import plot
from tests.unit.test_experiment_pieces import assert_plotted_means_match_rows

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.root, pytest.mark.slow]


def trimmed_quick(tmp_path: Path, backend: str | None = None, **changes: object) -> Path:
    """quick.yaml undilated (its K per point is for a whole faithful run) with `changes`; `backend`
    replaces its ``emulation.backend`` (``auto``: Docker when
    the worker image exists). Tests of paths the backend does not change take ``process``, whose
    servers fork from one warmed process; the Docker backend's own paths are tests/docker's."""
    cfg = yaml.safe_load((ROOT / "experiments" / "quick.yaml").read_text())
    cfg["emulation"] = {k: v for k, v in cfg["emulation"].items() if k != "time_dilation"}  # undilated, as CI's
    cfg.update(changes)
    if backend is not None:
        cfg["emulation"] = dict(cfg["emulation"], backend=backend)
    path = tmp_path / "trimmed.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


#: Every `netai` started by a test; tests/integration/conftest.py ends those still running after it.
STARTED: list[subprocess.Popen[str]] = []


def netai(*args: str, **kw: object) -> subprocess.Popen[str]:
    def default_sigint() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", *args], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=default_sigint,
                            **kw)  # type: ignore[call-overload]
    STARTED.append(proc)
    return proc


def end_started(grace_s: float = 60.0) -> None:
    """Interrupt (as Ctrl-C) each `netai` a test started that still runs, kill it after `grace_s` (a
    test that failed midway leaves its run to this, not to the next test)."""
    running = [p for p in STARTED if p.poll() is None]
    STARTED.clear()
    for proc in running:
        proc.send_signal(signal.SIGINT)
    for proc in running:
        try:
            proc.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def leftovers() -> dict[str, list[str]]:
    """What a run could leave behind: project bridges, switch veths, controller, containers."""
    bridges = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    veths = re.findall(r"^\d+: (s\d+-eth\d+)", links, flags=re.M)
    ctl = subprocess.run(["pgrep", "-f", "osken-manager"], capture_output=True, text=True).stdout.split()
    containers: list[str] = []
    if subprocess.run(["docker", "info"], capture_output=True).returncode == 0:
        containers = subprocess.run(["docker", "ps", "-aq", "--filter", "label=org.netai.run"],
                                    capture_output=True, text=True).stdout.split()
    return {"bridges": [b for b in bridges if re.fullmatch(r"s\d+", b)], "veths": veths,
            "controller": ctl, "containers": containers}


def run_dir_of(out: Path) -> Path:
    dirs = sorted(out.glob("*-*"))
    assert len(dirs) == 1, dirs
    return dirs[0]


def test_trimmed_quick_experiment_end_to_end(tmp_path: Path, figures: list[str]) -> None:
    config = trimmed_quick(tmp_path, locals=[8], tasks_per_point=1, task={"model": "mlp", "rounds": 2})
    out = tmp_path / "runs"

    proc = netai("experiment", str(config), "--out", str(out), "--no-progress")
    stdout, _ = proc.communicate(timeout=1500)

    assert proc.returncode == 0, stdout[-3000:]
    run_dir = run_dir_of(out)
    for name in ("results.db", "report.md", "rounds.csv", "summary.csv", "experiment.log",
                 "latency_vs_locals.png", "latency_vs_locals.svg", "bandwidth_vs_locals.png",
                 "bandwidth_vs_locals.svg"):
        assert (run_dir / name).stat().st_size > 0, name
    db = ResultsDB(run_dir / "results.db")
    run = db.run(1)
    assert run["status"] == "completed"
    env = run["environment"]
    from orchestrator.runtime.backends import pick_backend

    assert env["backend"] == pick_backend("auto")
    assert env["delay_emulated"] in (True, False)
    # the datapath auto picked (the kernel module where there is one, else tc), and where the CPU went
    assert env["datapath"] == ("kernel" if Path("/sys/module/openvswitch").exists() else "tc")
    assert env["cpu_s_site_servers"] > 0 and env["cpu_s_controller"] > 0 and env["cpu_s_orchestrator"] > 0
    assert env["cpu_s_switches"] <= 0.05 * env["cpu_s_site_servers"]  # ovs-vswitchd forwards nothing here
    tasks = db.query("SELECT scheduler, state, carried_bytes, model_bytes FROM tasks ORDER BY scheduler")
    assert [t["scheduler"] for t in tasks] == ["mst", "spff", "steiner"]
    assert all(t["state"] == "done" for t in tasks), tasks
    rounds = db.query("SELECT * FROM rounds ORDER BY scheduler, round")
    assert len(rounds) == 3 * 2
    for r in rounds:
        assert r["latency_s"] > 0 and r["lower_bound_s"] > 0
        assert r["broadcast_s"] + r["train_s"] + r["upload_s"] == pytest.approx(r["latency_s"], rel=1e-6)
        assert 0.0 <= r["accuracy"] <= 1.0
    # every task's flows carried at least 2 rounds x 8 locals x (GLOBAL + UPDATE) model payloads
    for t in tasks:
        assert t["carried_bytes"] >= 2 * 8 * 2 * t["model_bytes"], t
    background = db.query("SELECT offered_mbps, achieved_mbps FROM background")
    assert len(background) == 6
    assert all(b["achieved_mbps"] is not None and b["achieved_mbps"] > 0.5 * b["offered_mbps"] for b in background)
    assert db.query("SELECT COUNT(*) AS n FROM network_state")[0]["n"] == 3 * 2 * 21
    # each task's life on the run's clock, in order, and its start overhead in tasks.csv
    times = db.query("SELECT arrival_s, admitted_s, first_broadcast_s, finished_s, start_overhead_s FROM tasks")
    for t in times:
        assert 0 <= t["arrival_s"] <= t["admitted_s"] <= t["first_broadcast_s"] <= t["finished_s"], t
        assert t["start_overhead_s"] == pytest.approx(t["first_broadcast_s"] - t["admitted_s"])
    header = (run_dir / "tasks.csv").read_text().splitlines()[0].split(",")
    assert "start_overhead_s" in header
    # the relays forwarded the broadcast from their readers, each chunk ready when the kernel received
    # it (the copies are paced: a relay's own time is made up on its link); a chunk with a segment
    # received out of order is not stamped, so a few may go without
    relayed = [json.loads(line) for f in sorted((run_dir / "tasks").glob("mst-*/*.events.jsonl"))
               for line in f.read_text().splitlines() if '"forward_first"' in line]
    relays = [e for e in relayed if "on_arrival" in e]  # G's own copies: no field
    assert relays and sum(e["on_arrival"] is True for e in relays) >= 0.9 * len(relays), relays[:3]
    # the plotted means come from the rows
    drawn = plot(run_summary(db, 1).points, tmp_path / "replot")
    assert assert_plotted_means_match_rows(db, 1, drawn) == 2 * 3
    # the paper's two claims are in the report, as measured
    report = (run_dir / "report.md").read_text()
    ratios = dict(re.findall(r"- (reserved bandwidth|mean round latency): mst / spff = ([0-9.]+)", report))
    assert set(ratios) == {"reserved bandwidth", "mean round latency"}
    assert all(math.isfinite(float(v)) and float(v) > 0 for v in ratios.values())
    assert float(ratios["reserved bandwidth"]) < 1.0  # trees reserve less than 8 unicast pairs
    figures.append(f"experiment (8 locals, 2 rounds, {env['backend']}): mst/spff reserved "
                   f"{ratios['reserved bandwidth']}, latency {ratios['mean round latency']}")
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}


def test_ctrl_c_tears_down_and_keeps_finished_rounds(tmp_path: Path) -> None:
    config = trimmed_quick(tmp_path, "process", locals=[2], tasks_per_point=3, task={"model": "mlp", "rounds": 6})
    out = tmp_path / "runs"
    proc = netai("experiment", str(config), "--out", str(out), "--no-progress", "--no-figures")
    db_path = None
    deadline = time.monotonic() + 600
    rounds = 0
    while time.monotonic() < deadline and proc.poll() is None:
        dirs = list(out.glob("*-*"))
        if dirs and (dirs[0] / "results.db").exists():
            db_path = dirs[0] / "results.db"
            try:
                with sqlite3.connect(db_path) as c:
                    rounds = c.execute("SELECT COUNT(*) FROM rounds").fetchone()[0]
            except sqlite3.Error:
                rounds = 0
            if rounds >= 2:
                break
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    assert db_path is not None and rounds >= 2

    os.kill(proc.pid, signal.SIGINT)
    stdout, _ = proc.communicate(timeout=180)

    assert proc.returncode == 130, stdout[-2000:]
    db = ResultsDB(db_path)
    run = db.run(1)
    assert run["status"] == "interrupted"
    kept = db.query("SELECT COUNT(*) AS n FROM rounds")[0]["n"]
    assert kept >= rounds
    assert (db_path.parent / "report.md").read_text().count("interrupted") >= 1
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}


def run_config(config: Path, out: Path, *, timeout: float, figures: bool = False) -> tuple[int, str, Path, ResultsDB]:
    """Run an experiment config with the CLI: exit status, output, run directory, results database.
    The plots are drawn only when the test asks (`figures`): the end-to-end tests check them."""
    proc = netai("experiment", str(config), "--out", str(out), "--no-progress", *([] if figures else ["--no-figures"]))
    stdout, _ = proc.communicate(timeout=timeout)
    run_dir = run_dir_of(out)
    return proc.returncode, stdout, run_dir, ResultsDB(run_dir / "results.db")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


USER_MODEL = """\
from torch import nn


def make(*, input_shape, num_classes, width=16):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))
"""


#: Rounds per task of the online test: enough that tasks overlap for longer than the sampling
#: period (3 rounds of its model take about 0.1 s, and a 0.5 s sampler could fall between overlaps).
ONLINE_ROUNDS = 30


def _overlapping(spans: list[tuple[float, float]]) -> bool:
    """Whether any two (start, end) spans overlap."""
    spans = sorted(spans)
    latest_end = spans[0][1]
    for start, end in spans[1:]:
        if start < latest_end:
            return True
        latest_end = max(latest_end, end)
    return False


def test_online_mode_with_a_user_model(tmp_path: Path) -> None:
    model = _write(tmp_path, "my models/tiny.py", USER_MODEL)
    config = _write(tmp_path, "online.yaml", yaml.safe_dump({
        "name": "online-test", "topology": "sndlib/nobel-us", "mode": "online", "schedulers": ["spff", "mst"],
        "locals": [2, 4], "online": {"tasks": 6, "arrival": "poisson", "mean_interarrival_s": 0.3, "seed": 3,
                                     "sample_s": 0.5},
        "task": {"model": f"{model}:make", "model_args": {"width": 24}, "rounds": ONLINE_ROUNDS},
        "background": {"enabled": True, "pairs": 4}, "emulation": {"backend": "process"}}))
    status, stdout, run_dir, db = run_config(config, tmp_path / "runs", timeout=1200, figures=True)

    assert status == 0, stdout[-3000:]
    assert db.run(1)["status"] == "completed"
    tasks = db.query("SELECT * FROM tasks ORDER BY scheduler, task_id")
    assert len(tasks) == 12 and {t["scheduler"] for t in tasks} == {"spff", "mst"}
    # the same arrival trace for both schedulers
    trace = {s: [(t["task_id"], t["global_site"], t["local_sites_json"]) for t in tasks if t["scheduler"] == s]
             for s in ("spff", "mst")}
    assert trace["spff"] == trace["mst"]
    for t in tasks:
        assert t["state"] in ("done", "blocked"), t  # none left pending, scheduled or running
        assert t["arrival_s"] is not None
        if t["state"] == "done":
            assert t["arrival_s"] <= t["admitted_s"] <= t["first_broadcast_s"] <= t["finished_s"], t
            assert t["model_bytes"] == (64 * 24 + 24 + 24 * 10 + 10) * 4, "the user's model, shipped"
        else:
            assert t["admitted_s"] is None and t["first_broadcast_s"] is None
    done = [t for t in tasks if t["state"] == "done"]
    # rounds only between a task's first broadcast and its end
    for t in done:
        rounds = db.query("SELECT latency_s FROM rounds WHERE scheduler = ? AND task_id = ?",
                          (t["scheduler"], t["task_id"]))
        assert len(rounds) == ONLINE_ROUNDS
        assert sum(r["latency_s"] for r in rounds) <= t["finished_s"] - t["first_broadcast_s"] + 1e-6
    for sched in ("spff", "mst"):  # side by side in the tasks' own records...
        spans = [(t["first_broadcast_s"], t["finished_s"]) for t in done if t["scheduler"] == sched]
        assert _overlapping(spans), (sched, spans)
    samples = db.query("SELECT * FROM samples")  # ...and as the sampler saw them
    assert samples and max(s["running"] for s in samples) >= 2, "tasks ran side by side"
    assert db.query("SELECT COUNT(DISTINCT site) AS n FROM site_samples")[0]["n"] == 14
    report = (run_dir / "report.md").read_text()
    assert "## Online" in report and "blocking ratio" in report
    assert (run_dir / "online_bandwidth.png").stat().st_size > 0
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}


def test_a_model_that_raises_exits_2_before_bring_up(tmp_path: Path) -> None:
    model = _write(tmp_path, "bad.py", "def make(**kw):\n    raise ValueError('no such layer')\n")
    config = trimmed_quick(tmp_path, task={"model": f"{model}:make", "rounds": 1})
    out = tmp_path / "runs"

    proc = netai("experiment", str(config), "--out", str(out), "--no-progress")
    stdout, _ = proc.communicate(timeout=300)

    assert proc.returncode == 2, stdout
    assert stdout.strip().splitlines()[-1] == (f"netai: error: model '{model}:make' cannot be built: "
                                              "ValueError: no such layer")
    assert not out.exists(), "nothing was started or written"
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}


def test_every_task_failing_exits_nonzero(tmp_path: Path) -> None:
    # builds here (the preflight) but every role fails on its server (the warm-up's forward pass)
    model = _write(tmp_path, "broken.py", "from torch import nn\n\nclass Broken(nn.Linear):\n"
                   "    def forward(self, x):\n        raise RuntimeError('forward is broken')\n\n"
                   "def make(*, input_shape, num_classes):\n    return Broken(64, num_classes)\n")
    # training as measured: modelled compute would profile the model first and refuse it (status 2);
    # no background, whose view (about 5 s) is measured before the task and is not what is tested
    config = trimmed_quick(tmp_path, "process", locals=[2], tasks_per_point=1, schedulers=["spff", "mst"],
                           task={"model": f"{model}:make", "rounds": 1, "compute_timing": "measured"},
                           background={"enabled": False})
    status, stdout, run_dir, db = run_config(config, tmp_path / "runs", timeout=600)

    assert status == 1, stdout[-3000:]
    run = db.run(1)
    assert run["status"] == "failed" and run["note"] == "no task completed"
    states = db.query("SELECT state, reason FROM tasks")
    assert [s["state"] for s in states] == ["failed", "failed"]
    assert all("forward is broken" in s["reason"] for s in states)
    assert "0 of 2 tasks done" in stdout and "2 of 2 tasks FAILED" in stdout
    report = (run_dir / "report.md").read_text()
    assert "Status: **failed** (no task completed)" in report and "**2 of 2 tasks failed.**" in report
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}


@pytest.mark.docker
def test_a_killed_site_server_is_reported_and_the_run_ends_clean(tmp_path: Path) -> None:
    # a ring of six: the Docker backend starts one container per site (fourteen took 23 s here), whose
    # site servers are processes of their own to kill (the process backend's fork from one); no
    # background, whose view is measured before every task (about 5 s each) and is not what is tested
    config = trimmed_quick(tmp_path, "docker", locals=[2], tasks_per_point=3, schedulers=["spff", "mst"],
                           topology="ring:6", task={"model": "mlp", "rounds": 40}, background={"enabled": False})
    out = tmp_path / "runs"
    proc = netai("experiment", str(config), "--out", str(out), "--no-progress", "--no-figures")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        dirs = list(out.glob("*-*"))
        if dirs and list(dirs[0].glob("tasks/*/*.events.jsonl")):
            break
        time.sleep(0.2)
    time.sleep(1.0)  # into the first task's rounds
    servers = subprocess.run(["pgrep", "-f", "-x", r".*python.* -m workers\.site_server .*"], capture_output=True,
                             text=True).stdout.split()
    assert servers, "no site server found"
    for pid in servers:
        os.kill(int(pid), signal.SIGKILL)

    stdout, _ = proc.communicate(timeout=600)

    run_dir = run_dir_of(out)
    db = ResultsDB(run_dir / "results.db")
    states = db.query("SELECT state, reason FROM tasks")
    assert len(states) == 6 and all(s["state"] in ("done", "failed") for s in states)
    failed = [s for s in states if s["state"] == "failed"]
    assert failed and all("site server" in s["reason"] for s in failed), failed
    done = len(states) - len(failed)
    assert proc.returncode == (0 if done else 1), stdout[-3000:]
    assert db.run(1)["status"] == ("completed" if done else "failed")
    assert f"{len(failed)} of 6 tasks failed" in (run_dir / "report.md").read_text()
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}
