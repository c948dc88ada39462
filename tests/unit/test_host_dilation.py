"""This host's time dilation K, stored by `netai calibrate` with its calibration: the store keeps K and
its trials (and still reads format 1 entries, which have none), ``emulation.time_dilation: host`` runs
at it or is refused before anything starts naming `netai calibrate`, and `netai validate` runs its
emulated reference at it when the config sets no K (fakes for the emulation)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import parse_config
from orchestrator.experiment.host_dilation import resolve
from orchestrator.simulation.calibration import (
    FORMAT,
    Calibration,
    HostIdentity,
    find,
    load_all,
    save,
    uncalibrated_note,
)

SEARCH = {"k": 8.0, "faithful": True, "cap": 16.0, "wall_s": 181.5,
          "trials": [{"k": 1.0, "faithful": False, "reasons": ["mst at 4 locals: training: 6 of 12 overran"],
                      "wall_s": 31.0, "emulated_s": 6.1, "host_saturated": 0.7},
                     {"k": 8.0, "faithful": True, "reasons": [], "wall_s": 90.5, "emulated_s": 6.0,
                      "host_saturated": 0.1}]}


def _cal(cid: str = "here-1", *, k: float | None = 8.0, created: str = "2026-11-26T19:00:00Z") -> Calibration:
    return Calibration(id=cid, created=created, host=HostIdentity.here(), version="0.1.0",
                       params={"tcp_efficiency": 0.9564, "per_hop_latency_ms": 0.4, "wire_bytes_factor": 1.066},
                       delay_emulated=False, points=[{"scheduler": "mst", "locals": 2, "emulated_s": 0.6,
                                                      "uncalibrated_s": 0.61, "calibrated_s": 0.6}],
                       uncalibrated_off_by=0.04, time_dilation=k, dilation=SEARCH if k is not None else None,
                       host_cpu={"cpu_s_per_byte": 1.6e-9, "train_real_over_modelled": 1.0} if k is not None else {})


def test_the_store_keeps_the_hosts_k_and_its_trials(tmp_path: Path) -> None:
    store = tmp_path / "cal.json"
    save(_cal(), store)

    got = find(store, version="0.1.0")

    assert json.loads(store.read_text())["format"] == FORMAT == 2
    assert got == _cal()
    assert got.time_dilation == 8.0 and got.dilation_faithful is True
    assert [t["k"] for t in (got.dilation or {})["trials"]] == [1.0, 8.0]
    assert got.host_cpu == {"cpu_s_per_byte": 1.6e-9, "train_real_over_modelled": 1.0}
    assert "host time dilation K=8 (faithful)" in got.summary()


def test_a_format_1_entry_still_loads_with_no_k_and_is_kept_when_the_store_is_written(tmp_path: Path) -> None:
    store = tmp_path / "cal.json"
    old = _cal("old", k=None).to_dict()
    for key in ("time_dilation", "dilation", "host_cpu"):
        del old[key]  # what format 1 wrote
    old["params"] |= {"cpu_cores": 2, "cpu_s_per_byte_hop": 2.54e-8, "train_cpu_factor": 1.092}
    store.write_text(json.dumps({"format": 1, "calibrations": [old]}))

    (got,) = load_all(store)
    save(_cal("new", created="2026-11-26T20:00:00Z"), store)

    assert got.time_dilation is None and got.dilation is None and got.host_cpu == {} and got.dilation_faithful is None
    assert got.params["cpu_s_per_byte_hop"] == 2.54e-8 and "no time dilation measured" in got.summary()
    doc = json.loads(store.read_text())
    assert doc["format"] == 2 and [c["id"] for c in doc["calibrations"]] == ["old", "new"]
    assert [c.time_dilation for c in load_all(store)] == [None, 8.0]


def test_an_uncalibrated_run_cites_the_k_its_figure_was_measured_at(tmp_path: Path) -> None:
    store = tmp_path / "cal.json"
    save(_cal(), store)
    assert "emulated at K=8" in uncalibrated_note(store, "none here")["uncalibrated_where"]


def _raw(**emulation: Any) -> dict[str, Any]:
    return {"name": "h", "topology": "triangle", "schedulers": ["spff", "mst"], "locals": [2], "tasks_per_point": 1,
            "task": {"rounds": 2}, "emulation": {"max_link_mbps": 100, **emulation}}


def test_time_dilation_host_is_parsed_kept_in_the_saved_config_and_checked() -> None:
    cfg = parse_config(_raw(time_dilation="host"))

    assert cfg.emulation.time_dilation_host and not cfg.emulation.time_dilation_auto
    assert cfg.to_dict()["emulation"]["time_dilation"] == "host" and parse_config(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError, match="time_dilation: host dilates the emulation: it needs engine: emulation"):
        parse_config({**_raw(time_dilation="host"), "engine": "simulation"})
    with pytest.raises(ConfigError, match="max_time_dilation is the calibration's cap: it needs time_dilation: auto"):
        parse_config(_raw(time_dilation="host", max_time_dilation=8))


def test_time_dilation_host_runs_at_this_hosts_k_and_names_the_calibration(tmp_path: Path) -> None:
    from orchestrator import __version__

    store = tmp_path / "cal.json"
    save(dataclasses.replace(_cal(), version=__version__), store)

    got = resolve(parse_config(_raw(time_dilation="host")), store)

    assert got.emulation.time_dilation == 8.0 and got.emulation.time_dilation_from == "here-1"
    assert not got.emulation.time_dilation_host
    assert got.to_dict()["emulation"]["time_dilation"] == 8.0  # the run's config says the K it ran at
    fixed = parse_config(_raw(time_dilation=4))
    assert resolve(fixed, store) == fixed  # a config's own K stands


def test_time_dilation_host_without_the_hosts_k_is_a_config_error_naming_netai_calibrate(tmp_path: Path) -> None:
    from orchestrator import __version__

    cfg = parse_config(_raw(time_dilation="host"))
    with pytest.raises(ConfigError, match=r"time_dilation: host: .*no calibration in .*run `netai calibrate`"):
        resolve(cfg, tmp_path / "none.json")
    old = tmp_path / "old.json"
    save(dataclasses.replace(_cal(k=None), version=__version__), old)
    with pytest.raises(ConfigError, match=r"its calibration here-1 .* has none .*run `netai calibrate` on this host"):
        resolve(cfg, old)


def test_the_runner_refuses_time_dilation_host_before_anything_starts(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.experiment.runner import run_experiment

    monkeypatch.setenv("NETAI_CALIBRATION", str(tmp_path / "none.json"))
    sweep = parse_config({**_raw(), "sweep": [{"emulation": {"time_dilation": 2}},
                                             {"emulation": {"time_dilation": "host"}}]})

    for cfg in (parse_config(_raw(time_dilation="host")), sweep):
        with pytest.raises(ConfigError, match="netai calibrate"):
            run_experiment(cfg, out_root=tmp_path / "runs")
    assert not (tmp_path / "runs").exists()  # nothing started, no run folder


class _Stop(Exception):
    pass


def _validate_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, store: Path, *, raw: dict[str, Any],
                   host_k: bool) -> tuple[Any, list[str]]:
    """The config `netai validate` hands the emulation (a fake that stops there), and what it said."""
    import orchestrator.experiment.runner as runner
    from orchestrator.experiment.validate import validate

    seen: list[Any] = []

    def fake_run(cfg: Any, **_: Any) -> Any:
        seen.append(cfg)
        raise _Stop

    monkeypatch.setattr(runner, "run_experiment", fake_run)
    said: list[str] = []
    with pytest.raises(_Stop):
        validate(parse_config(raw), out_root=tmp_path / f"runs-{store.stem}-{host_k}-{len(raw['emulation'])}",
                 calibration_store=store, host_k=host_k,
                 say=said.append)
    return seen[0], said


def test_validate_runs_the_emulated_reference_at_the_hosts_k_when_the_config_sets_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator import __version__

    store = tmp_path / "cal.json"
    save(dataclasses.replace(_cal(), version=__version__), store)

    at_host, said = _validate_with(tmp_path, monkeypatch, store, raw=_raw(), host_k=True)
    own, _ = _validate_with(tmp_path, monkeypatch, store, raw=_raw(time_dilation=2), host_k=False)
    none, said_none = _validate_with(tmp_path, monkeypatch, tmp_path / "none.json", raw=_raw(), host_k=True)

    assert at_host.emulation.time_dilation == 8.0 and at_host.emulation.time_dilation_from == "here-1"
    assert "emulated reference at this host's time dilation K=8 (calibration here-1)" in said
    assert own.emulation.time_dilation == 2.0 and not own.emulation.time_dilation_from
    assert none.emulation.time_dilation == 1.0
    assert any(line.startswith("emulated reference undilated (K=1)") and "netai calibrate" in line
               for line in said_none)


def test_validate_knows_whether_a_config_file_sets_its_own_k(tmp_path: Path) -> None:
    from orchestrator.cli.simulation import sets_dilation

    for emulation, sets in (({}, False), ({"time_dilation": 1}, True), ({"time_dilation": "auto"}, True),
                            ({"time_dilation": "host"}, True)):
        path = tmp_path / "c.yaml"
        path.write_text(json.dumps(_raw(**emulation)))  # JSON is YAML
        assert sets_dilation(path) is sets, emulation


def test_the_calibration_set_runs_auto_dilation_and_its_simulated_twin_has_no_k() -> None:
    from orchestrator.experiment.calibrate import calibration_config, simulated_config
    from orchestrator.experiment.config import AUTO_MAX_TIME_DILATION

    cfg = calibration_config("process", 8)
    twin = simulated_config(cfg, {"tcp_efficiency": 0.9564}, propagation=False)

    assert cfg.emulation.time_dilation_auto and cfg.emulation.max_time_dilation == 8.0
    assert calibration_config().emulation.max_time_dilation == AUTO_MAX_TIME_DILATION
    assert twin.engine == "simulation" and not twin.emulation.time_dilation_auto and twin.emulation.time_dilation == 1


def test_the_report_says_the_run_took_this_hosts_k() -> None:
    from orchestrator.results.report import dilation_lines

    (line,) = dilation_lines({"time_dilation": 8.0, "time_dilation_from": "here-1"})
    assert line.startswith("time dilation K=8 (this host's K, from its calibration here-1 (time_dilation: host))")


def test_calibrate_stores_the_k_its_reference_ran_at_and_fits_no_cpu_model(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.experiment.calibrate as cal_mod

    ref = cal_mod.Reference(tmp_path / "calibrate-run", 1, False, 8.0, SEARCH)
    asked: list[Any] = []
    monkeypatch.setattr(cal_mod, "measure_worker_cpu", lambda *a, **k: 1.6e-9)
    monkeypatch.setattr(cal_mod, "_emulated", lambda cfg, *a, **k: asked.append(cfg) or ref)
    monkeypatch.setattr(cal_mod, "point_means", lambda *a: {("mst", 2): 0.6, ("spff", 4): 1.2})
    monkeypatch.setattr(cal_mod, "training_factor", lambda *a: 1.0)
    monkeypatch.setattr(cal_mod, "_fit_model", lambda cfg, r, emu, out, say: (
        {"tcp_efficiency": 0.9564, "per_hop_latency_ms": 0.3, "wire_bytes_factor": 1.066}, [], 0.05))

    got = cal_mod.calibrate(out_root=tmp_path, store=tmp_path / "cal.json", max_time_dilation=32, say=lambda _: None)

    assert asked[0].emulation.time_dilation_auto and asked[0].emulation.max_time_dilation == 32.0
    assert got.time_dilation == 8.0 and got.dilation == SEARCH and got == load_all(tmp_path / "cal.json")[0]
    assert got.host_cpu == {"cpu_s_per_byte": 1.6e-9, "train_real_over_modelled": 1.0}
    assert not {"cpu_cores", "cpu_s_per_byte", "cpu_s_per_byte_hop", "train_cpu_factor"} & set(got.params)
    assert "at K=8" in got.note


def test_validate_refuses_time_dilation_host_without_the_hosts_k_before_anything_starts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.experiment.runner as runner
    from orchestrator.experiment.validate import validate

    started: list[Any] = []
    monkeypatch.setattr(runner, "run_experiment", lambda cfg, **_: started.append(cfg))

    with pytest.raises(ConfigError, match=r"time_dilation: host: .*run `netai calibrate`"):
        validate(parse_config(_raw(time_dilation="host")), out_root=tmp_path / "runs",
                 calibration_store=tmp_path / "none.json", say=lambda _: None)
    assert started == [] and not (tmp_path / "runs").exists()  # no emulation, no run folder


class _Ran(Exception):
    """Raised by the fake runner with the config it was given."""


def test_experiment_time_dilation_override_reaches_the_runner_and_bad_values_stop_first(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main
    from orchestrator.experiment import runner

    seen: list[Any] = []

    def fake_run(cfg: Any, **_: Any) -> None:
        seen.append(cfg)
        raise _Ran

    monkeypatch.setattr(runner, "run_experiment", fake_run)
    paper = str(Path(__file__).resolve().parents[2] / "experiments" / "paper.yaml")
    with pytest.raises(_Ran):
        main(["experiment", paper, "--time-dilation", "auto", "--max-time-dilation", "16", "--locals", "8"])
    with pytest.raises(_Ran):
        main(["experiment", paper, "--time-dilation", "12"])
    bad = [main(["experiment", paper, "--time-dilation", v]) for v in ("x", "0.5", "nan")]
    capped = main(["experiment", paper, "--time-dilation", "8", "--max-time-dilation", "16"])
    err = capsys.readouterr().err

    auto, fixed = seen
    assert (auto.emulation.time_dilation_auto, auto.emulation.max_time_dilation, auto.locals) == (True, 16.0, (8,))
    assert auto.name == "paper" and auto.schedulers == ("spff", "mst", "steiner", "spt")
    assert (fixed.emulation.time_dilation, fixed.emulation.time_dilation_auto) == (12.0, False)
    assert bad == [2, 2, 2] and capped == 2 and len(seen) == 2
    assert "--time-dilation must be a number, auto or host, got 'x'" in err
    assert "emulation.time_dilation must be a number >= 1" in err
    assert "--max-time-dilation is the calibration's cap" in err


def test_the_time_dilation_override_keeps_the_configs_cap_and_refuses_sweeps() -> None:
    from orchestrator.experiment.host_dilation import with_dilation

    small = parse_config({"name": "s", "emulation": {"time_dilation": "auto", "max_time_dilation": 32}})
    sweep = parse_config({"name": "w", "sweep": [{"task": {"rounds": 1}}, {"task": {"rounds": 2}}]})

    assert with_dilation(small, "auto", None, where="s").emulation.max_time_dilation == 32.0
    assert with_dilation(small, None, 8.0, where="s").emulation.max_time_dilation == 8.0
    assert with_dilation(small, "host", None, where="s").emulation.time_dilation_host
    with pytest.raises(ConfigError, match="does not apply to a sweep"):
        with_dilation(sweep, "auto", None, where="w")
