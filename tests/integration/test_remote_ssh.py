"""A site's server on a Docker daemon reached over SSH (`orchestrator.runtime.remote`), for real.

The test starts an sshd bound to 127.0.0.1 on a spare port with a host key and a client key made
for it, runs an experiment in which one site's container is made through Docker over that SSH
connection (key authentication, host key checked against a known_hosts file made for the test),
and checks that the task completed and that the connection was really used (sshd's log). A
known_hosts file with another key for the same host is refused before anything starts.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from tests.integration.test_experiment import leftovers, netai, run_config

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow]

SSHD = Path("/usr/sbin/sshd")


@dataclass
class Sshd:
    port: int
    client_key: Path
    known_hosts: Path
    wrong_known_hosts: Path
    log: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "netai-test", "-f", str(path)], check=True)
    kind, key = path.with_suffix(".pub").read_text().split()[:2]
    return f"{kind} {key}"


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[Sshd]:
    if not SSHD.exists() or shutil.which("ssh-keygen") is None:
        pytest.fail("openssh-server is not installed: run `sudo make setup`")
    d = tmp_path / "sshd"
    d.mkdir()
    d.chmod(0o700)
    host_pub = _keygen(d / "host_key")
    client_pub = _keygen(d / "client_key")
    other_pub = _keygen(d / "other_host_key")
    (d / "authorized_keys").write_text(client_pub + "\n")
    port = _free_port()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_pub}\n")
    (d / "wrong_known_hosts").write_text(f"[127.0.0.1]:{port} {other_pub}\n")
    config = d / "sshd_config"
    config.write_text("\n".join([
        f"ListenAddress 127.0.0.1:{port}", f"HostKey {d / 'host_key'}", f"AuthorizedKeysFile {d / 'authorized_keys'}",
        "PermitRootLogin prohibit-password", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
        "PubkeyAuthentication yes", "UsePAM no", "StrictModes no", f"PidFile {d / 'sshd.pid'}",
        "LogLevel VERBOSE", "",
    ]))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    log = d / "sshd.log"
    proc = subprocess.Popen([str(SSHD), "-D", "-e", "-f", str(config)], stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"sshd did not start: {log.read_text()[-2000:]}")
                time.sleep(0.1)
        yield Sshd(port, d / "client_key", d / "known_hosts", d / "wrong_known_hosts", log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


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
