"""`netai cluster prepare/check`'s pure parts: what is shipped, its version, and the reports."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.emulation.cluster import LOCAL, SshResult, parse_cluster
from orchestrator.emulation.cluster_deploy import (
    ServerReport,
    probe,
    project_files,
    project_tar,
    project_version,
    remote_paths,
)


def _tree(root: Path) -> Path:
    (root / "workers" / "__pycache__").mkdir(parents=True)
    (root / "workers" / "agent.py").write_text("x = 1\n")
    (root / "workers" / "__pycache__" / "agent.cpython-311.pyc").write_bytes(b"\0")
    (root / "orchestrator").mkdir()
    (root / "orchestrator" / "__init__.py").write_text("")
    (root / "setup.py").write_text('setup(\n    version="1.2.3",\n)\n')
    return root


def test_the_shipped_files_are_the_packages_and_the_packaging_without_caches(tmp_path: Path) -> None:
    root = _tree(tmp_path)

    assert project_files(root) == ["orchestrator/__init__.py", "setup.py", "workers/agent.py"]
    with tarfile.open(fileobj=io.BytesIO(project_tar(root))) as tar:
        assert tar.getnames() == project_files(root)
        assert {m.mtime for m in tar.getmembers()} == {0}
    assert project_tar(root) == project_tar(root), "the same checkout gives the same bytes"


def test_the_version_changes_with_any_file(tmp_path: Path) -> None:
    root = _tree(tmp_path)
    v1 = project_version(root)
    (root / "workers" / "agent.py").write_text("x = 2\n")
    v2 = project_version(root)

    assert v1.startswith("1.2.3+") and v2.startswith("1.2.3+") and v1 != v2
    assert probe()["project"] == project_version(), "the probe speaks of the code it runs"
    (root / "orchestrator" / "__init__.py").write_text('__version__ = "4.5.6"\n')
    assert project_version(root).startswith("4.5.6+"), "the package's own version comes first (setup.py reads it)"
    (root / "setup.py").write_text("setup(version=VERSION)\n")
    (root / "orchestrator" / "__init__.py").write_text("")
    assert project_version(root).startswith("0+"), "a name, not a version: none is found"


def test_the_probe_gives_the_installed_versions_without_importing_them() -> None:
    script = ("import json, sys; from orchestrator.emulation.cluster_deploy import probe; p = probe(); "
              "print(json.dumps([p['packages'], sorted(n for n in ('torch', 'sklearn') if n in sys.modules)]))")
    packages, imported = json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                                   check=True).stdout)

    assert imported == [], "the probe imports none of the packages it reports"
    import numpy
    import torch

    assert packages["torch"] == torch.__version__ and packages["numpy"] == numpy.__version__
    assert all(isinstance(v, str) and v not in ("", "?") for v in packages.values()), packages


def test_the_probe_reports_a_package_that_is_not_there(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.emulation import cluster_deploy

    monkeypatch.setitem(cluster_deploy.PYTHON_PACKAGES, "netai_no_such_package", "none")
    monkeypatch.setitem(cluster_deploy.DISTRIBUTIONS, "netai_no_such_package", "netai-no-such-package")
    monkeypatch.setitem(cluster_deploy.PYTHON_PACKAGES, "json", "python3")  # found, no distribution
    monkeypatch.setitem(cluster_deploy.DISTRIBUTIONS, "json", "netai-no-such-package")

    packages = probe()["packages"]

    assert packages["netai_no_such_package"] is None and packages["json"] == "?"


def test_a_far_server_is_one_outside_loopback(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("x\n")
    (tmp_path / "kh").write_text("x\n")
    raw = {"servers": [LOCAL, {"ssh": "root@172.18.0.2", "key": str(tmp_path / "k"),
                               "known_hosts": str(tmp_path / "kh")}]}
    spec = parse_cluster(raw)
    assert spec is not None and spec.servers[1].far and not spec.servers[0].far


def test_a_report_is_ok_only_when_reached_without_problems() -> None:
    assert not ServerReport("s").ok
    assert ServerReport("s", reachable=True).ok
    assert not ServerReport("s", reachable=True, problems=["missing iperf3"]).ok
    assert remote_paths("/home/lab/")["python"] == "/home/lab/.netai/deploy/venv/bin/python"


def test_ssh_results_say_why_and_whether_the_host_key_was_refused() -> None:
    refused = SshResult(255, "", "No ED25519 host key is known for 10.0.0.2\nHost key verification failed.\n")
    assert refused.host_key_refused and refused.why == "Host key verification failed."
    assert not SshResult(1, "", "").host_key_refused and SshResult(1, "", "").why == "exit status 1"


def test_the_commands_refuse_a_config_without_servers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("name: x\n")

    assert main(["cluster", "check", str(config)]) == 2
    assert "no emulation.cluster servers" in capsys.readouterr().err
    assert main(["cluster", "prepare", str(tmp_path / "none.yaml")]) == 2
