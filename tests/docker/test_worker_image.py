"""The worker image: what Mininet and the agent need is inside; --if-stale is quick when nothing changed."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.runtime.backends import DEFAULT_IMAGE

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]


def test_if_stale_is_quick_and_image_is_complete() -> None:
    build = subprocess.run(["bash", "scripts/build_worker_image.sh", "--if-stale"], cwd=ROOT,
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr
    t0 = time.monotonic()
    again = subprocess.run(["bash", "scripts/build_worker_image.sh", "--if-stale"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0

    assert again.returncode == 0 and "up to date" in again.stdout
    assert elapsed < 10, f"--if-stale took {elapsed:.1f} s with nothing changed"
    probe = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", DEFAULT_IMAGE, "sh", "-c",
         "ifconfig lo >/dev/null && ethtool --version && bash --version >/dev/null && "
         "python -c 'import torch, safetensors, sklearn, workers.agent; print(torch.__version__)'"],
        capture_output=True, text=True, timeout=120,
    )
    assert probe.returncode == 0, probe.stderr
    assert "ethtool" in probe.stdout and "2.13.0" in probe.stdout
