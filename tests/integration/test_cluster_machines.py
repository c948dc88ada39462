"""The emulation across machines that are not this one, for real: test machines
(`tests.integration.machines`, containers on an internal Docker network) as a lab's servers.

One module-scoped set of machines serves every test here: `netai cluster check` before and after
`netai cluster prepare`, and a wrong host key refused.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.emulation.cluster_deploy import project_version
from tests.integration.machines import Machines

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow]


def _config(path: Path, machines: Machines, **extra: Any) -> Path:
    servers = ["localhost", *[m.server_entry() for m in machines.machines]]
    path.write_text(yaml.safe_dump({"name": "machines", "topology": "nsfnet",
                                    "emulation": {"cluster": {"servers": servers}}, **extra}))
    return path


def _netai(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", *argv], capture_output=True, text=True,
                          timeout=600, check=False)


def test_prepare_ships_the_project_and_check_reports_each_server(tmp_path: Path, machines: Machines) -> None:
    config = _config(tmp_path / "c.yaml", machines)
    before = _netai("cluster", "check", str(config), "--json")
    assert before.returncode == 1, before.stdout + before.stderr
    assert all(r["reachable"] and r["host_key"] == "ok" and r["project"] == "absent"
               for r in json.loads(before.stdout)), before.stdout

    prepared = _netai("cluster", "prepare", str(config))
    assert prepared.returncode == 0, prepared.stdout + prepared.stderr

    after = _netai("cluster", "check", str(config), "--json")
    assert after.returncode == 0, after.stdout + after.stderr
    reports = json.loads(after.stdout)
    assert [r["server"] for r in reports] == [f"{m.ssh}:22" for m in machines.machines]
    for r in reports:
        assert r["ok"] and r["missing"] == [] and r["problems"] == [], r
        assert r["project"] == project_version()
        assert r["packages"]["torch"] and r["packages"]["torch"].startswith("2.13.0"), r
        # the containers share this kernel's clock: the offset is within the round trip's half
        assert abs(r["clock_offset_ms"]) <= r["clock_uncertainty_ms"] + 5.0, r
        assert r["underlay_mtu"] == 1500  # a Docker bridge's MTU
    for m in machines.machines:
        assert "orchestrator" in m.exec("ls", "/root/.netai/deploy/src").split()


def test_a_wrong_host_key_is_reported(tmp_path: Path, machines: Machines) -> None:
    m1, m2 = machines.machines[:2]
    swapped = {"ssh": m1.ssh, "key": str(m1.key), "known_hosts": str(m2.known_hosts)}
    config = tmp_path / "wrong.yaml"
    config.write_text(yaml.safe_dump({"emulation": {"cluster": {"servers": ["localhost", swapped]}}}))

    res = _netai("cluster", "check", str(config), "--json")

    assert res.returncode == 1
    (report,) = json.loads(res.stdout)
    assert report["host_key"] == "refused" and not report["reachable"], report
    assert str(m2.known_hosts) in report["error"]
