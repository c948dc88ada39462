"""A network you can work with: best-effort connectivity, strict isolation, and a second process
that installs paths and runs an FL task on a running ``netai net up``.

- In-process: a ring brought up with the default (best-effort) connectivity answers Mininet's
  ``pingall`` with no loss and its flow tables hold exactly the best-effort entries; the same ring in
  strict mode loses every ping.
- ``netai net up --no-cli`` in a subprocess (triangle), then, from other processes: a ping between
  every pair of its hosts; ``netai schedule --install`` / ``--remove``; ``netai task run --attach``,
  whose entries the controller reports while it runs and which completes its rounds; the run's
  results database records it; Ctrl-C tears the network down with nothing of the run left.
"""

from __future__ import annotations

import itertools
import json
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation.cleanup import RunState, marked_processes, run_states
from orchestrator.emulation.controller_client import ControllerClient
from orchestrator.emulation.network import Emulation
from orchestrator.emulation.selftest import compare_flow_tables, dump_flows, expected_entries
from topologies.loaders import load
from topologies.plan import EmulationPlan

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.root, pytest.mark.slow]

UP_TIMEOUT_S = 90.0
EXIT_TIMEOUT_S = 60.0
ATTACH_TIMEOUT_S = 400.0


# -- in-process: best-effort and strict --------------------------------------------------------------
def test_best_effort_connectivity_answers_pingall_with_no_loss() -> None:
    plan = EmulationPlan.from_model(load("ring:6"))
    with Emulation(plan) as emu:
        try:
            loss = emu.net.pingAll(timeout=1)
            diffs = compare_flow_tables(emu, expected_entries(plan, [], best_effort=True))
            health = emu.client.health()
        except BaseException:
            print(dump_flows(emu))
            raise

    assert loss == 0.0
    assert diffs == {}  # the real switches hold exactly the builder's entries, DSCP rewrite included
    assert health["connectivity"] == "best-effort"


def ping_every_pair_at_once(net: Any, timeout_s: int = 1) -> float:
    """Mininet's ``pingAll`` (one ``ping -c1 -W timeout_s`` from every host to every other, the loss
    in percent, Mininet's parse of each output), but every ping at once: a network that drops them
    all costs one timeout rather than one per pair (30 s for a ring of six)."""
    pings = [(src, src.popen(["ping", "-c1", "-W", str(timeout_s), dst.IP()], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True))
             for src, dst in itertools.permutations(net.hosts, 2)]
    sent = received = 0
    for src, proc in pings:
        out, _ = proc.communicate(timeout=timeout_s + 30)
        # a ping's own summary (pingAll would count any other output, a missing ping too, as lost)
        assert "packets transmitted" in out or "Network is unreachable" in out, (src.name, out)
        s, r = net._parsePing(out)  # Mininet's parse of it, as pingAll's
        sent, received = sent + s, received + r
    assert sent == len(pings)
    return 100.0 * (sent - received) / sent


def test_strict_connectivity_isolates_every_host_pair() -> None:
    plan = EmulationPlan.from_model(load("ring:6"))
    with Emulation(plan, connectivity="strict") as emu:
        loss = ping_every_pair_at_once(emu.net)
        diffs = compare_flow_tables(emu, expected_entries(plan, []))
        health = emu.client.health()

    assert loss == 100.0
    assert diffs == {}
    assert health["connectivity"] == "strict"


# -- `netai net up` in another process -------------------------------------------------------------
@dataclass
class NetUp:
    proc: subprocess.Popen[str]
    state: RunState
    client: ControllerClient
    plan: EmulationPlan
    out: Path
    dashboard: str


def dashboard_tasks(net: NetUp) -> dict[str, dict[str, Any]]:
    """The tasks the running network's live dashboard shows now, by key, with their trees' hops."""
    with urllib.request.urlopen(net.dashboard + "api/frame", timeout=10) as r:
        frame = json.loads(r.read())
    return {t["key"]: t for t in frame["tasks"]}


def _netai(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", *args]


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def net_up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetUp]:
    out = tmp_path_factory.mktemp("net-up") / "net-up.out"
    with out.open("w") as sink:
        # Its output goes to a file: Mininet's chatter must never fill a pipe nobody reads.
        with socket.socket() as probe:  # a free loopback port for its dashboard
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        proc = subprocess.Popen(_netai("net", "up", "--topology", "triangle", "--no-cli", "--dashboard",
                                       "--dashboard-port", str(port)), cwd=ROOT, text=True,
                                stdout=sink, stderr=subprocess.STDOUT, preexec_fn=_default_sigint)
    state = None
    try:
        deadline = time.monotonic() + UP_TIMEOUT_S
        while state is None:
            assert proc.poll() is None, f"netai net up exited with {proc.returncode}: {out.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"netai net up not running after {UP_TIMEOUT_S:g} s: {out.read_text()}"
            if "*** running" in out.read_text():
                state = next((s for s in run_states() if s.owner_pid == proc.pid and s.live), None)
            time.sleep(0.1)  # polling the child's output and state file, bounded by the deadline
        client = ControllerClient(state.rest_url)
        plan = EmulationPlan.from_dict(client.topology()["plan"])
        yield NetUp(proc, state, client, plan, out, f"http://127.0.0.1:{port}/")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert proc.returncode in (0, 130), out.read_text()[-2000:]
    assert state is not None and marked_processes({state.run_id}) == {}  # attached site servers included


@pytest.fixture(autouse=True)
def dump_on_failure(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed and "net_up" in request.fixturenames:
        net: NetUp = request.getfixturevalue("net_up")
        print("--- net up output\n" + net.out.read_text()[-3000:])
        for sw in net.plan.switches:
            res = subprocess.run(["ovs-ofctl", "-O", "OpenFlow13", "dump-flows", sw.name],
                                 capture_output=True, text=True, check=False)
            print(f"--- {sw.name}\n{res.stdout}{res.stderr}")


def _in_host(net: NetUp, site: str, *cmd: str) -> subprocess.CompletedProcess[str]:
    nsenter = shutil.which("nsenter")
    assert nsenter is not None, "the test enters the hosts' namespaces with nsenter"
    pid = net.state.host_pids[site]
    return subprocess.run([nsenter, f"--net=/proc/{pid}/ns/net", "--", *cmd], capture_output=True, text=True,
                          timeout=30, check=False)


def test_every_host_of_a_network_up_reaches_every_other(net_up: NetUp) -> None:
    pairs = list(itertools.permutations(net_up.plan.hosts, 2))

    answered = [_in_host(net_up, a.site, "ping", "-c1", "-W2", b.ip).returncode == 0 for a, b in pairs]

    assert net_up.state.connectivity == "best-effort"
    assert answered == [True] * len(pairs)


def test_schedule_install_then_remove_on_the_running_network(net_up: NetUp) -> None:
    installed = subprocess.run(_netai("schedule", "--install", "--scheduler", "mst", "--locals", "2", "--seed", "3",
                                      "--json"), cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0, installed.stderr
    report = json.loads(installed.stdout)
    task_id = report["task_id"]
    during = net_up.client.tasks()
    shown = dashboard_tasks(net_up).get(f"installed/{task_id}")
    flows = subprocess.run(_netai("flows", "--task", str(task_id), "--json"), cwd=ROOT, capture_output=True,
                           text=True, timeout=60)

    removed = subprocess.run(_netai("schedule", "--remove", str(task_id)), cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
    again = subprocess.run(_netai("schedule", "--remove", str(task_id)), cwd=ROOT, capture_output=True,
                           text=True, timeout=60)

    assert [t["task_id"] for t in during] == [task_id]
    assert shown is not None and shown["state"] == "installed"  # on the dashboard, with its trees
    assert shown["schedule"]["hops"]["broadcast"] and shown["schedule"]["hops"]["upload"]
    assert report["installed"]["entries"] > 0 and report["run"] == net_up.state.run_id
    entries = json.loads(flows.stdout)
    assert flows.returncode == 0 and len(entries) == report["installed"]["entries"]
    assert {f["task"] for f in entries} == {task_id}
    assert removed.returncode == 0, removed.stderr
    assert net_up.client.tasks() == []
    assert again.returncode == 2 and f"no task {task_id} is installed" in again.stderr


def test_a_task_attached_to_the_running_network_completes_and_its_flows_show_while_it_runs(
    net_up: NetUp, tmp_path: Path
) -> None:
    proc = subprocess.Popen(_netai("task", "run", "--attach", "--scheduler", "mst", "--locals", "2", "--rounds", "2",
                                   "--json", "--log-dir", str(tmp_path)),
                            cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen: dict[int, int] = {}  # task id -> most task entries seen at once in `netai flows`' source
    drawn: dict[str, dict[str, Any]] = {}  # the tasks the live dashboard showed meanwhile
    deadline = time.monotonic() + ATTACH_TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline:
        counts: dict[int, int] = {}
        for f in net_up.client.flows():
            if f["task"] is not None:
                counts[f["task"]] = counts.get(f["task"], 0) + 1
        for task_id, n in counts.items():
            seen[task_id] = max(seen.get(task_id, 0), n)
        drawn.update(dashboard_tasks(net_up))
        time.sleep(0.2)  # polling the live flow table while the task runs, bounded by the deadline
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate()

    assert proc.returncode == 0, err[-3000:]
    result = json.loads(out)
    task_id = result["task"]["id"]
    assert [r["round"] for r in result["rounds"]] == [1, 2]
    assert all(0.0 <= r["accuracy"] <= 1.0 and r["latency_s"] > 0 for r in result["rounds"])
    assert result["backend"] == "attached" and result["run"] == net_up.state.run_id
    assert list(seen) == [task_id] and seen[task_id] > 0  # its entries were on the switches while it ran
    on_page = drawn.get(f"mst/{task_id}")  # recorded in net up's database: shown once, not also as "installed"
    assert on_page is not None and on_page["schedule"]["hops"]["broadcast"], sorted(drawn)
    assert f"installed/{task_id}" not in drawn
    assert net_up.client.tasks() == []  # and removed at its end
    assert all(f["kind"] != "task" for f in net_up.client.flows())
    state = next(s for s in run_states() if s.run_id == net_up.state.run_id)
    assert state.db_path  # `net up` records a results database: the task is in it, done, with its rounds
    assert result["recorded_in"] == state.db_path
    with sqlite3.connect(state.db_path) as db:
        task_state = db.execute("SELECT state FROM tasks WHERE run_id = ? AND task_id = ?",
                                (state.db_run_id, task_id)).fetchone()
        rounds = db.execute("SELECT count(*) FROM rounds WHERE run_id = ? AND task_id = ?",
                            (state.db_run_id, task_id)).fetchone()
        nodes = db.execute("SELECT count(*) FROM node_rounds WHERE run_id = ? AND task_id = ?",
                           (state.db_run_id, task_id)).fetchone()
    assert task_state == ("done",) and rounds == (2,) and nodes[0] >= 2 * 3


def test_net_link_cuts_and_restores_a_link_the_controller_sees(net_up: NetUp) -> None:
    def link(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(_netai("net", "link", *args), cwd=ROOT, capture_output=True, text=True, timeout=60)

    def down() -> set[tuple[str, str]]:
        return {tuple(sorted(p["link"])) for p in net_up.client.topology()["ports_down"]}  # type: ignore[misc]

    unknown = link("A", "Atlantis", "down")
    assert unknown.returncode == 2 and "Atlantis" in unknown.stderr, unknown
    try:
        cut = link("A", "B", "down")
        assert cut.returncode == 0 and "saw it" in cut.stdout, (cut.stdout, cut.stderr)
        assert ("A", "B") in down()
        assert _in_host(net_up, "A", "ping", "-c1", "-W1", net_up.plan.host("B").ip).returncode != 0
    finally:
        back = link("A", "B", "up")
    assert back.returncode == 0 and "saw it" in back.stdout, (back.stdout, back.stderr)
    assert ("A", "B") not in down()
    assert _in_host(net_up, "A", "ping", "-c1", "-W2", net_up.plan.host("B").ip).returncode == 0
