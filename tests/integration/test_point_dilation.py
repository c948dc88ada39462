"""A K per point for real (issue 45 item 3), on a tiny topology: two points (1 and 2 locals), each in
an emulation of its own at its own K, into one run and one results database. The run records the K
of each point and each point's wall time and its parts; every training of a point was modelled at
that point's K (its role's modelled time in wall seconds over the same time recorded in emulated
seconds); the run clock goes on from one point to the next; the report and the printed summary give
K per point. With ``time_dilation: auto, per_point: true`` each point is calibrated by trials of its
own, in a folder of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.results.db import ResultsDB
from tests.integration.test_experiment import leftovers, run_config
from workers.config import file_stem

pytestmark = [pytest.mark.root, pytest.mark.slow]

#: The two points' Ks (the mapping form): far enough apart that a training at one is not taken for the other.
KS = {1: 2.0, 2: 8.0}


def _config(tmp_path: Path, emulation: dict[str, Any]) -> Path:
    config = tmp_path / "per-point.yaml"
    config.write_text(yaml.safe_dump({
        "name": "per-point", "topology": "ring:4", "schedulers": ["mst"], "locals": [1, 2], "tasks_per_point": 1,
        "task": {"model": "mlp", "model_args": {"hidden": 200, "layers": 2}, "rounds": 2},
        "emulation": {"backend": "process", **emulation}, "background": {"enabled": False}}))
    return config


def _trainings_k(run_dir: Path, db: ResultsDB) -> dict[int, set[float]]:
    """Per number of locals, the K each modelled training ran at: what its role held the update for
    (``train_end``'s ``modelled_s``, wall seconds) over what the run recorded (emulated seconds)."""
    locals_of = {r["task_id"]: r["n_locals"] for r in db.query("SELECT task_id, n_locals FROM tasks")}
    recorded = {(r["task_id"], r["round"], file_stem(r["site"])): r["modelled_s"]
                for r in db.query("SELECT task_id, round, site, modelled_s FROM trainings")}
    out: dict[int, set[float]] = {}
    for events in run_dir.glob("tasks/mst-*/*.events.jsonl"):
        task_id, stem = int(events.parent.name.split("-")[-1]), events.name.removesuffix(".events.jsonl")
        for line in events.read_text().splitlines():
            e = json.loads(line)
            emulated = recorded.get((task_id, e.get("round"), stem))
            if e.get("event") == "train_end" and e.get("modelled_s") and emulated:
                out.setdefault(locals_of[task_id], set()).add(round(e["modelled_s"] / emulated, 1))
    return out


def test_each_point_runs_in_its_own_emulation_at_its_own_k(tmp_path: Path) -> None:
    config = _config(tmp_path, {"time_dilation": {str(n): k for n, k in KS.items()}})

    status, stdout, run_dir, db = run_config(config, tmp_path / "runs", timeout=900)

    assert status == 0, stdout[-3000:]
    env = db.run(1)["environment"]
    assert env["time_dilation_per_point"] == {"1": 2.0, "2": 8.0} and env["time_dilation"] == 8.0
    walls = env["wall_per_point"]
    for n, k in KS.items():
        w = walls[str(n)]
        assert w["k"] == k and w["bringup_s"] > 0 and w["emulated_s"] > 0
        assert w["tasks_s"] == pytest.approx(w["emulated_s"] * k, rel=0.01)
        assert w["wall_s"] >= w["bringup_s"] + w["tasks_s"] and w["calibration_s"] < 1.0  # given: no trials
    assert _trainings_k(run_dir, db) == {n: {k} for n, k in KS.items()}
    tasks = sorted(db.query("SELECT n_locals, arrival_s FROM tasks"), key=lambda r: r["n_locals"])
    assert [r["n_locals"] for r in tasks] == [1, 2]
    # the second point's clock went on from the first's (emulated_s is rounded to the millisecond)
    assert tasks[1]["arrival_s"] >= walls["1"]["emulated_s"] - 0.0005
    rounds = db.query("SELECT latency_s FROM rounds")
    assert len(rounds) == 4 and all(r["latency_s"] > 0 for r in rounds)
    report = (run_dir / "report.md").read_text()
    assert "- time dilation per point: K=2 at 1 locals, K=8 at 2 locals; wall time " in report
    assert "- 2 locals: K=8 (set in the config); wall time " in report and "bring-up" in report
    assert "| mst | 1 (K=2) | " in report and "| mst | 2 (K=8) | " in report
    assert "fidelity mst at 2 locals (K=8): " in stdout and "time dilation per point: " in stdout
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}


def test_auto_per_point_calibrates_each_point_on_its_own(tmp_path: Path) -> None:
    config = _config(tmp_path, {"time_dilation": "auto", "per_point": True, "max_time_dilation": 2})

    status, stdout, run_dir, db = run_config(config, tmp_path / "runs", timeout=1200)

    assert status == 0, stdout[-3000:]
    env = db.run(1)["environment"]
    cals = env["time_dilation_calibration_per_point"]
    assert set(cals) == set(env["time_dilation_per_point"]) == {"1", "2"}
    for n in ("1", "2"):
        assert env["time_dilation_per_point"][n] == cals[n]["k"] in (1.0, 2.0)
        if not cals[n].get("reused_from"):  # this host may have chosen it before: then no trials
            assert cals[n]["trials"] and list((run_dir / "calibration" / f"{n}-locals").glob("k*-*/results.db"))
            # its last trial's emulation went on when that trial was faithful (its tasks' folder beside the trial's)
            assert env["wall_per_point"][n]["on_trial_emulation"] is cals[n]["faithful"]
            if cals[n]["faithful"]:
                tasks = {p.resolve().parent.name for p in (run_dir / "tasks").iterdir()
                         if p.resolve().parent.parent.parent.name.startswith("emulation-k")}
                assert tasks == {"tasks-2"}
        else:  # no trial: its own emulation
            assert not env["wall_per_point"][n]["on_trial_emulation"] and env["wall_per_point"][n]["bringup_s"] > 0
    assert "calibrating on 1 task of 1 locals" in stdout or "as this host chose" in stdout
    report = (run_dir / "report.md").read_text()
    assert "- time dilation per point: " in report and "- 1 locals: K=" in report
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}
