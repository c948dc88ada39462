"""The controller's process (`orchestrator.emulation.controller_process`): started for real on
127.0.0.1 with no switch, it answers ``/health`` and runs without eventlet's own resolver."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.emulation.controller_process import CONTROLLER_ENV, ControllerProcess
from tests.unit.test_emulation_datapath import small_plan

pytest.importorskip("os_ken")

#: What the controller imports at its start: os-ken's manager, and the app it loads.
START_IMPORTS = "import sys; from os_ken.cmd.manager import main; import controller.app; "


def imported_dns(env: dict[str, str]) -> bool:
    """Whether a process with `env` that imports what the controller does at its start loads dnspython."""
    out = subprocess.run([sys.executable, "-W", "ignore", "-c", START_IMPORTS + "print('dns' in sys.modules)"],
                         env=env, capture_output=True, text=True, check=True, timeout=60)
    return out.stdout.strip() == "True"


def test_the_controllers_imports_leave_out_eventlets_resolver_with_its_environment() -> None:
    # Prepare: the environment without the controller's own, and with it
    plain = {k: v for k, v in os.environ.items() if k not in CONTROLLER_ENV}

    # Execute / Assert: eventlet loads dnspython unless told not to, so the setting is what leaves it out
    assert imported_dns(plain)
    assert not imported_dns({**plain, **CONTROLLER_ENV})


def test_a_started_controller_answers_and_carries_its_environment(tmp_path: Path) -> None:
    # Prepare
    controller = ControllerProcess(small_plan(), tmp_path)

    # Execute
    controller.start()
    try:
        health = controller.wait_ready(30.0)
        assert controller.pid is not None
        environ = Path(f"/proc/{controller.pid}/environ").read_bytes().split(b"\0")
    finally:
        status = controller.stop()

    # Assert: it answered with no switch connected, ran with the setting, and stopped when told
    assert health["switches_connected"] == 0
    assert b"EVENTLET_NO_GREENDNS=yes" in environ
    assert status is not None
    assert controller.exited() is not None
