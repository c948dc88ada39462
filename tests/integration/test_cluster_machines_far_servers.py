"""A site server on another machine, for real (`tests.integration.machines`), with a skewed clock.

A ring of six sites: r2 (a compute site) on the first test machine, r4 on the second, the other
compute site r3 here; one task of one local, so one of G and its local runs on the machine and the
other here. The first machine's sshd gives every session ``NETAI_TEST_CLOCK_SKEW_S`` (sshd's
``SetEnv``), so its site server stamps its events 5 s ahead of this machine (the machines share
this kernel's clock: the skew is the only difference). The run completes; its round figures that
mix both machines' times (broadcast, upload: a local's arrival against G's round start) are those
of a round of well under a second, which they would not be, by the skew, were the far events not
mapped onto this machine's clock; its control channel is a forwarded Unix socket, so nothing new
listens beyond loopback on the machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.results.db import ResultsDB
from tests.integration.machines import Machines, beyond_loopback, listeners
from tests.integration.test_experiment import leftovers

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow]

SKEW_S = 5.0


def _cli(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, check=False)


def test_a_site_server_on_a_machine_with_a_skewed_clock(tmp_path: Path, machines: Machines,
                                                         figures: list[str]) -> None:
    m1, m2 = machines.machines[:2]
    servers = ["localhost", m1.server_entry() | {"sites": ["r2"]}, m2.server_entry() | {"sites": ["r4"]}]
    config = tmp_path / "far.yaml"
    config.write_text(yaml.safe_dump({
        "name": "far", "topology": "ring:6", "schedulers": ["spff"], "locals": [1], "tasks_per_point": 1,
        "seed": 1, "compute_sites": ["r2", "r3"], "task": {"model": "mlp", "rounds": 3},
        "background": {"enabled": False}, "emulation": {"backend": "process", "cluster": {"servers": servers}},
    }))
    prepared = _cli("cluster", "prepare", str(config))
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr
    m1.exec("sh", "-c", 'echo "SetEnv NETAI_TEST_CLOCK_SKEW_S=$1" >> /etc/ssh/sshd_config.d/netai.conf', "skew",
            str(SKEW_S))
    m1.exec("sh", "-c", 'kill -HUP "$(cat /run/sshd.pid)"')
    before = set(beyond_loopback(listeners(m1.exec("ss", "-ltnH"))))

    res = _cli("experiment", str(config), "--out", str(tmp_path / "runs"), "--no-progress", "--no-figures")

    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    db = ResultsDB(next((tmp_path / "runs").glob("*/results.db")))
    (task,) = db.query("SELECT state, reason FROM tasks")
    assert task["state"] == "done", task
    rounds = db.query("SELECT round, latency_s, broadcast_s, upload_s FROM rounds ORDER BY round")
    assert [r["round"] for r in rounds] == [1, 2, 3]
    for r in rounds:  # mixing both machines' times: within the round, not off by the skew
        assert 0 <= r["broadcast_s"] < 1.0 and 0 <= r["upload_s"] < 1.0, r
        assert r["broadcast_s"] + r["upload_s"] <= r["latency_s"] + 1e-3, r
    log = next((tmp_path / "runs").glob("*/experiment.log")).read_text()
    offsets = [line for line in log.splitlines() if "clock offset" in line]
    assert len(offsets) == 1 and "'r2'" in offsets[0], offsets
    measured = float(offsets[0].split("clock offset ")[1].split()[0])
    assert abs(measured - SKEW_S) < 0.05, offsets[0]
    figures.append(f"site server on a test machine with a {SKEW_S:g} s clock skew: measured offset "
                   f"{measured:+.4f} s; rounds (latency / broadcast / upload, s): "
                   + "; ".join(f"{r['latency_s']:.3f} / {r['broadcast_s']:.3f} / {r['upload_s']:.3f}" for r in rounds))
    # the events there are on the machine's skewed clock, their copies here on this one; the machine's
    # run folder came back whole at the end (workers/far/<server>) and was removed there
    (far_file,) = (tmp_path / "runs").glob("*/workers/far/*/workers/tasks/*/*.events.jsonl")
    here_file = next((tmp_path / "runs").glob(f"*/workers/tasks/*/{far_file.name}"))
    far_t = [json.loads(x)["t"] for x in far_file.read_text().splitlines()]
    assert m1.exec("ls", "-A", "/root/.netai/runs").split() == []  # the run made the folder; its run folder is gone
    here_t = [json.loads(x)["t"] for x in here_file.read_text().splitlines()]
    assert len(far_t) == len(here_t) > 0
    assert all(abs(a - b - measured) < 1e-3 for a, b in zip(far_t, here_t, strict=True)), (far_t[:2], here_t[:2])
    marked = m1.exec("sh", "-c", 'grep -l "NETAI_RUN=" /proc/[0-9]*/environ 2>/dev/null || true').split()
    assert [p for p in marked if not p.startswith("/proc/self")] == [], "the far site server ended with the run"
    assert set(beyond_loopback(listeners(m1.exec("ss", "-ltnH")))) == before
    assert m1.exec("ovs-vsctl", "list-br").split() == []
    # worker containers are not looked at: the process backend starts none (another run's may exist)
    assert {k: v for k, v in leftovers().items() if k != "containers"} == {"bridges": [], "veths": [],
                                                                            "controller": []}
