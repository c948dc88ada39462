"""Runs keep the worker image in step with the checkout: the staleness check is really run."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime import backends

ROOT = Path(__file__).resolve().parents[2]


def test_the_check_runs_the_checkouts_build_script(monkeypatch: pytest.MonkeyPatch) -> None:
    assert backends.BUILD_SCRIPT == ROOT / "scripts" / "build_worker_image.sh"
    assert backends.BUILD_SCRIPT.is_file(), "a missing script would skip the check without a word"
    calls: list[list[str]] = []

    def run(cmd: list[str], **_kw: Any) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 0, stdout="netai-worker:latest is up to date", stderr="")

    monkeypatch.setattr(subprocess, "run", run)
    backends.ensure_worker_image(quiet=True)
    assert calls == [["bash", str(backends.BUILD_SCRIPT), "--if-stale"]]


def test_a_failed_build_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess, "run", lambda cmd, **_kw: subprocess.CompletedProcess(
        cmd, 1, stdout="", stderr="step 3\nno space left on device"))
    with pytest.raises(backends.ConfigError, match="no space left"):
        backends.ensure_worker_image(quiet=True)
