"""An sshd for tests: bound to 127.0.0.1 on a spare port, a host key and a client key made for it.

`sshd` (a fixture) yields where everything is: the port, the client's key, a known_hosts file with
the server's host key and one with another key for the same host (to check that it is refused),
and sshd's log (``LogLevel VERBOSE``: accepted keys and sessions).
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
