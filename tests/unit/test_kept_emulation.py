"""The last trial's emulation kept up for the run at its K (`orchestrator.experiment.kept`): one
emulation up at a time, the run taking the last trial's when it is at the K chosen and bringing up
its own otherwise, every one torn down on every exit path; the sessions on one emulation sharing its
install ids and each taking its own folder of task directories; the report's line for a point that
ran on its trial's emulation. Fakes for the emulations, trials and sessions: nothing is brought up."""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.experiment.calibration import Calibration, Trial
from orchestrator.experiment.config import parse_config
from orchestrator.experiment.kept import KeptEmulation, fresh_dir
from orchestrator.experiment.session import Hosting, RunShared, SessionEnd
from orchestrator.results.db import ResultsDB
from orchestrator.results.dilation import point_wall_line


class Fakes:
    """Emulations brought up and torn down, in order: ("up", name) and ("down", name)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    @contextlib.contextmanager
    def make(self, name: str, *, fail: bool = False) -> Iterator[Hosting]:
        self.events.append(("up", name))
        try:
            if fail:
                raise RuntimeError(f"{name} did not come up")
            yield Hosting(emu=SimpleNamespace(name=name), compute=SimpleNamespace(tasks_folder="tasks"))
        finally:
            self.events.append(("down", name))


def test_one_emulation_is_kept_at_a_time_and_the_run_takes_it_only_at_its_k() -> None:
    fakes = Fakes()
    with KeptEmulation() as kept:
        first = kept.bring_up(8.0, lambda: fakes.make("k8"))
        assert kept.take(8.0) is first and fakes.events == [("up", "k8")]
        second = kept.bring_up(16.0, lambda: fakes.make("k16"))  # the one before torn down first
        assert fakes.events == [("up", "k8"), ("down", "k8"), ("up", "k16")]
        assert kept.take(16.0) is second
        assert kept.take(32.0) is None  # another K: torn down, the run brings up its own
        assert fakes.events[-1] == ("down", "k16") and kept.take(16.0) is None
        kept.bring_up(32.0, lambda: fakes.make("k32"))
    assert fakes.events[-1] == ("down", "k32")  # torn down when its owner ends
    assert [e for e in fakes.events if e[0] == "up"] == [("up", "k8"), ("up", "k16"), ("up", "k32")]


def test_a_bring_up_that_fails_leaves_nothing_kept_and_an_exception_tears_the_kept_one_down() -> None:
    fakes = Fakes()
    kept = KeptEmulation()
    kept.bring_up(4.0, lambda: fakes.make("k4"))
    with pytest.raises(RuntimeError, match="k8 did not come up"):
        kept.bring_up(8.0, lambda: fakes.make("k8", fail=True))
    assert kept.hosting is None and kept.take(8.0) is None
    assert fakes.events == [("up", "k4"), ("down", "k4"), ("up", "k8"), ("down", "k8")]

    with pytest.raises(KeyboardInterrupt), KeptEmulation() as kept:
        kept.bring_up(2.0, lambda: fakes.make("k2"))
        raise KeyboardInterrupt
    assert fakes.events[-1] == ("down", "k2")


def test_sessions_on_one_emulation_share_its_install_ids_and_each_has_its_own_task_folder_and_peaks() -> None:
    hosting = Hosting(emu=None, compute=SimpleNamespace(tasks_folder="tasks", peak_rss={"a": 1 << 30}))
    hosting.next_session()
    first = list(itertools.islice(hosting.install_ids, 3))
    assert hosting.compute.tasks_folder == "tasks" and not hosting.reused and hosting.compute.peak_rss
    hosting.next_session()
    assert hosting.compute.tasks_folder == "tasks-2" and next(hosting.install_ids) == first[-1] + 1
    assert hosting.reused and hosting.compute.peak_rss == {}  # the second session's peaks are its own


def test_a_compute_managers_task_directories_go_to_its_tasks_folder(tmp_path: Path) -> None:
    from orchestrator.runtime.compute import ComputeManager

    manager = ComputeManager(SimpleNamespace(log_root=tmp_path, name="fake"), ["a"])
    assert manager.task_dir("mst-501") == tmp_path / "tasks" / "mst-501"
    manager.tasks_folder = "tasks-2"
    assert manager.task_dir("mst-501") == tmp_path / "tasks-2" / "mst-501" and (tmp_path / "tasks-2" / "mst-501").is_dir()


def test_fresh_dir_never_reuses_a_folder(tmp_path: Path) -> None:
    assert fresh_dir(tmp_path / "emulation-k16") == tmp_path / "emulation-k16"
    assert fresh_dir(tmp_path / "emulation-k16") == tmp_path / "emulation-k16-2"
    assert fresh_dir(tmp_path / "emulation-k16") == tmp_path / "emulation-k16-3"


# -- the runner: trials bring their emulation up, the run goes on on the last one at its K ------------
def _runner_with_fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ks: list[float], chosen: float,
                       faithful: bool = True) -> tuple[Fakes, list[tuple[str, Any]]]:
    """The runner with fake bring-ups (`hosted`), trials (one per K of `ks`) and sessions, the
    calibration choosing `chosen` (`faithful` or not); returns the fakes and what ran on which
    emulation (the trials and sessions are also in the fakes' events, in order with the bring-ups)."""
    from orchestrator.experiment import runner

    fakes, ran = Fakes(), []
    monkeypatch.setattr(runner, "hosted", lambda kind, cfg, plan, log_root, remote: fakes.make(
        f"k{plan.time_dilation:g} in {log_root.relative_to(tmp_path)}"))

    def trial_run(cfg: Any, out_root: Path, plan: Any, *args: Any, hosting: Any = None, **kw: Any) -> Any:
        ran.append((f"trial k{plan.time_dilation:g}", hosting and hosting.emu.name))
        fakes.events.append(ran[-1])
        return SimpleNamespace(summary=None)

    def search(key: str, trial: Any, cap: float, **kw: Any) -> Calibration:
        return Calibration(k=chosen, faithful=faithful, cap=cap, trials=tuple(trial(k) for k in ks))

    def session(shared: Any, cfg: Any, plan: Any, *, clock_start_s: float = 0.0, hosting: Any = None) -> SessionEnd:
        ran.append((f"run k{plan.time_dilation:g}", hosting and hosting.emu.name))
        fakes.events.append(ran[-1])
        return SessionEnd(outcomes={"done": 1, "failed": 0, "blocked": 0}, lost="", clock_end_s=clock_start_s + 1,
                          wall_s=1.0, bringup_s=0.0, reused=hosting is not None)

    monkeypatch.setattr(runner, "_run_emulated", trial_run)
    monkeypatch.setattr(runner, "search_or_reuse", search)
    monkeypatch.setattr(runner, "judge", lambda k, wall_s, summary: Trial(k=k, faithful=False, reasons=(), wall_s=wall_s))
    monkeypatch.setattr(runner, "run_session", session)
    return fakes, ran


def _shared(tmp_path: Path, cfg: Any, db: ResultsDB) -> RunShared:
    from topologies.plan import EmulationPlan

    model = cfg.network()
    run_id = db.start_run(cfg.name, cfg.to_dict())
    db.record_topology(run_id, model.name, model.to_dict(), EmulationPlan.from_model(model).to_dict())
    return RunShared(db=db, run_id=run_id, run_dir=tmp_path, model=model, backend_kind="process", model_bytes=1)


CFG: dict[str, Any] = {"name": "kept", "topology": "ring:6", "schedulers": ["mst"], "locals": [1, 3],
                       "tasks_per_point": 1, "task": {"rounds": 2}}


def test_each_point_runs_on_its_last_trials_emulation_and_nothing_stays_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.experiment import runner
    from topologies.plan import EmulationPlan

    cfg = parse_config({**CFG, "emulation": {"time_dilation": "auto", "per_point": True, "max_time_dilation": 8}})
    fakes, ran = _runner_with_fakes(monkeypatch, tmp_path, [1.0, 2.0], chosen=2.0)
    with ResultsDB(tmp_path / "results.db") as db:
        shared = _shared(tmp_path, cfg, db)
        runner._points(shared, cfg, EmulationPlan.from_model(shared.model))
        walls = db.run(shared.run_id)["environment"]["wall_per_point"]

    one, three = "calibration/1-locals/emulation-k", "calibration/3-locals/emulation-k"
    assert ran == [("trial k1", f"k1 in {one}1"), ("trial k2", f"k2 in {one}2"), ("run k2", f"k2 in {one}2"),
                   ("trial k1", f"k1 in {three}1"), ("trial k2", f"k2 in {three}2"), ("run k2", f"k2 in {three}2")]
    # one up at a time: each torn down before the next comes up, the last after its point's run
    assert [e for e in fakes.events if e[0] in ("up", "down")] == [
        (e, f"k{k} in {d}{k}") for d in (one, three) for k in (1, 2) for e in ("up", "down")]
    assert fakes.events.index(("down", f"k2 in {one}2")) > fakes.events.index(("run k2", f"k2 in {one}2"))
    assert walls["1"]["on_trial_emulation"] and walls["3"]["on_trial_emulation"]


def test_a_run_at_a_k_no_trial_ran_at_brings_up_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.experiment import runner
    from topologies.plan import EmulationPlan

    cfg = parse_config({**CFG, "locals": [3], "emulation": {"time_dilation": "auto", "max_time_dilation": 8}})
    fakes, ran = _runner_with_fakes(monkeypatch, tmp_path, [1.0, 2.0, 4.0], chosen=8.0)  # e.g. the cap's
    with ResultsDB(tmp_path / "results.db") as db:
        shared = _shared(tmp_path, cfg, db)
        runner._one_k(shared, cfg, EmulationPlan.from_model(shared.model))

    assert ran[-1] == ("run k8", None)  # its own: the last trial's, at K = 4, was torn down before it
    assert fakes.events[-3:] == [("trial k4", "k4 in calibration/emulation-k4"),
                                 ("down", "k4 in calibration/emulation-k4"), ("run k8", None)]


def test_a_cap_whose_trial_was_not_faithful_is_torn_down_and_the_run_brings_up_its_own(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.experiment import runner
    from topologies.plan import EmulationPlan

    cfg = parse_config({**CFG, "locals": [3], "emulation": {"time_dilation": "auto", "max_time_dilation": 4}})
    fakes, _ = _runner_with_fakes(monkeypatch, tmp_path, [1.0, 2.0, 4.0], chosen=4.0, faithful=False)
    with ResultsDB(tmp_path / "results.db") as db:
        shared = _shared(tmp_path, cfg, db)
        runner._one_k(shared, cfg, EmulationPlan.from_model(shared.model))

    assert fakes.events[-3:] == [("trial k4", "k4 in calibration/emulation-k4"),
                                 ("down", "k4 in calibration/emulation-k4"), ("run k4", None)]


def test_a_points_line_says_it_ran_on_its_trials_emulation_and_has_no_bring_up() -> None:
    wall = {"k": 16.0, "calibration_s": 40.0, "bringup_s": 0.0, "tasks_s": 100.0, "emulated_s": 5.0,
            "wall_s": 150.0, "on_trial_emulation": True}
    line = point_wall_line(5, 16.0, "chosen by calibration", wall)

    assert line == ("5 locals: K=16 (chosen by calibration), on its last trial's emulation; wall time 150.0 s: "
                    "trials 40.0 s, tasks 100.0 s, the rest 10.0 s; 5.00 s emulated: 30 x")
    assert "bring-up 0.0 s" in point_wall_line(5, 16.0, "chosen by calibration", {**wall, "on_trial_emulation": False})
