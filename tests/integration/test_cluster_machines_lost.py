"""A test machine lost in the middle of an experiment, for real (`tests.integration.machines`).

A ring of six sites: r2 on the first machine, r4 on the second, the rest (and the compute sites r3
and r5, one task's G and its local) here. The first task's shortest path r3 - r4 - r5 crosses the
second machine; it is killed (``docker kill``) while that task runs. Then:

- the run ends by itself with exit status 1 and the run ``failed``, naming the lost machine (the
  network it measured was not the configured one from then on);
- the task that crossed the lost machine failed, with the cut links as its reason (the sequential
  mode does not move tasks), and the next one, scheduled without the lost machine's links (through
  r2 on the surviving machine), completed; the lost machine is a ``machine_lost`` row of ``faults``;
- nothing of the run is left on the surviving machine nor here (bridges, VXLAN devices, namespaces,
  processes carrying the run's mark, switch interfaces);
- the lost machine, started again, still holds the run's bridges (its Open vSwitch database
  survived); ``netai cluster clean`` removes them there, and a second one finds nothing;
- in the online mode with ``on_failure``, the task under the killed machine moves around it and
  completes (the run is still ``failed``: its network changed);
- with a site server on the killed machine, its task fails and the next is blocked.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.emulation.cleanup import marked_processes, underlay_runs
from orchestrator.emulation.cluster_far import LOST_TIMEOUT_S
from orchestrator.results.db import ResultsDB
from tests.integration.machines import Machine, Machines, restart
from tests.integration.test_experiment import leftovers, netai

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow]

#: Rounds of each task: enough that the first still runs when the machine is killed after its
#: second round (rounds of this model take about 0.1 s here).
ROUNDS = 60


def _config(path: Path, machines: Machines) -> Path:
    m1, m2 = machines.machines[:2]
    servers = ["localhost", m1.server_entry() | {"sites": ["r2"]}, m2.server_entry() | {"sites": ["r4"]}]
    path.write_text(yaml.safe_dump({
        "name": "lost", "topology": "ring:6", "schedulers": ["spff"], "locals": [1], "tasks_per_point": 2,
        "seed": 1, "compute_sites": ["r3", "r5"], "task": {"model": "mlp", "rounds": ROUNDS},
        "background": {"enabled": False},
        "emulation": {"backend": "process", "cluster": {"servers": servers}},
    }))
    return path


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], capture_output=True, text=True,
                          timeout=600, check=False)


def _rounds_of_first_task(out: Path) -> int:
    """Rounds of the first task recorded so far in the run's database (0 before it exists)."""
    dbs = list(out.glob("*/results.db"))
    if not dbs:
        return 0
    try:
        with sqlite3.connect(f"file:{dbs[0]}?mode=ro", uri=True, timeout=1) as conn:
            row = conn.execute("SELECT MAX(round) FROM rounds").fetchone()  # only the first task runs yet
    except sqlite3.Error:
        return 0
    return int(row[0] or 0)


def _far_leftovers(m: Machine, run_marks: set[str]) -> dict[str, list[str]]:
    """What runs left on a machine: bridges, VXLAN devices, namespaces, processes carrying a run mark."""
    marked = m.exec("sh", "-c", 'grep -l "NETAI_RUN=" /proc/[0-9]*/environ 2>/dev/null || true').split()
    return {"bridges": m.exec("ovs-vsctl", "list-br").split(),
            "vxlan": m.exec("ip", "-o", "link", "show", "type", "vxlan").splitlines(),
            "namespaces": m.exec("ip", "netns", "list").splitlines(),
            "processes": [p for p in marked if not p.startswith("/proc/self")],
            "runs": sorted(run_marks)}


def _here() -> dict[str, list[str]]:
    """What a run leaves here (`leftovers`), but worker containers: the process backend starts none,
    and those of another run on this host are not this test's."""
    return {k: v for k, v in leftovers().items() if k != "containers"}


def _machine_lost_recorded(out: Path) -> bool:
    """Whether the run's database holds its `machine_lost` fault yet (read-only)."""
    dbs = list(out.glob("*/results.db"))
    try:
        with sqlite3.connect(f"file:{dbs[0]}?mode=ro", uri=True, timeout=1) as conn:
            return conn.execute("SELECT 1 FROM faults WHERE action = 'machine_lost'").fetchone() is not None
    except (sqlite3.Error, IndexError):
        return False


def _run_and_kill(config: Path, out: Path, victim: Machine) -> tuple[int, str, float, float | None]:
    """Run the experiment, kill `victim` once task 1 has completed two rounds; exit status, output,
    how long the run took from the kill to its end, and from the kill to its `machine_lost` fault."""
    proc = netai("experiment", str(config), "--out", str(out), "--no-progress", "--no-figures")
    try:
        deadline = time.monotonic() + 300
        while _rounds_of_first_task(out) < 2:
            assert proc.poll() is None, f"the run ended before the kill: {proc.communicate()[0][-3000:]}"
            assert time.monotonic() < deadline, "task 1 did not reach round 2 in 300 s"
            time.sleep(0.1)
        subprocess.run(["docker", "kill", victim.name], check=True, capture_output=True)
        killed = time.monotonic()
        with ThreadPoolExecutor(1) as pool:  # its output read meanwhile, so that it never blocks on a full pipe
            ended = pool.submit(proc.communicate, timeout=300)  # a run that hangs fails here
            lost_after_s = None
            while lost_after_s is None and not ended.done():
                if _machine_lost_recorded(out):
                    lost_after_s = time.monotonic() - killed
                time.sleep(0.05)
            stdout, _ = ended.result()
        return proc.returncode, stdout, time.monotonic() - killed, lost_after_s
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_machine_killed_mid_experiment(tmp_path: Path, machines: Machines, figures: list[str]) -> None:
    config = _config(tmp_path / "lost.yaml", machines)
    prepared = _cli("cluster", "prepare", str(config))  # `netai clean` there needs the project
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    m1, m2 = machines.machines[:2]

    status, stdout, after_kill_s, lost_after_s = _run_and_kill(config, tmp_path / "runs", m2)

    assert status == 1, stdout[-3000:]
    # found lost within its stated timeout plus 2 s (issue 48; `cluster_far.lost_within_s`)
    assert lost_after_s is not None and lost_after_s <= LOST_TIMEOUT_S + 2, (lost_after_s, stdout[-3000:])
    db = ResultsDB(next((tmp_path / "runs").glob("*/results.db")))
    run = db.run(1)
    assert run["status"] == "failed" and f"{m2.ssh}:22" in run["note"], run["note"]
    assert run["environment"]["cluster"]["far"]["lost"] == [f"{m2.ssh}:22"]
    first, second = db.query("SELECT task_id, state, reason FROM tasks ORDER BY task_id")
    assert first["state"] == "failed" and "went down" in first["reason"], (first, second)
    assert second["state"] == "done", (first, second)
    schedules = {r["task_id"]: json.loads(r["schedule_json"]) for r in db.query("SELECT * FROM schedules")}
    assert "r4" in json.dumps(schedules[first["task_id"]]["paths"]), "the first task crossed the machine"
    assert "r4" not in json.dumps(schedules[second["task_id"]]["paths"]), "the second went around it"
    (fault,) = db.query("SELECT action, target, detail FROM faults")
    assert fault["action"] == "machine_lost" and fault["target"] == f"{m2.ssh}:22", fault
    figures.append(f"machine killed mid-run: exit status {status}, first task {first['state']} "
                   f"({first['reason']}), second task {second['state']}; found lost {lost_after_s:.1f} s and the "
                   f"run ended {after_kill_s:.1f} s after the kill")

    # nothing left on the surviving machine, nor here
    assert _far_leftovers(m1, set()) == {"bridges": [], "vxlan": [], "namespaces": [], "processes": [], "runs": []}
    assert _here() == {"bridges": [], "veths": [], "controller": []}
    assert marked_processes() == {} and underlay_runs() == []

    # the lost machine back: the run's bridges are still in its database, until `netai cluster clean`
    restart(m2)
    left = m2.exec("ovs-vsctl", "list-br").split()
    assert left, "the lost machine kept the run's bridges (its Open vSwitch database survived)"
    cleaned = _cli("cluster", "clean", str(config), "--json")
    assert cleaned.returncode == 0, cleaned.stdout + cleaned.stderr
    reports: list[dict[str, Any]] = json.loads(cleaned.stdout)
    by_server = {r["server"]: r for r in reports}
    assert sorted(by_server[f"{m2.ssh}:22"]["removed"]["bridges"]) == sorted(left), reports
    assert by_server[f"{m1.ssh}:22"]["removed"]["bridges"] == [], reports
    assert m2.exec("ovs-vsctl", "list-br").split() == []
    again = json.loads(_cli("cluster", "clean", str(config), "--json").stdout)
    assert all(not r["removed"]["bridges"] and not r["removed"]["processes"] for r in again), again
    figures.append(f"the lost machine back: `netai cluster clean` removed its {len(left)} bridge(s) of the run")


def test_in_the_online_mode_a_task_moves_around_a_machine_killed_under_it(tmp_path: Path, machines: Machines,
                                                                           figures: list[str]) -> None:
    """After the first test (its machine back and cleaned): the same ring in the online mode with the
    ``on_failure`` policy. The second machine (r4, on the task's shortest path r3 - r4 - r5) is killed
    while the task runs: the task moves to a path around it (through r2 on the first machine) and
    completes, the move is recorded with the lost machine as its reason, and the run still ends
    ``failed`` with exit status 1 (the network was not the configured one from then on). The machine
    is started again and cleaned for the next test."""
    m1, m2 = machines.machines[:2]
    config = _config(tmp_path / "online.yaml", machines)
    raw = yaml.safe_load(config.read_text())
    raw |= {"mode": "online", "online": {"tasks": 1, "arrival": "all", "seed": 1},
            "reschedule": {"policies": ["on_failure"]}}
    # ROUNDS rounds, as in the first test: the task's rounds stop once the machine under its path is
    # dead (here they went on to round 15, within a second of the kill) and stay stopped until the
    # loss is found and the task moved, so it still runs then
    config.write_text(yaml.safe_dump(raw))

    try:
        status, stdout, after_kill_s, lost_after_s = _run_and_kill(config, tmp_path / "runs", m2)
    finally:
        restart(m2)
        _cli("cluster", "clean", str(config))

    assert status == 1, stdout[-3000:]
    assert lost_after_s is not None and lost_after_s <= LOST_TIMEOUT_S + 2, (lost_after_s, stdout[-3000:])
    db = ResultsDB(next((tmp_path / "runs").glob("*/results.db")))
    assert db.run(1)["status"] == "failed" and f"{m2.ssh}:22" in db.run(1)["note"]
    (task,) = db.query("SELECT task_id, state, reason FROM tasks")
    assert task["state"] == "done", task
    (move,) = db.query("SELECT reason, old_schedule_json, new_schedule_json, resumed_round FROM moves")
    assert "r4" in json.dumps(json.loads(move["old_schedule_json"])["paths"]), "it first crossed the machine"
    assert "r4" not in json.dumps(json.loads(move["new_schedule_json"])["paths"]), "it moved around it"
    rounds = db.query("SELECT round FROM rounds ORDER BY round")
    assert [r["round"] for r in rounds] == list(range(1, ROUNDS + 1)), "every round, once"
    faults = [f["action"] for f in db.query("SELECT action FROM faults")]
    assert "machine_lost" in faults, faults
    assert _far_leftovers(m1, set()) == {"bridges": [], "vxlan": [], "namespaces": [], "processes": [], "runs": []}
    assert _here() == {"bridges": [], "veths": [], "controller": []}
    assert m2.exec("ovs-vsctl", "list-br").split() == [], "the restarted machine was cleaned"
    figures.append(f"online mode, machine killed under a task: exit status {status}, the task moved at round "
                   f"{move['resumed_round']} ({move['reason']}) and completed; found lost {lost_after_s:.1f} s and "
                   f"the run ended {after_kill_s:.1f} s after the kill")


def test_a_machine_with_a_site_server_killed_mid_experiment(tmp_path: Path, machines: Machines) -> None:
    """After the test above (its machine back): the compute site r2 on the first machine, so one of
    each task's G and local is a site server there; that machine is killed during the first task.
    The run ends by itself, no task is reported done that was not, and the other machine and this
    one are left clean."""
    m1, m2 = machines.machines[:2]
    config = _config(tmp_path / "lost2.yaml", machines)
    raw = yaml.safe_load(config.read_text())
    raw["compute_sites"] = ["r2", "r3"]
    config.write_text(yaml.safe_dump(raw))

    status, stdout, after_kill_s, lost_after_s = _run_and_kill(config, tmp_path / "runs", m1)

    assert status == 1, stdout[-3000:]
    assert lost_after_s is not None and lost_after_s <= LOST_TIMEOUT_S + 2, (lost_after_s, stdout[-3000:])
    db = ResultsDB(next((tmp_path / "runs").glob("*/results.db")))
    assert db.run(1)["status"] == "failed" and f"{m1.ssh}:22" in db.run(1)["note"]
    first, second = db.query("SELECT task_id, state, reason FROM tasks ORDER BY task_id")
    assert first["state"] == "failed", (first, second)
    assert second["state"] == "blocked" and "separate" in second["reason"], (first, second)  # r2 is gone
    assert _far_leftovers(m2, set()) == {"bridges": [], "vxlan": [], "namespaces": [], "processes": [], "runs": []}
    assert _here() == {"bridges": [], "veths": [], "controller": []}
    assert marked_processes() == {} and underlay_runs() == []
    print(f"site server's machine killed: exit {status}, first task {first['state']} ({first['reason']}), "
          f"second {second['state']} ({second['reason']}); found lost {lost_after_s:.1f} s and ended "
          f"{after_kill_s:.1f} s after the kill")
