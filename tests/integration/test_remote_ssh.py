"""A site's server on a Docker daemon reached over SSH (`orchestrator.runtime.remote`), for real.

The test starts an sshd bound to 127.0.0.1 on a spare port with a host key and a client key made
for it, runs an experiment in which one site's container is made through Docker over that SSH
connection (key authentication, host key checked against a known_hosts file made for the test),
and checks that the task completed and that the connection was really used (sshd's log). A
known_hosts file with another key for the same host is refused before anything starts.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.integration.sshd import Sshd
from tests.integration.test_experiment import leftovers, netai, run_config

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow]

def _config(tmp_path: Path, sshd: Sshd, known_hosts: Path) -> Path:
    path = tmp_path / "remote.yaml"
    path.write_text(yaml.safe_dump({
        "name": "remote", "topology": "sndlib/nobel-us", "schedulers": ["mst"], "locals": [2],
        "tasks_per_point": 1, "seed": 1, "compute_sites": ["Seattle", "Palo-Alto", "Boulder"],
        "task": {"model": "mlp", "rounds": 2},
        "emulation": {"backend": "docker"}, "background": {"enabled": False},
        "compute": {"servers": [{"sites": ["Palo-Alto"],
                                 "docker": f"ssh://root@127.0.0.1:{sshd.port}",
                                 "key": str(sshd.client_key), "known_hosts": str(known_hosts)}]},
    }))
    return path


def test_a_site_served_through_docker_over_ssh_completes_its_task(tmp_path: Path, sshd: Sshd) -> None:
    status, stdout, _, db = run_config(_config(tmp_path, sshd, sshd.known_hosts), tmp_path / "runs",
                                             timeout=900)

    assert status == 0, stdout[-3000:]
    run = db.run(1)
    assert run["status"] == "completed"
    url = f"ssh://root@127.0.0.1:{sshd.port}"
    assert run["environment"]["remote_sites"] == {"Palo-Alto": url}
    tasks = db.query("SELECT state, global_site, local_sites_json FROM tasks")
    assert [t["state"] for t in tasks] == ["done"]
    # three compute sites, a task of G and two locals: the site served over SSH takes part
    assert "Palo-Alto" in tasks[0]["global_site"] + tasks[0]["local_sites_json"]
    assert len(db.query("SELECT * FROM rounds")) == 2
    log = sshd.log.read_text()
    assert "Accepted publickey for root" in log, log[-2000:]
    # the Docker API requests for that site's container (create, start, exec, inspect) went over it
    assert log.count("Starting session: command for root") >= 3, log[-2000:]
    assert str(sshd.client_key) not in stdout and "PRIVATE KEY" not in stdout
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}


def test_a_wrong_host_key_is_refused_before_anything_starts(tmp_path: Path, sshd: Sshd) -> None:
    proc = netai("experiment", str(_config(tmp_path, sshd, sshd.wrong_known_hosts)), "--out",
                 str(tmp_path / "runs"), "--no-progress")
    stdout, _ = proc.communicate(timeout=300)

    assert proc.returncode == 2, stdout[-3000:]
    assert "host key does not match" in stdout and "refused" in stdout, stdout[-2000:]
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}
