"""A controller that dies at start-up is noticed before the Mininet build (issue 48): the bring-up
waits for its /health, which gives up as soon as its process exits, before building anything."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation import network
from orchestrator.emulation.network import Emulation, EmulationError
from tests.unit.test_emulation_datapath import small_plan


class _State:
    controller_pid: int | None = None
    rest_url = ""

    def save(self) -> None:
        pass


class _DyingController:
    """A controller whose process exits during its start-up (e.g. its port is taken)."""

    def __init__(self, plan: Any, log_dir: Path, env: dict[str, str]) -> None:
        self.pid = 4242
        self.client = type("Client", (), {"base_url": "http://127.0.0.1:1"})()
        self.stopped = False

    def start(self) -> None:
        pass

    def wait_ready(self, timeout_s: float) -> dict[str, Any]:
        raise RuntimeError("while waiting for the controller's REST API: controller exited with status 1; "
                           "log tail:\nOSError: [Errno 98] Address already in use")

    def stop(self) -> None:
        self.stopped = True


def test_a_controller_dead_at_start_up_stops_the_bring_up_before_the_build(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    # Prepare: every step before the controller passes; the build records that it ran
    built: list[str] = []
    emu = Emulation(small_plan(), datapath="kernel", log_dir=tmp_path / "emulation")
    monkeypatch.setattr(network, "ControllerProcess", _DyingController)
    monkeypatch.setattr(emu, "_clear_the_way", lambda: None)
    monkeypatch.setattr(emu, "_choose_datapath_and_delay", lambda: (True, False))
    monkeypatch.setattr(emu, "_new_state", lambda: _State())
    monkeypatch.setattr(emu, "_start_mininet", lambda **kw: built.append("mininet"))
    monkeypatch.setattr(network, "clean_run", lambda state, report=None: None)
    monkeypatch.setattr(emu, "leftovers", lambda: {})

    # Execute
    with pytest.raises(EmulationError, match="controller exited with status 1"):
        emu.start()

    # Assert: nothing was built, the controller was stopped
    assert built == []
    assert emu.controller is not None and emu.controller.stopped  # type: ignore[attr-defined]
