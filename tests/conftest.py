"""Shared fixtures and the skip rules for tests that need root, Open vSwitch or Docker.

In CI (CI=true) such a test is never skipped: `make test` installs and starts what it needs,
so a missing facility makes the test fail, as it should.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


def _have_root_net() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    if shutil.which("mnexec") is None:
        return "needs Mininet (mnexec)"
    if subprocess.run(["ovs-vsctl", "--timeout=3", "show"], capture_output=True).returncode != 0:
        return "needs Open vSwitch running"
    return None


def _have_docker() -> str | None:
    if shutil.which("docker") is None:
        return "needs the docker client"
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        return "needs a running Docker daemon"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    in_ci = os.environ.get("CI") == "true"
    checks = {"root": _have_root_net, "docker": _have_docker}
    reasons: dict[str, str | None] = {}
    for item in items:
        for marker, check in checks.items():
            if marker in item.keywords:
                if marker not in reasons:
                    reasons[marker] = check()
                reason = reasons[marker]
                if reason and not in_ci:
                    item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(autouse=True)
def _no_host_calibration(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated runs in tests look up an empty calibration store, not this host's (a test that
    wants one sets ``NETAI_CALIBRATION`` itself): their figures must not depend on the machine."""
    monkeypatch.setenv("NETAI_CALIBRATION", str(tmp_path_factory.mktemp("calibration") / "calibration.json"))
