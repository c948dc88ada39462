"""No worker container outlives `netai task run --backend docker`: not on Ctrl-C in the middle of a
round, not when the roles fail, and nothing starts for a model that cannot be built."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.runtime.backends import RUN_LABEL, docker_client

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def _netai(*args: str) -> list[str]:
    return [sys.executable, "-m", "orchestrator.cli", "task", "run", "--topology", "triangle", "--locals", "2",
            "--backend", "docker", *args]


def _our_containers() -> list[str]:
    client = docker_client()
    try:
        return [c.name for c in client.containers.list(all=True, filters={"label": RUN_LABEL})]
    finally:
        client.close()


def test_ctrl_c_mid_task_removes_every_container(tmp_path: Path) -> None:
    before = _our_containers()
    proc = subprocess.Popen(_netai("--rounds", "500", "--model", "cnn", "--log-dir", str(tmp_path)), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        seen: list[str] = []
        while not any("round_start" in p.read_text() for p in tmp_path.glob("workers/tasks/agents/*.events.jsonl")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the task did not start a round within 120 s"
            time.sleep(0.2)
        seen = [n for n in _our_containers() if n not in before]
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert len(seen) == 3, f"one container per host while running, got {seen}"
    assert proc.returncode == 130, err
    assert [n for n in _our_containers() if n not in before] == []


def test_a_model_that_raises_is_refused_before_anything_starts(tmp_path: Path) -> None:
    before = _our_containers()
    res = subprocess.run(_netai("--rounds", "1", "--model", "mlp", "--model-arg", "bogus=1", "--log-dir",
                                str(tmp_path)), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("netai: ") and "cannot be built" in last and "bogus" in last
    assert not (tmp_path / "emulation").exists(), "nothing was started"
    assert [n for n in _our_containers() if n not in before] == []


def test_failing_roles_remove_every_container(tmp_path: Path) -> None:
    # builds (the preflight) but fails in every role's warm-up pass on the servers
    model = tmp_path / "broken.py"
    model.write_text("from torch import nn\n\nclass Broken(nn.Linear):\n    def forward(self, x):\n"
                     "        raise RuntimeError('forward is broken')\n\n"
                     "def make(*, input_shape, num_classes):\n    return Broken(64, num_classes)\n")
    before = _our_containers()
    # training as measured: with modelled compute the model's profile (trained before anything starts)
    # refuses it at once with status 2; here the roles must start and fail
    res = subprocess.run(_netai("--rounds", "1", "--model", f"{model}:make", "--compute-timing", "measured",
                                "--log-dir", str(tmp_path / "logs")),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 1
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("netai: task") and "failed" in last and "forward is broken" in last
    assert [n for n in _our_containers() if n not in before] == []

    # with modelled compute (the default) the same model is refused before anything starts
    res = subprocess.run(_netai("--rounds", "1", "--model", f"{model}:make", "--log-dir", str(tmp_path / "modelled")),
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-2000:]
    assert "forward is broken" in res.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "modelled" / "emulation").exists(), "nothing was started"


def test_a_user_model_file_runs_in_containers_without_an_image_rebuild(tmp_path: Path) -> None:
    model = tmp_path / "my models" / "tiny.py"
    model.parent.mkdir()
    model.write_text("from torch import nn\n\ndef make(*, input_shape, num_classes, width=16):\n"
                     "    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))\n")
    client = docker_client()
    try:
        image_before = client.images.get("netai-worker:latest").id
    finally:
        client.close()
    before = _our_containers()
    res = subprocess.run(_netai("--rounds", "2", "--model", f"{model}:make", "--model-arg", "width=24", "--json",
                                "--log-dir", str(tmp_path / "logs")), cwd=ROOT, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout)
    assert out["backend"] == "docker" and [r["round"] for r in out["rounds"]] == [1, 2]
    assert out["model_bytes"] == (64 * 24 + 24 + 24 * 10 + 10) * 4, "the user's model, shipped by content"
    client = docker_client()
    try:
        assert client.images.get("netai-worker:latest").id == image_before, "no image rebuild"
    finally:
        client.close()
    assert [n for n in _our_containers() if n not in before] == []
