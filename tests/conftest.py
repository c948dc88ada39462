"""Shared fixtures and the skip rules for tests that need root, Open vSwitch or Docker.

In CI (CI=true) such a test is never skipped: `make test` installs and starts what it needs,
so a missing facility makes the test fail, as it should.

The unit tests run first, then the other tests that need neither root nor Docker (the simulation's,
which emulate nothing and time nothing of the host's). When the stock-kernel tests (tests/guest) are
selected, their checks start in the background as soon as the suite is collected (the guest's build,
boot and checks take minutes and need no network of this host's); they overlap those tests, and the
guest's tests, next in order, wait for what is left; the emulations come after them, on a host the
guest no longer loads. ``NETAI_GUEST_EARLY=0`` runs them in their turn instead.

No test touches the user's caches: at session start the profile cache (``NETAI_CACHE_DIR``,
`orchestrator.runtime.profiles.default_cache`) and the calibration store (``NETAI_CALIBRATION``,
`orchestrator.simulation.calibration.default_path`) are pointed into a folder of the session's
own, in the environment, so that the subprocesses the tests start (``netai ...``) inherit them; it is
removed at the end. Each test also gets an empty calibration store and an empty store of validations
(``NETAI_VALIDATIONS``, `orchestrator.experiment.validation_store.default_path`) of its own
(`_no_host_calibration`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

#: The environment variables `pytest_configure` points into the session's folder, and where.
SESSION_STORES = {"NETAI_CACHE_DIR": "cache", "NETAI_CALIBRATION": "state/calibration.json"}
_session: dict[str, str | None] = {}


def pytest_configure(config: pytest.Config) -> None:
    root = tempfile.mkdtemp(prefix="netai-tests-")
    _session.update({name: os.environ.get(name) for name in SESSION_STORES}, root=root)
    for name, where in SESSION_STORES.items():
        os.environ[name] = str(Path(root) / where)


def pytest_unconfigure(config: pytest.Config) -> None:
    root = _session.pop("root", None)
    if root is None:
        return
    for name in SESSION_STORES:
        old = _session.pop(name, None)
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old
    shutil.rmtree(root, ignore_errors=True)


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
    items[:] = sorted(items, key=_phase)  # stable: each phase keeps its order


def _phase(item: pytest.Item) -> int:
    """Unit tests first, then the others that need neither root nor Docker, then the stock-kernel
    guest's (started early, see the module docstring), then the rest."""
    path = item.path.as_posix()
    if "/tests/unit/" in path:
        return 0
    if "/tests/guest/" in path:
        return 2
    return 1 if "root" not in item.keywords and "docker" not in item.keywords else 3


def pytest_collection_finish(session: pytest.Session) -> None:
    if session.config.option.collectonly or os.environ.get("NETAI_GUEST_EARLY", "1") == "0":
        return
    guest = [i for i in session.items if "/tests/guest/test_stock_kernel.py" in i.path.as_posix()
             and i.get_closest_marker("skip") is None]
    if guest:
        from tests.guest import driver

        driver.start_early()


def pytest_sessionfinish(session: pytest.Session) -> None:
    from tests.guest import driver

    driver.stop_early()


@pytest.fixture(autouse=True)
def _no_host_calibration(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated runs in tests look up an empty calibration store, not this host's (a test that
    wants one sets ``NETAI_CALIBRATION`` itself): their figures must not depend on the machine. So
    with the validations a simulated run cites, and those a test's `netai validate` records."""
    folder = tmp_path_factory.mktemp("calibration")
    monkeypatch.setenv("NETAI_CALIBRATION", str(folder / "calibration.json"))
    monkeypatch.setenv("NETAI_VALIDATIONS", str(folder / "validations.json"))
