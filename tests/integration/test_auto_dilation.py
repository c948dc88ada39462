"""``emulation.time_dilation: auto`` for real, on a tiny topology: the calibration tries K = 1, 2, 4
(the cap) in trials of its own, stops at the first faithful one (or runs at the cap), says so on the
console, and the run records the K it chose, the trials and the wall time; the report gives them. The
run goes on on its last trial's emulation; a run of a K reused without trials brings up its own.
The model (221 KB) saturates G's link, so the run also records the shaped link's rate."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from orchestrator.experiment.calibration import ladder
from tests.integration.test_experiment import leftovers, run_config

pytestmark = [pytest.mark.root, pytest.mark.slow]

CAP = 4


def test_auto_dilation_picks_a_k_and_the_run_records_it(tmp_path: Path) -> None:
    config = tmp_path / "auto.yaml"
    config.write_text(yaml.safe_dump({
        "name": "auto", "topology": "ring:4", "schedulers": ["mst"], "locals": [2], "tasks_per_point": 1,
        "task": {"model": "mlp", "model_args": {"hidden": 200, "layers": 2}, "rounds": 2},
        "emulation": {"backend": "process", "time_dilation": "auto", "max_time_dilation": CAP},
        "background": {"enabled": False}}))

    status, stdout, run_dir, db = run_config(config, tmp_path / "runs", timeout=600)

    assert status == 0, stdout[-3000:]
    env = db.run(1)["environment"]
    cal = env["time_dilation_calibration"]
    tried = [t["k"] for t in cal["trials"]]
    assert tried == list(ladder(CAP)[:len(tried)]) and tried[0] == 1
    assert env["time_dilation"] == cal["k"] == tried[-1]
    assert cal["faithful"] == cal["trials"][-1]["faithful"]
    assert all(not t["faithful"] for t in cal["trials"][:-1])  # the smallest faithful K, or the cap
    assert cal["faithful"] or cal["k"] == CAP
    assert all(t["wall_s"] > 0 and t["emulated_s"] and t["emulated_s"] > 0 for t in cal["trials"])
    assert env["run_wall_s"] > cal["wall_s"] > 0
    for k in tried:  # each trial is a run of its own, with its results
        (trial_dir,) = (run_dir / "calibration").glob(f"k{k:g}-*")
        assert (trial_dir / "results.db").stat().st_size > 0 and (trial_dir / "report.md").is_file()
    # A faithful last trial's emulation went on for the run (orchestrator.experiment.kept): the run's
    # task directories are in its log root, in a folder of their own beside the trial's; a cap's
    # trial that was not faithful was torn down and the run brought up its own.
    (link,) = (run_dir / "tasks").iterdir()
    emulation = run_dir / "calibration" / f"emulation-k{cal['k']:g}"
    assert env["on_trial_emulation"] is cal["faithful"]
    if cal["faithful"]:
        assert link.resolve().parent == (emulation / "workers" / "tasks-2").resolve()
        (last_trial,) = (run_dir / "calibration").glob(f"k{cal['k']:g}-*")
        assert (last_trial / "tasks" / link.name).resolve().parent == (emulation / "workers" / "tasks").resolve()
        assert not (run_dir / "workers").exists()
    else:
        assert link.resolve().parent == (run_dir / "workers" / "tasks").resolve()
    assert "time dilation auto: K=1 " in stdout
    assert f"K={cal['k']:g} chosen" in stdout or f"no K up to {CAP} was faithful" in stdout
    rounds = db.query("SELECT latency_s FROM rounds")
    assert len(rounds) == 2 and all(r["latency_s"] > 0 for r in rounds)
    rates = db.query("SELECT round, expected_s, measured_s FROM link_rates")
    assert {r["round"] for r in rates} == {1, 2} and all(r["expected_s"] > 0 and r["measured_s"] > 0 for r in rates)
    report = (run_dir / "report.md").read_text()
    assert "link rate / configured" in report and "## Time dilation" in report and f"time dilation K={cal['k']:g} (" in report
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}

    # The same workload again on this host: a faithful K is reused, with no trials, and the report says so.
    status, stdout, again_dir, db = run_config(config, tmp_path / "again", timeout=600)
    assert status == 0, stdout[-3000:]
    again = db.run(1)["environment"]["time_dilation_calibration"]
    if cal["faithful"]:
        assert again["trials"] == [] and again["k"] == cal["k"] and again["reused_from"]
        (link,) = (again_dir / "tasks").iterdir()  # no trial: its own emulation
        assert link.resolve().parent == (again_dir / "workers" / "tasks").resolve()
        assert db.run(1)["environment"]["on_trial_emulation"] is False
        assert "as this host chose for the same workload" in stdout
    else:  # nothing faithful was stored: it calibrates again
        assert again["trials"] and "reused_from" not in again
