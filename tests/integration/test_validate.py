"""`netai validate` end to end, for real: a tiny config run emulated (Mininet, OVS, the controller,
worker processes) and simulated on the same tasks, and the comparison written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.root, pytest.mark.slow]

TINY = {
    "name": "tiny-validate", "topology": "triangle", "schedulers": ["spff", "mst"], "locals": [2],
    "tasks_per_point": 1, "seed": 1,
    "task": {"model": "mlp", "model_args": {"hidden": 800, "layers": 2}, "rounds": 2},
    "emulation": {"max_link_mbps": 100, "backend": "process"}, "background": {"enabled": False},
}
#: The 2.8 MB MLP: carried bytes are its copies' frames (the simulation counts their headers too); a
#: model of a few KB would be dominated by what it does not count (connection set-up, HELLO/READY).


def _validate(raw: dict[str, Any], tmp_path: Path, out: Path, *, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """`netai validate` of the config `raw` (written to `tmp_path`) into `out`, with no calibration; its
    runs draw no plots of their own (their figures are tested with `netai experiment`'s)."""
    config = tmp_path / f"{raw['name']}.yaml"
    config.write_text(yaml.safe_dump(raw))
    return subprocess.run([sys.executable, "-m", "orchestrator.cli", "validate", str(config), "--out", str(out),
                           "--calibration", str(tmp_path / "no-calibration.json"), "--no-figures"],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)


def test_validate_runs_a_tiny_config_both_ways_and_carried_bytes_agree(tmp_path: Path) -> None:
    out = tmp_path / "runs"

    proc = _validate(TINY, tmp_path, out, timeout_s=600)

    assert proc.returncode in (0, 1), (proc.stdout + proc.stderr)[-3000:]
    folders = list(out.glob("tiny-validate-validate-*"))
    assert len(folders) == 1, folders
    doc = json.loads((folders[0] / "validation.json").read_text())
    # Exit 1 exactly when the emulated reference (undilated here) was not faithful, which it then says first.
    assert proc.returncode == (0 if doc["reference_faithful"] else 1), (proc.stdout + proc.stderr)[-3000:]
    first = (folders[0] / "validation.txt").read_text().splitlines()[0]
    assert first.startswith("the emulated reference is NOT faithful") is not doc["reference_faithful"]
    # Both runs are inside the folder, the same tasks compared, one point per scheduler.
    assert Path(doc["emulated_run"]).parent == folders[0] and Path(doc["simulated_run"]).parent == folders[0]
    assert doc["tasks_compared"] == 2 and doc["calibrated"] is False
    assert sorted((p["scheduler"], p["n_locals"]) for p in doc["points"]) == [("mst", 2), ("spff", 2)]
    for p in doc["points"]:
        iv = p["latency"]
        assert p["emulated_s"] > 0 and p["simulated_s"] > 0
        assert iv["low"] <= iv["ratio"] <= iv["high"] and iv["tasks"] == 1
        # Carried bytes have one definition in both engines (each link a task's bytes cross, once).
        assert p["carried_ratio"] == pytest.approx(1.0, abs=0.02)
    assert [(c["numerator"], c["denominator"], c["n_locals"]) for c in doc["claims"]] == [("mst", "spff", 2)]
    # No background: nothing to replay; both engines' schedulers decided the same.
    assert doc["scheduler_background"] == "none: no background"
    assert doc["decisions_compared"] == 2 and doc["decisions_differing"] == []
    assert "decisions (scheduler, task): the same in both engines for all 2" in proc.stdout
    assert (folders[0] / "sim_vs_emu.png").stat().st_size > 0  # the comparison's figure, drawn with --no-figures
    assert not [p.name for run in ("emulated_run", "simulated_run") for p in Path(doc[run]).glob("*.png")]
    assert "sim/emu" in proc.stdout and "carried bytes (sim/emu per point)" in proc.stdout
    report = (Path(doc["simulated_run"]) / "report.md").read_text()
    assert report.splitlines()[0].startswith("**Uncalibrated:**")


def test_validate_of_a_sweep_validates_each_entry_and_draws_both_engines_against_the_models_size(
        tmp_path: Path) -> None:
    sweep = {**TINY, "name": "tiny-sweep", "task": {**TINY["task"], "model_args": {"hidden": 64, "layers": 1}},
             "sweep": [{"task": {"model_args": {"hidden": 64, "layers": 1}}},
                       {"task": {"model_args": {"hidden": 800, "layers": 2}}}]}
    out = tmp_path / "runs"

    proc = _validate(sweep, tmp_path, out, timeout_s=900)

    (folder,) = out.glob("tiny-sweep-validate-*")
    entries = sorted(p for p in folder.glob("tiny-sweep-*-validate-*"))
    assert len(entries) == 2, (proc.stdout + proc.stderr)[-3000:]
    docs = [json.loads((e / "validation.json").read_text()) for e in entries]
    assert proc.returncode == (0 if all(d["reference_faithful"] for d in docs) else 1), proc.stderr[-2000:]
    # Each entry compared its own tasks, at its own model size, into the store the tests use.
    sizes = sorted(d["record"]["regime"]["model_bytes"][1] for d in docs)
    assert sizes[0] < 30_000 < 2_000_000 < sizes[1]
    table = (folder / "validation.md").read_text()
    assert table.count("| mst / spff at 2 |") == 2 and "geometric-mean error" in table
    assert (folder / "regimes_sim_vs_emu.png").stat().st_size > 0
    assert "sweep tiny-sweep: mean round latency sim/emu over every entry's points: worst error" in proc.stdout
