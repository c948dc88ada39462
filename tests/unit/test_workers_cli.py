"""`netai task run` with the loopback backend (no root), and its one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main


@pytest.mark.slow
def test_task_run_loopback_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["task", "run", "--topology", "triangle", "--scheduler", "mst", "--locals", "2", "--rounds", "2",
                   "--model", "mlp", "--model-arg", "hidden=16", "--backend", "loopback", "--json",
                   "--log-dir", str(tmp_path)])

    out = json.loads(capsys.readouterr().out)
    assert status == 0
    assert out["backend"] == "loopback" and out["scheduler"] == "mst"
    assert [r["round"] for r in out["rounds"]] == [1, 2]
    for r in out["rounds"]:
        assert set(r) >= {"latency_s", "broadcast_s", "train_s", "upload_s", "accuracy"}
        assert r["latency_s"] > 0 and 0 <= r["accuracy"] <= 1
    assert out["model_bytes"] == (64 * 16 + 16 + 16 * 10 + 10) * 4


@pytest.mark.slow
def test_task_run_selects_locals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["task", "run", "--topology", "triangle", "--locals", "2", "--rounds", "2", "--select", "random",
                   "--select-arg", "k=1", "--select-arg", "seed=3", "--backend", "loopback", "--json",
                   "--log-dir", str(tmp_path)])

    out = json.loads(capsys.readouterr().out)
    assert status == 0
    assert [len(r["selected"]) for r in out["rounds"]] == [1, 1]
    assert all(r["upload_bytes"] > 0 for r in out["rounds"])


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--locals", "9"], "local models requested"),
        (["--locals", "2", "--model", "nope"], "unknown model"),
        (["--locals", "2", "--scheduler", "magic"], "unknown scheduler"),
        (["--locals", "2", "--rounds", "0"], "rounds"),
        (["--locals", "2", "--model-arg", "novalue"], "KEY=VALUE"),
        (["--locals", "2", "--select", "bogus"], "unknown selection policy"),
        (["--locals", "2", "--select", "random", "--select-arg", "k=0"], "k must be an integer >= 1"),
        (["--locals", "2", "--select-arg", "k"], "--select-arg takes KEY=VALUE"),
    ],
)
def test_task_run_bad_input_is_one_line_exit_2(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(["task", "run", "--topology", "triangle", "--backend", "loopback", *argv])

    err = capsys.readouterr().err
    assert status == 2
    assert needle in err and len(err.strip().splitlines()) == 1
