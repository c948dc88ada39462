"""The simulation's calibration store: host identity and version must both match, and a simulated
run records the calibration it used, or says on its report's first line that it has none."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from orchestrator.experiment.config import parse_config
from orchestrator.results.db import ResultsDB
from orchestrator.simulation.calibration import (
    Calibration,
    CalibrationMismatch,
    HostIdentity,
    find,
    load_all,
    save,
)

HOST = HostIdentity(hostname="lab1", machine_id="abc123", cpu_model="Some CPU @ 2GHz", cores=2, kernel="6.1.0-18")


def calibration(cid: str, *, host: HostIdentity = HOST, version: str = "0.1.0", created: str = "2026-11-25T10:00:00Z",
                off_by: float = 0.3) -> Calibration:
    return Calibration(id=cid, created=created, host=host, version=version,
                       params={"tcp_efficiency": 0.9564, "cpu_cores": 2, "cpu_s_per_byte": 1.4e-9,
                               "cpu_s_per_chunk": 0.0031},
                       delay_emulated=False, points=[], uncalibrated_off_by=off_by)


def test_the_newest_calibration_of_the_same_host_and_version_is_found(tmp_path: Path) -> None:
    store = tmp_path / "cal.json"
    save(calibration("old"), store)
    save(calibration("new", created="2026-11-25T12:00:00Z"), store)
    save(calibration("other", host=dataclasses.replace(HOST, hostname="lab2"), created="2026-11-26T00:00:00Z"), store)

    got = find(store, HOST, "0.1.0")

    assert got.id == "new"
    assert got.params["cpu_s_per_chunk"] == 0.0031 and got.delay_emulated is False
    assert [c.id for c in load_all(store)] == ["old", "new", "other"]


@pytest.mark.parametrize("field,value", [("hostname", "lab2"), ("machine_id", "zzz"), ("cpu_model", "Other CPU"),
                                         ("cores", 8), ("kernel", "5.10.0")])
def test_a_calibration_of_another_host_is_refused_naming_what_differs(tmp_path: Path, field: str,
                                                                       value: object) -> None:
    store = tmp_path / "cal.json"
    save(calibration("c1"), store)
    here = dataclasses.replace(HOST, **{field: value})

    with pytest.raises(CalibrationMismatch, match=f"no calibration of this host.*{field}"):
        find(store, here, "0.1.0")


def test_a_calibration_of_another_version_is_refused_with_a_clear_message(tmp_path: Path) -> None:
    store = tmp_path / "cal.json"
    save(calibration("c1", version="0.0.9"), store)

    with pytest.raises(CalibrationMismatch, match=r"for version\(s\) 0.0.9, not 0.1.0: run `netai calibrate` again"):
        find(store, HOST, "0.1.0")


def test_an_empty_or_broken_store_says_so(tmp_path: Path) -> None:
    with pytest.raises(CalibrationMismatch, match="no calibration in"):
        find(tmp_path / "none.json", HOST, "0.1.0")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": 99, "calibrations": []}))
    with pytest.raises(ValueError, match="is not a calibration store: format 99"):
        load_all(bad)


def test_this_hosts_identity_is_read_from_the_machine() -> None:
    here = HostIdentity.here()
    assert here.cores >= 1 and here.hostname and here.kernel
    assert not here.differences(HostIdentity.here())


def _run(tmp_path: Path, store: Path) -> tuple[dict[str, object], str]:
    from orchestrator.experiment.simulated import run_simulated

    cfg = parse_config({"name": "simcal", "engine": "simulation", "topology": "triangle", "schedulers": ["spff"],
                        "locals": [2], "tasks_per_point": 1, "task": {"rounds": 1},
                        "simulation": {"rates": "emulated", "cpu_s_per_byte": 2e-9}})
    outcome = run_simulated(cfg, out_root=tmp_path / "runs", model_bytes=200_000, calibration_store=store)
    with ResultsDB(outcome.run_dir / "results.db") as db:
        env = db.run(outcome.run_id)["environment"]
    return env, (outcome.run_dir / "report.md").read_text()


def test_a_simulated_run_uses_this_hosts_calibration_and_records_which(tmp_path: Path) -> None:
    pytest.importorskip("simgrid")
    store = tmp_path / "cal.json"
    save(dataclasses.replace(calibration("mine"), host=HostIdentity.here()), store)

    env, report = _run(tmp_path, store)

    # The calibration's parameters where the config left the default; the config's own value kept.
    assert env["calibrated"] is True and env["calibration_id"] == "mine"
    assert env["calibration_host"] == HostIdentity.here().hostname and env["calibration_created"]
    assert env["cpu_s_per_chunk"] == 0.0031 and env["cpu_cores"] == 2 and env["cpu_s_per_byte"] == 2e-9
    assert env["delay_emulated"] is False  # the calibration's emulation had no delay
    # Calibrated, it is not said to be uncalibrated (only that no validation covers it: none here).
    assert report.startswith("**Not validated:**") and "**Uncalibrated:**" not in report
    assert "calibration mine of 2026-11-25T10:00:00Z" in report
    assert "0.0031 s per chunk" in report


def test_an_uncalibrated_simulated_run_says_so_on_the_reports_first_line(tmp_path: Path) -> None:
    pytest.importorskip("simgrid")
    store = tmp_path / "cal.json"
    save(calibration("elsewhere", host=dataclasses.replace(HOST, hostname="far"), off_by=0.27), store)

    env, report = _run(tmp_path, store)

    first = report.splitlines()[0]
    assert env["calibrated"] is False
    assert first.startswith("**Uncalibrated:**") and "no calibration of this host" in first
    assert "up to 27% per point" in first and "elsewhere" in first  # the measured off-by, cited


def test_the_fit_finds_the_per_hop_latency_that_matches_the_emulation() -> None:
    from orchestrator.experiment.calibrate import FIT_TOLERANCE, fit, geo_ratio

    # Prepare: a fake simulation whose round time grows with the per-hop latency (ms; 4 hops a round).
    emu = {("spff", 2): 0.9, ("mst", 2): 0.7}

    def simulate_with(ms: float) -> dict[tuple[str, int], float]:
        return {("spff", 2): 0.8 + 4e-3 * ms, ("mst", 2): 0.6 + 4e-3 * ms}

    got = fit(emu, simulate_with, lambda _: None)

    assert abs(geo_ratio(simulate_with(got), emu) - 1) <= FIT_TOLERANCE
    assert fit({("spff", 2): 0.5}, simulate_with, lambda _: None) == 0.0  # already slower: nothing to add


def test_the_wire_factor_is_the_emulated_over_the_simulated_carried_bytes() -> None:
    from orchestrator.experiment.calibrate import wire_factor

    emu = {("spff", 1): 1070, ("mst", 1): 2140, ("mst", 2): 999}
    sim = {("spff", 1): 1000, ("mst", 1): 2000}  # counted with a factor of 1.0; mst 2 failed here

    assert wire_factor(emu, sim, 1.0) == pytest.approx(1.07)
    assert wire_factor(emu, {k: 2 * v for k, v in sim.items()}, 2.0) == pytest.approx(1.07)


def test_the_training_factor_counts_only_trainings_that_ran_alone() -> None:
    from orchestrator.experiment.calibrate import lone_ratios

    def span(site: str, start: float, real: float | None, modelled: float | None = 0.1, rnd: int = 1,
             end: float | None = None) -> dict[str, object]:
        return {"scheduler": "spff", "task_id": 1, "round": rnd, "site": site, "start": start,
                "end_s": end if end is not None else start + (real or 0.1), "real_s": real, "modelled_s": modelled}

    # Round 1: A and B overlap (both left out); C trains alone after them, 1.5x its modelled time.
    # Round 2: D held until its modelled end (no overrun): ratio 1; E overran 3x, overlapping nothing.
    spans = [span("A", 0.0, 0.3), span("B", 0.2, 0.3), span("C", 1.0, 0.15),
             span("D", 0.0, None, None, rnd=2, end=0.1), span("E", 0.5, 0.3, rnd=2)]

    assert sorted(lone_ratios(spans)) == pytest.approx([1.0, 1.5, 3.0])
    assert lone_ratios([span("A", 0.0, 0.3), span("B", 0.1, 0.3)]) == []


def test_a_wire_factor_measured_before_the_frames_were_modelled_is_left_out(tmp_path: Path) -> None:
    pytest.importorskip("simgrid")
    # an entry of before: its wire factor counted the chunks' headers at its own chunk size
    old = dataclasses.replace(calibration("old"), host=HostIdentity.here(),
                              params={"tcp_efficiency": 0.95, "wire_bytes_factor": 1.08})
    store = tmp_path / "cal.json"
    save(old, store)
    assert load_all(store)[0].frames is False
    assert load_all(store)[0].usable_params() == {"tcp_efficiency": 0.95}

    env, _ = _run(tmp_path / "a", store)
    assert env["calibration_id"] == "old" and env["tcp_efficiency"] == 0.95
    assert env["wire_bytes_factor"] != 1.08 and "wire_bytes_factor" not in env["calibrated_params"]
    assert env["frame_headers"] == "not modelled"  # a model size given, no model built: said so

    # one measured with the frames modelled keeps it (and the flag survives the store)
    save(dataclasses.replace(old, id="new", created="2026-11-26T10:00:00Z", frames=True), store)
    assert [c.frames for c in load_all(store)] == [False, True]
    env, _ = _run(tmp_path / "b", store)
    assert env["calibration_id"] == "new" and env["wire_bytes_factor"] == 1.08


def test_a_calibration_fitted_under_an_older_model_is_refused_and_a_new_one_is_found(tmp_path: Path) -> None:
    # Prepare: an entry as stored before the model had revisions (no "model" key: revision 1).
    from orchestrator.simulation.spec import MODEL_REVISION

    store = tmp_path / "cal.json"
    old = calibration("before").to_dict()
    del old["model"]
    store.write_text(json.dumps({"format": 2, "calibrations": [old]}))

    assert load_all(store)[0].model == 1
    with pytest.raises(CalibrationMismatch, match=rf"model revision\(s\) 1, not {MODEL_REVISION}: run `netai calibrate`"):
        find(store, HOST, "0.1.0")
    save(calibration("after", created="2026-11-25T09:00:00Z"), store)  # older date, current model
    assert find(store, HOST, "0.1.0").id == "after"
