"""A K per point of a sweep (`orchestrator.experiment.point_runs`, issue 45 item 3): the config's two
forms checked before anything starts, the points run in turn each at its own K with the run clock
going on, what the environment records, a resume keeping each point's K, and every reader of K
taking the point's own (`orchestrator.results.dilation.k_for`). Fakes for the calibrations and the
sessions: nothing is brought up."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.calibration import Calibration, Trial
from orchestrator.experiment.config import parse_config
from orchestrator.experiment.point_runs import point_kept, points_of, run_points
from orchestrator.experiment.resume import Resume
from orchestrator.experiment.session import SessionEnd
from orchestrator.results.db import ResultsDB
from orchestrator.results.dilation import dilation_lines, k_for
from orchestrator.results.report import summary_lines, write_report
from orchestrator.results.summary import run_summary
from orchestrator.runtime.timing import ALPHA_S
from tests.unit.test_results import fill

BASE: dict[str, Any] = {"name": "pp", "topology": "ring:8", "schedulers": ["spff", "mst"], "locals": [1, 4],
                        "tasks_per_point": 2, "task": {"rounds": 2}}


def _cfg(emulation: dict[str, Any], **top: Any) -> Any:
    return parse_config({**BASE, **top, "emulation": emulation})


def _with_points(cfg: Any, *points: tuple[int, float]) -> Any:
    """`cfg` holding the Ks a resumed run recorded for `points` (`resume.recorded_dilation`)."""
    return replace(cfg, emulation=replace(cfg.emulation, time_dilation_points=points))


# -- the config ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("emulation", [{"time_dilation": "auto", "per_point": True, "max_time_dilation": 16},
                                       {"time_dilation": {1: 2, 4: 16}}])
def test_both_forms_are_parsed_and_read_back_from_the_recorded_config(emulation: dict[str, Any]) -> None:
    cfg = _cfg(emulation)

    recorded = json.loads(json.dumps(cfg.to_dict()))  # the run records its config as JSON

    assert cfg.emulation.per_point
    assert parse_config(recorded) == cfg
    assert recorded["emulation"]["time_dilation"] in ("auto", {"1": 2.0, "4": 16.0})
    if cfg.emulation.time_dilation_auto:
        assert cfg.emulation.time_dilation_points == () and recorded["emulation"]["per_point"] is True
    else:
        assert cfg.emulation.time_dilation_points == ((1, 2.0), (4, 16.0)) and "per_point" not in recorded["emulation"]


def test_a_run_at_one_k_records_its_config_as_before() -> None:
    for emulation in ({"time_dilation": 4}, {"time_dilation": "auto"}, {"time_dilation": "auto", "per_point": False}):
        assert "per_point" not in _cfg(emulation).to_dict()["emulation"]
        assert not _cfg(emulation).emulation.per_point


@pytest.mark.parametrize(("emulation", "top", "message"), [
    ({"time_dilation": 4, "per_point": True}, {}, "emulation.per_point goes with time_dilation: auto"),
    ({"time_dilation": "host", "per_point": True}, {}, "emulation.per_point goes with time_dilation: auto"),
    ({"per_point": True}, {}, "per_point goes with time_dilation: auto .* or a mapping of locals to K"),
    ({"time_dilation": {1: 2, 4: 16}, "per_point": True}, {}, "emulation.per_point goes with time_dilation: auto"),
    ({"time_dilation": {1: 2}}, {}, "emulation.time_dilation gives no K for 4 locals: .* each of locals 1, 4"),
    ({"time_dilation": {"one": 2, 4: 16}}, {}, "maps a number of locals .* got the key 'one'"),
    ({"time_dilation": {0: 2, 4: 16}}, {}, "maps a number of locals .* got the key 0"),
    ({"time_dilation": {1: 0.5, 4: 16}}, {}, r"emulation.time_dilation.1 must be a number >= 1"),
    ({"time_dilation": {}}, {}, "a K per point needs at least one point"),
    ({"time_dilation": {1: 2, 4: 16}, "max_time_dilation": 32}, {}, "max_time_dilation is the calibration's cap"),
    ({"time_dilation": {1: 2, 4: 16}}, {"engine": "simulation"}, "a K per point dilates the emulation"),
    ({"time_dilation": "auto", "per_point": True}, {"mode": "online"}, "a K per point .* needs mode: sequential"),
])
def test_a_k_per_point_the_config_cannot_run_is_refused_naming_the_key(emulation: dict[str, Any], top: dict[str, Any],
                                                                      message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _cfg(emulation, **top)


def test_a_mapping_may_hold_more_points_than_the_run_and_the_command_line_k_is_the_whole_runs() -> None:
    from orchestrator.experiment.host_dilation import with_dilation

    mapped = _cfg({"time_dilation": {1: 2, 4: 16, 13: 32}}, locals=[4])
    auto = _cfg({"time_dilation": "auto", "per_point": True})

    fixed = with_dilation(auto, "8", where="x")
    again_auto = with_dilation(auto, "auto", 32, where="x")

    assert mapped.emulation.point_k(4) == 16.0
    assert not fixed.emulation.per_point and fixed.emulation.time_dilation == 8.0
    assert again_auto.emulation.per_point and again_auto.emulation.max_time_dilation == 32.0


# -- the points and their order ---------------------------------------------------------------------
def test_each_point_holds_its_locals_alone_at_its_k_or_auto() -> None:
    cfg = _cfg({"time_dilation": "auto", "per_point": True}, locals=[4, 1, 4])
    resumed = _with_points(_cfg({"time_dilation": "auto", "per_point": True}), (1, 2.0))

    points = points_of(cfg)
    partly = points_of(resumed)

    assert [(p.n_locals, p.cfg.locals) for p in points] == [(4, (4,)), (1, (1,))]  # the config's order, once each
    assert all(p.cfg.emulation.time_dilation_auto and not p.cfg.emulation.per_point for p in points)
    assert [(p.n_locals, p.cfg.emulation.time_dilation_auto, p.cfg.emulation.time_dilation) for p in partly] == [
        (1, False, 2.0), (4, True, 1.0)]


class _Fakes:
    """A calibration per point (K 2 at 1 local, 16 at 4), sessions that each take 0.5 s of emulated
    time, and the environment as recorded."""

    def __init__(self, ks: dict[int, float] | None = None, lost_at: int | None = None) -> None:
        self.ks = ks or {1: 2.0, 4: 16.0}
        self.calibrated: list[tuple[int, ...]] = []
        self.floors: list[tuple[float, int]] = []
        self.sessions: list[tuple[tuple[int, ...], float, float, bool]] = []
        self.env: dict[str, Any] = {}
        self.lost_at = lost_at

    def calibrate(self, cfg: Any, floor: float, floor_locals: int) -> Calibration:
        self.calibrated.append(cfg.locals)
        self.floors.append((floor, floor_locals))
        k = self.ks[cfg.locals[0]]
        return Calibration(k=k, faithful=True, cap=64, trials=(Trial(k=k, faithful=True, reasons=(), wall_s=3.0),))

    def session(self, cfg: Any, k: float, clock_start_s: float) -> SessionEnd:
        self.sessions.append((cfg.locals, k, clock_start_s, cfg.emulation.time_dilation_auto))
        return SessionEnd(outcomes={"done": 4, "failed": 0, "blocked": 0},
                          lost="machine lost" if cfg.locals[0] == self.lost_at else "",
                          clock_end_s=clock_start_s + 0.5, wall_s=0.5 * k + 2.0, bringup_s=1.5, link_samples=3,
                          cpu={"cpu_s_switches": 1.0}, view_s=0.25 * k)

    def record(self, **items: Any) -> None:
        self.env.update(items)


def test_the_points_run_in_turn_each_at_its_own_k_with_the_clock_going_on() -> None:
    fakes = _Fakes()
    cfg = _cfg({"time_dilation": "auto", "per_point": True})

    outcomes, lost = run_points(cfg, calibrate=fakes.calibrate, session=fakes.session, record=fakes.record, recorded={})

    assert fakes.calibrated == [(1,), (4,)]  # each point's trials hold that point alone
    assert fakes.floors == [(1.0, 0), (2.0, 1)]  # 4 locals' trials start at 1 local's K
    assert fakes.sessions == [((1,), 2.0, 0.0, False), ((4,), 16.0, 0.5, False)]
    assert outcomes == {"done": 8, "failed": 0, "blocked": 0} and lost == ""
    env = fakes.env
    assert env["time_dilation_per_point"] == {"1": 2.0, "4": 16.0} and env["time_dilation"] == 16.0
    assert set(env["time_dilation_calibration_per_point"]) == {"1", "4"}
    walls = env["wall_per_point"]
    assert walls["4"]["k"] == 16.0 and walls["4"]["tasks_s"] == 8.0 and walls["4"]["emulated_s"] == 0.5
    assert walls["1"]["bringup_s"] == 1.5 and walls["1"]["wall_s"] >= walls["1"]["calibration_s"] >= 0
    assert (walls["1"]["view_s"], walls["4"]["view_s"]) == (0.5, 4.0)  # each point's own session's
    assert env["wall_s"] == 9.0 and env["link_samples"] == 6 and env["cpu_s_switches"] == 2.0


def test_a_points_trials_start_at_the_largest_k_of_the_points_with_fewer_locals() -> None:
    fakes = _Fakes(ks={2: 8.0, 1: 2.0, 6: 32.0, 4: 16.0})
    cfg = _cfg({"time_dilation": "auto", "per_point": True}, locals=[2, 1, 6, 4])

    run_points(cfg, calibrate=fakes.calibrate, session=fakes.session, record=fakes.record, recorded={})

    # in the config's order: 1 local starts at 1 (2 locals has more); 4 locals after 6 starts at 2 locals' K
    assert fakes.calibrated == [(2,), (1,), (6,), (4,)]
    assert fakes.floors == [(1.0, 0), (1.0, 0), (8.0, 2), (8.0, 2)]


def test_a_mapping_runs_each_point_at_its_k_without_trials_and_a_lost_machine_ends_the_run() -> None:
    fakes = _Fakes(lost_at=1)
    cfg = _cfg({"time_dilation": {1: 2, 4: 16}})

    outcomes, lost = run_points(cfg, calibrate=fakes.calibrate, session=fakes.session, record=fakes.record, recorded={})

    assert fakes.calibrated == [] and fakes.sessions == [((1,), 2.0, 0.0, False)]
    assert lost == "machine lost" and outcomes["done"] == 4
    assert fakes.env["time_dilation_calibration_per_point"] == {}


def test_a_resume_skips_a_kept_point_keeps_its_record_and_goes_on_from_the_clock() -> None:
    fakes = _Fakes()
    cfg = _with_points(_cfg({"time_dilation": "auto", "per_point": True}), (1, 2.0), (4, 16.0))
    recorded = {"time_dilation_per_point": {"1": 2.0, "4": 16.0}, "clock_end_s": 1.25, "link_samples": 5,
                "wall_per_point": {"1": {"k": 2.0, "tasks_s": 1.0, "wall_s": 10.0}}, "cpu_s_switches": 4.0}

    run_points(cfg, calibrate=fakes.calibrate, session=fakes.session, record=fakes.record, recorded=recorded,
               kept=lambda point: point.locals == (1,))

    assert fakes.calibrated == []  # both Ks recorded: no trials again
    assert fakes.sessions == [((4,), 16.0, 1.25, False)]
    assert fakes.env["wall_per_point"]["1"]["wall_s"] == 10.0 and fakes.env["link_samples"] == 8
    assert fakes.env["cpu_s_switches"] == 5.0


def test_a_point_is_kept_when_the_run_holds_every_task_of_it_under_every_scheduler() -> None:
    from orchestrator.experiment.runs import task_sets

    (one, _four) = points_of(_cfg({"time_dilation": {1: 2, 4: 16}}))
    model = one.cfg.network()
    ids = [t.id for t in task_sets(one.cfg, model, 1000)[1]]
    whole = {(s, i): {} for s in ("spff", "mst") for i in ids}
    partial = dict(list(whole.items())[:-1])

    assert point_kept(one.cfg, model, 1000, Resume(Path("."), 1, whole))  # type: ignore[arg-type]
    assert not point_kept(one.cfg, model, 1000, Resume(Path("."), 1, partial))  # type: ignore[arg-type]


def test_the_runner_dilates_and_records_each_points_plan_and_calibrates_it_in_its_own_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.experiment import runner
    from orchestrator.experiment.session import RunShared
    from topologies.plan import EmulationPlan

    cfg = _cfg({"time_dilation": "auto", "per_point": True})
    model = cfg.network()
    plan = EmulationPlan.from_model(model)
    calibrated: list[tuple[tuple[int, ...], Path, float]] = []
    ran: list[tuple[float, float]] = []
    monkeypatch.setattr(runner, "_calibrate", lambda point, out, plan_, shared, floor, floor_locals, kept: calibrated.append(
        (point.locals, out, floor)) or Calibration(k=4.0 * point.locals[0], faithful=True, cap=64, trials=()))

    def session(shared: Any, point: Any, dilated: EmulationPlan, *, clock_start_s: float,
                hosting: Any = None) -> SessionEnd:
        assert hosting is None  # no trial ran: each point brings its own emulation up
        with ResultsDB(shared.db.path) as db:
            ran.append((dilated.time_dilation, json.loads(db.query("SELECT plan_json FROM topology")[0]["plan_json"])
                        ["time_dilation"]))
        return SessionEnd(outcomes={"done": 1, "failed": 0, "blocked": 0}, lost="", clock_end_s=clock_start_s + 1,
                          wall_s=1.0, bringup_s=0.1)

    monkeypatch.setattr(runner, "run_session", session)
    with ResultsDB(tmp_path / "results.db") as db:
        run_id = db.start_run("pp", cfg.to_dict())
        db.record_topology(run_id, model.name, model.to_dict(), plan.to_dict())
        shared = RunShared(db=db, run_id=run_id, run_dir=tmp_path, model=model, backend_kind="process", model_bytes=1)

        outcomes, _ = runner._points(shared, cfg, plan)
        env = db.run(run_id)["environment"]

    assert calibrated == [((1,), tmp_path / "calibration" / "1-locals", 1.0),
                          ((4,), tmp_path / "calibration" / "4-locals", 4.0)]  # from 1 local's K
    assert ran == [(4.0, 4.0), (16.0, 16.0)]  # each point's plan dilated once, by its K, and recorded
    assert env["time_dilation_per_point"] == {"1": 4.0, "4": 16.0} and outcomes["done"] == 2


# -- resume, k_store ----------------------------------------------------------------------------------
def test_a_resumed_run_keeps_each_recorded_points_k_and_calibrates_the_others(tmp_path: Path) -> None:
    from orchestrator.experiment.resume import recorded_dilation

    cfg = _cfg({"time_dilation": "auto", "per_point": True})
    with ResultsDB(tmp_path / "results.db") as db:
        run_id = db.start_run("pp", cfg.to_dict())
        db.update_environment(run_id, time_dilation_per_point={"1": 2.0})

    got = recorded_dilation(cfg, tmp_path)

    assert got.emulation.time_dilation_auto and got.emulation.per_point
    assert [(p.n_locals, p.cfg.emulation.time_dilation_auto, p.cfg.emulation.time_dilation)
            for p in points_of(got)] == [(1, False, 2.0), (4, True, 1.0)]


def test_a_reused_k_is_forgotten_only_for_the_point_that_was_not_faithful(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.experiment import k_store

    cfg = _cfg({"time_dilation": "auto", "per_point": True})
    forgotten: list[str] = []
    monkeypatch.setattr(k_store, "forget", lambda key, path=None: forgotten.append(key) or True)
    summary = SimpleNamespace(
        environment={"time_dilation_calibration_per_point": {"1": {"reused_from": "then"}, "4": {"reused_from": "then"}}},
        verdicts=[SimpleNamespace(n_locals=1, faithful=True), SimpleNamespace(n_locals=4, faithful=False)])
    point_4 = points_of(cfg)[1].cfg

    k_store.after_run(cfg, "process", summary)

    assert forgotten == [k_store.workload_key(point_4, "process")]
    assert k_store.workload_key(point_4, "process") != k_store.workload_key(points_of(cfg)[0].cfg, "process")


# -- the readers of K ---------------------------------------------------------------------------------
PER_POINT_ENV: dict[str, Any] = {
    "time_dilation": 8.0, "time_dilation_per_point": {"2": 2.0, "4": 8.0}, "run_wall_s": 300.0, "clock_end_s": 3.0,
    "time_dilation_calibration_per_point": {"2": Calibration(k=2, faithful=True, cap=64, trials=(
        Trial(k=1, faithful=False, reasons=("mst at 2 locals: overran",), wall_s=20.0),
        Trial(k=2, faithful=True, reasons=(), wall_s=25.0))).to_dict()},
    "wall_per_point": {"2": {"k": 2.0, "calibration_s": 45.0, "bringup_s": 5.0, "tasks_s": 2.0, "emulated_s": 1.0,
                             "view_s": 1.5, "wall_s": 60.0}}}


def test_k_for_gives_the_points_own_k_or_the_runs() -> None:
    assert (k_for(PER_POINT_ENV, 2), k_for(PER_POINT_ENV, 4)) == (2.0, 8.0)
    assert k_for(PER_POINT_ENV, 13) == 8.0 and k_for({"time_dilation": 4.0}, 2) == 4.0 and k_for({}, None) == 1.0


def test_the_report_gives_k_per_point_and_each_points_wall_time_and_its_parts() -> None:
    lines = dilation_lines(PER_POINT_ENV)

    assert lines[0] == ("time dilation per point: K=2 at 2 locals, K=8 at 4 locals; wall time 300.0 s "
                        "(calibration 45.0 s) for 3.00 s emulated: 100 x")
    assert lines[1] == ("2 locals: K=2 (chosen by calibration, the smallest faithful K of those tried up to 64); "
                        "wall time 60.0 s: trials 45.0 s, bring-up 5.0 s, tasks 2.0 s (of which the background "
                        "view 1.5 s), the rest 8.0 s; "
                        "1.00 s emulated: 60 x")
    assert lines[2].startswith("2 locals, calibration K=1: NOT faithful: mst at 2 locals: overran")
    assert lines[4] == "4 locals: K=8 (set in the config)"
    assert dilation_lines(PER_POINT_ENV, trials=False) == [lines[0], lines[1], lines[4]]


def test_the_printed_verdicts_the_fidelity_table_and_the_claims_give_each_points_k(tmp_path: Path) -> None:
    with ResultsDB(tmp_path / "results.db") as db:
        run_id = fill(db)  # points of 2 and 4 locals under spff and mst
        db.update_environment(run_id, **PER_POINT_ENV)
        summary = run_summary(db, run_id)

        report = write_report(db, run_id, tmp_path, summary=summary, figures=[]).read_text()
    printed = summary_lines(summary, tmp_path)

    assert any(line.startswith("fidelity mst at 2 locals (K=2): ") for line in printed)
    assert any(line.startswith("fidelity spff at 4 locals (K=8): ") for line in printed)
    assert "time dilation per point: K=2 at 2 locals, K=8 at 4 locals" in "\n".join(printed)
    assert "| mst | 4 (K=8) | " in report and "| spff | 2 (K=2) | " in report
    assert "- verdict: mst at 4 locals (K=8) " in report and "## Time dilation" in report


def test_a_sweeps_regime_point_takes_the_k_of_its_point(tmp_path: Path) -> None:
    from orchestrator.results.regimes import regime_point

    with ResultsDB(tmp_path / "results.db") as db:
        run_id = fill(db)
        db.update_environment(run_id, **PER_POINT_ENV)
        summary = run_summary(db, run_id)

    point = regime_point(tmp_path, summary)

    assert point.n_locals == 4 and point.time_dilation == 8.0
    two = regime_point(tmp_path, replace(summary, environment={
        **PER_POINT_ENV, "time_dilation_per_point": {"2": 2.0, "4": 32.0}}))
    assert two.time_dilation == 32.0


def test_validate_simulates_each_k_of_the_reference_with_its_own_per_chunk_work() -> None:
    from orchestrator.experiment.validate import twin_configs

    cfg = _cfg({"time_dilation": {1: 2, 4: 16}})

    per_k = twin_configs(cfg, {"time_dilation": 16.0, "time_dilation_per_point": {"1": 2.0, "4": 16.0}},
                         propagation=False)
    one = twin_configs(cfg, {"time_dilation": 8.0}, propagation=False)

    assert [(t.locals, t.simulation.alpha_s) for t in per_k] == [((1,), ALPHA_S / 2), ((4,), ALPHA_S / 16)]
    assert all(t.engine == "simulation" and not t.emulation.per_point for t in per_k)
    assert len({t.name for t in per_k}) == 2  # their run folders cannot meet
    assert [(t.locals, t.simulation.alpha_s) for t in one] == [((1, 4), ALPHA_S / 8)]
