"""Machines for the tests: Docker containers that look like a lab's provisioned servers.

`machines` (a module-scoped fixture) starts `MACHINE_COUNT` containers of the ``netai-machine``
image (scripts/build_machine_image.sh: Open vSwitch, Mininet, sshd, Python with the worker's
packages; not the project) on a network it creates with ``docker network create --internal``:
nothing on it routes beyond this machine. Each machine has its own root file system and process
tree, an address on that network, an sshd (bound to that address) with a host key and an
authorized client key made for the test, and its own Open vSwitch daemons (the userspace datapath:
its bridges are netdev bridges, its ports veths and taps). ``--cap-add NET_ADMIN --cap-add
SYS_ADMIN`` gives it veth pairs and network namespaces; ``/dev/net/tun`` its bridges' taps.

Every container and the network carry the fixture's name prefix (``netai-machine-<pid>``) and are
removed afterwards, whatever happens (also when starting one of them failed).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

IMAGE = os.environ.get("NETAI_MACHINE_IMAGE", "netai-machine:latest")
MACHINE_COUNT = 2
#: What a machine runs at start: sshd on its address only, then Open vSwitch (ovsdb-server, and
#: ovs-vswitchd under the container's file limit, as scripts/provision.sh does where ovs-ctl cannot
#: raise it).
_BOOT = r"""
set -eu
addr=$1
cat > /etc/ssh/sshd_config.d/netai.conf <<EOF
ListenAddress $addr:22
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
LogLevel VERBOSE
EOF
/usr/sbin/sshd -E /var/log/sshd.log
/usr/share/openvswitch/scripts/ovs-ctl start --no-ovs-vswitchd --system-id=random >/dev/null
mkdir -p /var/log/openvswitch /var/run/openvswitch
ovs-vswitchd unix:/var/run/openvswitch/db.sock -vconsole:emer -vsyslog:err -vfile:info --no-chdir \
    --log-file=/var/log/openvswitch/ovs-vswitchd.log --pidfile=/var/run/openvswitch/ovs-vswitchd.pid --detach
ovs-vsctl --timeout=10 show >/dev/null
"""


@dataclass(frozen=True)
class Machine:
    """One test machine: its container, its address on the test network, how to reach it over SSH."""

    name: str
    address: str
    key: Path
    known_hosts: Path

    @property
    def ssh(self) -> str:
        return f"root@{self.address}"

    def server_entry(self) -> dict[str, str]:
        """The machine as an ``emulation.cluster.servers`` entry."""
        return {"ssh": self.ssh, "key": str(self.key), "known_hosts": str(self.known_hosts)}

    def exec(self, *argv: str, check: bool = True) -> str:
        """Run `argv` in the machine (``docker exec``, not over SSH: what the test looks at)."""
        res = subprocess.run(["docker", "exec", self.name, *argv], capture_output=True, text=True, check=False)
        if check and res.returncode != 0:
            raise AssertionError(f"{self.name}: {argv} failed: {res.stderr.strip()}")
        return res.stdout


@dataclass(frozen=True)
class Machines:
    """The machines, the test network's name and this host's address on it (its gateway)."""

    network: str
    gateway: str
    subnet: str
    machines: tuple[Machine, ...]


def _docker(*argv: str) -> str:
    res = subprocess.run(["docker", *argv], capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise RuntimeError(f"docker {' '.join(argv[:3])}: {res.stderr.strip()}")
    return res.stdout.strip()


def _keygen(path: Path) -> str:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "netai-test", "-f", str(path)], check=True)
    kind, key = path.with_suffix(".pub").read_text().split()[:2]
    return f"{kind} {key}"


def _start(name: str, network: str, d: Path, client_pub: str) -> Machine:
    _docker("run", "-d", "--name", name, "--hostname", name, "--network", network,
            "--cap-add", "NET_ADMIN", "--cap-add", "SYS_ADMIN", "--device", "/dev/net/tun",
            "--label", "org.netai.role=test-machine", IMAGE, "sleep", "infinity")
    info = json.loads(_docker("inspect", name))[0]
    address = info["NetworkSettings"]["Networks"][network]["IPAddress"]
    host_pub = _keygen(d / f"{name}-host_key")
    (d / f"{name}-authorized_keys").write_text(client_pub + "\n")
    _docker("cp", str(d / f"{name}-host_key"), f"{name}:/etc/ssh/ssh_host_ed25519_key")
    _docker("exec", name, "install", "-d", "-m", "700", "/root/.ssh")
    _docker("cp", str(d / f"{name}-authorized_keys"), f"{name}:/root/.ssh/authorized_keys")
    _docker("exec", name, "chmod", "600", "/etc/ssh/ssh_host_ed25519_key")
    _docker("exec", name, "sh", "-c", _BOOT, "boot", address)
    known_hosts = d / f"{name}-known_hosts"
    known_hosts.write_text(f"{address} {host_pub}\n")
    return Machine(name, address, d / "client_key", known_hosts)


def restart(m: Machine) -> None:
    """Start a killed machine again, as a lab server reboots: the same container (its disk, so its
    Open vSwitch database, kept), its services started again at the same address."""
    _docker("start", m.name)
    info = json.loads(_docker("inspect", m.name))[0]
    networks = info["NetworkSettings"]["Networks"]
    address = next(iter(networks.values()))["IPAddress"]
    if address != m.address:  # its known_hosts entry and the config name the address
        raise RuntimeError(f"{m.name} came back at {address}, not {m.address}")
    _docker("exec", m.name, "sh", "-c", _BOOT, "boot", address)
    _wait_ssh((m,))


def _remove(prefix: str, network: str) -> None:
    names = subprocess.run(["docker", "ps", "-aq", "--filter", f"name=^{prefix}-"], capture_output=True,
                           text=True, check=False).stdout.split()
    if names:
        subprocess.run(["docker", "rm", "-f", *names], capture_output=True, check=False)
    subprocess.run(["docker", "network", "rm", network], capture_output=True, check=False)


@contextlib.contextmanager
def started_machines(count: int, workdir: Path) -> Iterator[Machines]:
    """`count` machines on a new internal network (keys in `workdir`); all removed on exit, whatever
    happens. Raises RuntimeError when Docker or the image is missing or a machine does not start."""
    if shutil.which("ssh-keygen") is None:
        raise RuntimeError("openssh is not installed: run `sudo make setup`")
    if subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True).returncode != 0:
        raise RuntimeError(f"no {IMAGE} image: run scripts/build_machine_image.sh (make test builds it)")
    prefix = f"netai-machine-{os.getpid()}"
    network = f"{prefix}-net"
    workdir.mkdir(parents=True, exist_ok=True)
    workdir.chmod(0o700)
    client_pub = _keygen(workdir / "client_key")
    try:
        _docker("network", "create", "--internal", "--label", "org.netai.role=test-network", network)
        net = json.loads(_docker("network", "inspect", network))[0]
        ipam = net["IPAM"]["Config"][0]
        subnet = ipam["Subnet"]
        gateway = ipam.get("Gateway") or str(next(ipaddress.IPv4Network(subnet).hosts()))
        found = tuple(_start(f"{prefix}-m{i + 1}", network, workdir, client_pub) for i in range(count))
        _wait_ssh(found)
        yield Machines(network, gateway, subnet, found)
    finally:
        _remove(prefix, network)


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machines]:
    with started_machines(MACHINE_COUNT, tmp_path_factory.mktemp("machines")) as found:
        yield found


def _wait_ssh(found: tuple[Machine, ...]) -> None:
    """Every machine's sshd answers (its listener is up before the first test connects)."""
    deadline = time.monotonic() + 20
    for m in found:
        while f"{m.address}:22 " not in m.exec("ss", "-ltnH", check=False):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{m.name}: sshd did not start: {m.exec('cat', '/var/log/sshd.log', check=False)}")
            time.sleep(0.1)


def listeners(ss_output: str) -> list[str]:
    """The local addresses (``addr:port``) of ``ss -ltnH`` (or ``-ltnpH``) output."""
    return [line.split()[3] for line in ss_output.splitlines() if line.strip()]


def beyond_loopback(addresses: list[str]) -> list[str]:
    """Those of `addresses` not on a loopback address (127.0.0.0/8, ::1)."""
    out = []
    for a in addresses:
        host = a.rsplit(":", 1)[0].strip("[]").split("%")[0]
        if host == "*" or not ipaddress.ip_address(host).is_loopback:
            out.append(a)
    return out
