"""What `netai validate` records, and what a simulated run rests on: the store of validations, a
reference that is not faithful (said first, recorded as such, exit 1), and a simulated run's report
citing the validation that covers its regime, or saying plainly that none does."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest

from orchestrator.experiment.config import ExperimentConfig, parse_config
from orchestrator.experiment.validation_store import (
    MODEL_BYTES_FACTOR,
    Regime,
    ValidationRecord,
    covering,
    default_path,
    gaps,
    load_all,
    save,
)
from orchestrator.results.agreement import Interval, PointAgreement, latency_errors
from orchestrator.results.db import ResultsDB
from orchestrator.simulation.spec import MODEL_REVISION

#: The references' time dilation: the twin models the emulation's shaper at K, whose burst at K = 1
#: (16 KB) would carry most of the 19 KB model ahead of its links' rate and beat the rounds' bound.
K = 64
REGIME = Regime.of("triangle", [19_240], [2, 8], ["mst", "spff"])


def record(**changes: Any) -> ValidationRecord:
    base = ValidationRecord(id="v1", created="2026-11-28T10:00:00Z", host="here", version="0", model=MODEL_REVISION,
                            config="small", config_hash="abc", regime=REGIME, worst_error=0.05, geomean_error=0.01,
                            reference_faithful=True, calibration=None, folder="runs/x")
    return dataclasses.replace(base, **changes)


def test_the_store_is_the_tests_own_and_keeps_every_record(tmp_path: Path) -> None:
    store = tmp_path / "v.json"

    save(record(), store)
    save(record(id="v2", config="other"), store)
    save(record(id="v2", config="again"), store)  # the same id replaces its record

    assert default_path() != Path.home() / ".cache" / "netai" / "validations.json"
    assert [(r.id, r.config) for r in load_all(store)] == [("v1", "small"), ("v2", "again")]
    assert load_all(store)[0] == record()
    store.write_text("{}")
    with pytest.raises(ValueError, match="is not a validation store"):
        load_all(store)


def test_a_record_covers_its_regime_within_the_model_factor_and_its_locals() -> None:
    v = record()
    inside = Regime.of("triangle", [int(19_240 * MODEL_BYTES_FACTOR)], [4], ["mst"])

    assert gaps(v, REGIME) == [] and gaps(v, inside) == []
    assert gaps(v, Regime.of("triangle", [int(19_240 / MODEL_BYTES_FACTOR) - 1], [2], ["mst"])) == [
        "it validated model 19.2 KB (covering 9.62 KB to 38.5 KB)"]
    assert gaps(v, Regime.of("nobel-us", [19_240], [1, 13], ["mst", "steiner"])) == [
        "it validated topology triangle", "it validated 2 to 8 locals",
        "it validated schedulers mst, spff (not steiner)"]
    assert gaps(record(reference_faithful=False, model=MODEL_REVISION - 1), REGIME) == [
        "its emulated reference was NOT faithful",
        f"it ran under the simulation's model revision {MODEL_REVISION - 1}, not {MODEL_REVISION}"]


def test_a_run_cites_the_newest_covering_record_or_says_why_the_nearest_does_not_cover_it(tmp_path: Path) -> None:
    store = tmp_path / "v.json"
    empty = covering(store, REGIME)
    save(record(), store)
    save(record(id="v2", created="2026-11-28T11:00:00Z", worst_error=0.03), store)
    save(record(id="v3", created="2026-11-28T12:00:00Z", reference_faithful=False), store)

    covered = covering(store, REGIME)
    outside = covering(store, Regime.of("triangle", [2_800_000], [2], ["mst"]))
    unshaped = covering(store, REGIME, shaper=False)  # the run does not model the emulation's shaper

    assert empty == {"validation_gap": "no validation covers this run's regime (topology triangle, model 19.2 KB, "
                                       f"2 to 8 locals, schedulers mst, spff): no `netai validate` recorded in {store}"}
    assert covered["validation"]["id"] == "v2" and covered["validation"]["worst_error"] == 0.03  # v3 is not faithful
    assert outside["validation_gap"].endswith(
        "the nearest, small of 2026-11-28T11:00:00Z on here: it validated model 19.2 KB (covering 9.62 KB to 38.5 KB)")
    assert "validation" not in unshaped and unshaped["validation_gap"].endswith(
        "it validated a twin that models the emulation's shaper, which this run does not "
        "(set simulation.shaper_burst_k to the K of the emulation it stands for)")
    store.write_text("not json")
    assert covering(store, REGIME)["validation_gap"].startswith("the validation store is unreadable")


def test_a_twin_of_paced_copies_covers_only_runs_whose_frames_cross_as_segments(tmp_path: Path) -> None:
    store = tmp_path / "v.json"
    save(record(shaper=False, segments=True), store)
    assert covering(store, REGIME, shaper=False, segments=True)["validation"]["id"] == "v1"
    flat = covering(store, REGIME, shaper=False)
    assert "validation" not in flat and flat["validation_gap"].endswith(
        "it validated a twin whose chunk frames cross as TCP segments of their own, which this run's do not "
        "(set simulation.segment_mss: 1448)")
    # a record of before the field reads as a twin without segments
    assert ValidationRecord.from_dict({k: v for k, v in record().to_dict().items() if k != "segments"}).segments is False


def test_the_errors_are_the_worst_and_the_geometric_mean_of_the_points() -> None:
    points = [PointAgreement("mst", 2, 1.0, r, Interval(r, r, r, 1), None) for r in (0.9, 1.1, 1.0)]

    worst, geomean = latency_errors(points)

    assert worst == pytest.approx(0.1)
    assert geomean == pytest.approx(math.expm1((abs(math.log(0.9)) + math.log(1.1)) / 3))  # no cancelling out
    with pytest.raises(ValueError):
        latency_errors([])


# -- netai validate end to end, the emulated reference stood in for by a simulated run ---------------
def _config() -> ExperimentConfig:
    return parse_config({"name": "tiny", "topology": "triangle", "schedulers": ["spff", "mst"], "locals": [2],
                         "tasks_per_point": 2, "task": {"rounds": 1, "compute_timing": "modeled"},
                         "background": {"enabled": False}, "emulation": {"backend": "process", "time_dilation": K}})


def _reference(tmp_path: Path, cfg: ExperimentConfig, *, overrun: str | None = None) -> Path:
    """A completed "emulated" run of `cfg`: its simulated twin's run, recorded as the emulation's
    (so every figure agrees), with one training overrun at `overrun`'s point if given."""
    from orchestrator.experiment.simulated import run_simulated
    from orchestrator.experiment.validate import simulated_twin

    ref = run_simulated(simulated_twin(cfg, propagation=True, time_dilation=K), out_root=tmp_path / "reference",
                        figures=False)
    with ResultsDB(ref.run_dir / "results.db") as db:
        env = {**db.run(ref.run_id)["environment"], "time_dilation": K}
        db.conn.execute("UPDATE runs SET engine = 'emulation', config_json = ?, environment_json = ? WHERE id = ?",
                        (json.dumps(cfg.to_dict(), sort_keys=True), json.dumps(env), ref.run_id))
        db.conn.commit()
        if overrun:
            task_id = db.query("SELECT task_id FROM tasks WHERE run_id = ? AND scheduler = ?",
                               (ref.run_id, overrun))[0]["task_id"]
            db.record_fidelity(ref.run_id, overrun, task_id, hops=[],
                               overruns=[{"round": 1, "site": "B", "real_s": 0.3, "modelled_s": 0.1}])
    return ref.run_dir


def test_validate_against_an_unfaithful_reference_says_it_first_records_it_and_exits_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli.simulation import cmd_validate

    # Prepare: a reference whose mst point overran a training, and the config's file.
    cfg = _config()
    reference = _reference(tmp_path, cfg, overrun="mst")
    config = tmp_path / "tiny.yaml"
    config.write_text(json.dumps(cfg.to_dict()))  # JSON is YAML
    capsys.readouterr()

    status = cmd_validate(argparse.Namespace(config=str(config), emulated_run=str(reference), out=str(tmp_path / "v"),
                                             backend=None, calibration=None, no_figures=False))

    said, err = capsys.readouterr()
    head = ("the emulated reference is NOT faithful at 1 of 2 points (mst at 2 locals): its figures there are the "
            "host's as much as the emulated network's")
    (folder,) = (tmp_path / "v").iterdir()
    doc = json.loads((folder / "validation.json").read_text())
    (stored,) = load_all(default_path())
    assert status == 1 and "this validation covers no simulated run" in err
    assert said.index(head) < said.index("[2/3]")  # said as soon as the reference is read
    assert (folder / "validation.txt").read_text().startswith(head)
    assert doc["reference_faithful"] is False and doc["unfaithful_points"] == [["mst", 2]]
    assert not stored.reference_faithful and stored.config == "tiny"
    assert "its emulated reference was NOT faithful" in covering(default_path(), stored.regime)["validation_gap"]


def test_a_simulated_run_cites_the_validation_covering_its_regime_and_says_when_none_does(tmp_path: Path) -> None:
    from orchestrator.experiment.simulated import run_simulated
    from orchestrator.experiment.validate import simulated_twin, validate
    from orchestrator.results.report import summary_lines

    # Prepare: a faithful validation of the tiny config (2 locals, the default mlp of 19 KB).
    cfg = _config()
    result = validate(cfg, out_root=tmp_path / "v", emulated_run=_reference(tmp_path, cfg), say=lambda _: None)
    twin = simulated_twin(cfg, propagation=True, time_dilation=K)

    covered = run_simulated(twin, out_root=tmp_path / "covered", figures=False)
    outside = run_simulated(twin, out_root=tmp_path / "outside", figures=False, model_bytes=2_800_000)

    covered_head = (covered.run_dir / "report.md").read_text().split("## ")[0]
    outside_head = (outside.run_dir / "report.md").read_text().split("# Run")[0]
    assert result.reference_faithful and load_all(default_path()) == [result.record]
    assert result.record.regime == Regime.of("triangle", [19_240], [2], ["mst", "spff"])
    assert (f"**Validated:** this regime is covered by `netai validate` of tiny (config {result.record.config_hash}) "
            f"of {result.record.created} on host {result.record.host}: simulated over emulated mean round latency "
            "off by 0.0% at worst") in covered_head
    assert "**Not validated:**" not in covered_head
    # The run outside the regime says so before its title, and why: its model is 145 x the validated one.
    assert ("**Not validated:** no validation covers this run's regime (topology triangle, model 2.8 MB, 2 locals, "
            "schedulers mst, spff)") in outside_head
    assert "it validated model 19.2 KB (covering 9.62 KB to 38.5 KB)" in outside_head
    assert outside.summary is not None
    assert any(line.startswith("Not validated:") for line in summary_lines(outside.summary, outside.run_dir))
