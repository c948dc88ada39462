"""The test machines themselves (`tests.integration.machines`): what a lab's server offers, for real."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.integration.machines import Machines, beyond_loopback, listeners

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow]


def test_the_machines_are_servers_on_an_internal_network(machines: Machines) -> None:
    net = json.loads(subprocess.run(["docker", "network", "inspect", machines.network], capture_output=True,
                                    text=True, check=True).stdout)[0]
    assert net["Internal"] is True, "nothing on the test network routes beyond this machine"
    for m in machines.machines:
        out = subprocess.run(
            ["ssh", "-F", "/dev/null", "-i", str(m.key), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
             "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={m.known_hosts}",
             m.ssh, "ovs-vsctl --version && mnexec -v && hostname && test ! -e /opt/netai/src/orchestrator && echo ok"],
            capture_output=True, text=True, timeout=30, check=False)
        assert out.returncode == 0, out.stderr
        assert m.name in out.stdout and out.stdout.strip().endswith("ok"), out.stdout
        # sshd, authenticated, on the machine's address; nothing else beyond loopback
        assert beyond_loopback(listeners(m.exec("ss", "-ltnH"))) == [f"{m.address}:22"]
