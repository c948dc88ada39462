"""The order the schedulers run each task in (`orchestrator.experiment.runs.scheduler_order`): the
config's order rotated by the task's index in its point, so that no scheduler always runs first
(an order effect of the instrument, issue 30), the same in the emulated runner and the simulation
engine; ``order: fixed`` keeps the config's order for every task."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import parse_config
from orchestrator.experiment.run_context import ExperimentRun
from orchestrator.experiment.runs import scheduler_order, task_id_stride, task_sets
from orchestrator.experiment.session import run_sequential
from orchestrator.results.db import ResultsDB
from orchestrator.scheduling.mst import MST
from orchestrator.scheduling.spff import SPFF
from orchestrator.scheduling.trees import Steiner
from tests.unit.lifecycle_fakes import Schedulers, make_rig
from topologies.loaders import load

THREE = ("spff", "mst", "steiner")


def test_rotation_starts_each_task_one_scheduler_further() -> None:
    assert [scheduler_order(THREE, k) for k in range(4)] == [
        ("spff", "mst", "steiner"), ("mst", "steiner", "spff"), ("steiner", "spff", "mst"), ("spff", "mst", "steiner")]
    assert scheduler_order(["spff", "mst"], 1) == ("mst", "spff")
    assert scheduler_order(["spff"], 5) == ("spff",)


@pytest.mark.parametrize("names", [("a",), ("a", "b"), THREE, ("a", "b", "c", "d", "e")])
def test_over_whole_cycles_every_scheduler_holds_every_place_equally_often(names: tuple[str, ...]) -> None:
    m = len(names)
    for cycles in (1, 3):
        orders = [scheduler_order(names, k) for k in range(cycles * m)]
        assert all(sorted(o) == sorted(names) for o in orders)  # every scheduler runs every task once
        for place in range(m):
            assert Counter(o[place] for o in orders) == dict.fromkeys(names, cycles)
        assert orders == [scheduler_order(list(names), k) for k in range(cycles * m)]  # deterministic


def test_over_any_number_of_tasks_the_firsts_differ_by_at_most_one() -> None:
    for n in range(1, 11):
        firsts = Counter(scheduler_order(THREE, k)[0] for k in range(n))
        assert max(firsts.values()) - min(firsts.get(s, 0) for s in THREE) <= 1


def test_fixed_keeps_the_configs_order_and_an_unknown_order_is_refused() -> None:
    assert all(scheduler_order(THREE, k, "fixed") == THREE for k in range(4))
    with pytest.raises(ValueError, match="unknown scheduler order 'random'"):
        scheduler_order(THREE, 0, "random")


def test_the_config_key_defaults_to_rotate_and_is_checked() -> None:
    assert parse_config({"name": "x"}).order == "rotate"
    fixed = parse_config({"name": "x", "order": "fixed"})
    assert fixed.order == "fixed" and parse_config(fixed.to_dict()) == fixed
    with pytest.raises(ConfigError, match="order must be one of rotate, fixed, got 'shuffle'"):
        parse_config({"name": "x", "order": "shuffle"})
    with pytest.raises(ConfigError, match="order needs mode: sequential"):
        parse_config({"name": "x", "mode": "online", "order": "rotate"})
    online = parse_config({"name": "x", "mode": "online"})
    assert "order" not in online.to_dict() and parse_config(online.to_dict()) == online


def _expected(cfg_schedulers: tuple[str, ...], tasks: int, order: str) -> list[str]:
    return [name for k in range(tasks) for name in scheduler_order(cfg_schedulers, k, order)]


@pytest.mark.parametrize("order", ["rotate", "fixed"])
def test_the_emulated_runner_runs_each_task_in_that_order(tmp_path: Path, order: str) -> None:
    # Prepare: the runner's sequential loop on the lifecycle core over fakes (a ring of 4), three
    # schedulers, one point of 4 tasks.
    rig = make_rig(tmp_path)
    rig.core.schedulers = rig.schedulers = Schedulers(spff=SPFF(), mst=MST(), steiner=Steiner())
    cfg = parse_config({"name": "x", "topology": "ring:4", "schedulers": list(THREE), "locals": [2],
                        "tasks_per_point": 4, "task": {"rounds": 2}, "order": order})
    run = ExperimentRun(core=rig.core, cfg=cfg, emu=None, compute=rig.compute, db=None,  # type: ignore[arg-type]
                        run_id=1, plan=None, model=rig.model)  # type: ignore[arg-type]

    run_sequential(run, 1_000_000, progress=False)

    # Assert: scheduled in the rotated (or fixed) order, task by task, and every run ended done.
    assert rig.schedulers.asked == _expected(THREE, 4, order)
    tasks = task_sets(cfg, rig.model, 1_000_000)[2]
    arrived = sorted(rig.recorder.arrivals.items(), key=lambda kv: kv[1])
    assert [label for (label, _), _ in arrived] == _expected(THREE, 4, order)
    assert [tid for (_, tid), _ in arrived] == [t.id for t in tasks for _ in THREE]
    assert all(rig.recorder.states_of(s, t.id)[-1] == "done" for s in THREE for t in tasks)


@pytest.mark.parametrize("order", ["rotate", "fixed"])
def test_the_simulation_runs_each_task_in_the_same_order(tmp_path: Path, order: str) -> None:
    from orchestrator.experiment.simulated import run_simulated

    # Prepare: a simulated run on the triangle, three schedulers, 3 tasks of 2 locals.
    cfg = parse_config({"name": "simorder", "engine": "simulation", "topology": "triangle",
                        "schedulers": list(THREE), "locals": [2], "tasks_per_point": 3, "task": {"rounds": 1},
                        "order": order, "simulation": {"rates": "emulated"}})

    outcome = run_simulated(cfg, out_root=tmp_path, model_bytes=200_000, figures=False)

    # Assert: the runs' arrivals (a simulated task arrives when its run starts, one run after the
    # other) are in the order the emulated runner uses, as the results database records them.
    assert outcome.status == "completed"
    with ResultsDB(outcome.run_dir / "results.db") as db:
        rows = db.query("SELECT scheduler, task_id, arrival_s FROM tasks WHERE run_id = ? ORDER BY arrival_s",
                        (outcome.run_id,))
    assert len({r["arrival_s"] for r in rows}) == len(rows) == 9  # no two runs at once
    assert [r["scheduler"] for r in rows] == _expected(THREE, 3, order)
    assert [r["task_id"] for r in rows] == sorted(r["task_id"] for r in rows)


@pytest.mark.parametrize("per_point", [1, 99, 100, 101, 1000, 1001])
def test_task_ids_are_unique_in_a_run_however_many_tasks_a_point_has(per_point: int) -> None:
    # Prepare: points of 2, 3 and 4 locals on a ring of 8 (ids were 100 n + k: 101 tasks of
    # point 2 reached 301, point 3's first).
    model = load("ring:8")
    cfg = parse_config({"name": "ids", "topology": "ring:8", "schedulers": ["spff"], "locals": [2, 3, 4],
                        "tasks_per_point": per_point})

    sets = task_sets(cfg, model, 1_000)

    ids = [t.id for n in cfg.locals for t in sets[n]]
    assert len(ids) == len(set(ids)) == 3 * per_point
    # Up to 100 tasks a point, the ids are what they always were (runs compare across versions).
    if per_point <= 100:
        assert [t.id for t in sets[3]] == list(range(301, 301 + per_point))
    assert task_id_stride(per_point) >= per_point


def test_a_resumed_emulated_run_skips_kept_tasks_and_holds_their_reservations(tmp_path: Path) -> None:
    from orchestrator.experiment.resume import Resume

    # Prepare: the sequential loop run whole once; then again as a resume that kept the first 2 tasks
    cfg = parse_config({"name": "x", "topology": "ring:4", "schedulers": ["spff", "mst"], "locals": [2],
                        "tasks_per_point": 4, "task": {"rounds": 2}})

    def run_loop(again: Resume | None, where: Path) -> tuple[list[str], list[tuple[str, int, set[int]]]]:
        rig = make_rig(where)
        rig.core.schedulers = rig.schedulers = Schedulers(spff=SPFF(), mst=MST())
        run = ExperimentRun(core=rig.core, cfg=cfg, emu=None, compute=rig.compute, db=None,  # type: ignore[arg-type]
                            run_id=1, plan=None, model=rig.model)  # type: ignore[arg-type]
        run_sequential(run, 1_000_000, progress=False, again=again)
        seen = [(label, tid, held) for label, tid, _bg, held in rig.recorder.network_states]
        whole.update({(label, s.task_id): s for label, s, _ in rig.recorder.schedules})
        return rig.schedulers.asked, seen

    whole: dict[tuple[str, int], Any] = {}
    asked_all, seen_all = run_loop(None, tmp_path / "a")
    first = [t.id for t in task_sets(cfg, load("ring:4"), 1_000_000)[2]][:2]
    kept = {key: {"state": "done", "schedule": s.to_dict()} for key, s in whole.items() if key[1] in first}

    # Execute
    asked, seen = run_loop(Resume(run_dir=tmp_path, run_id=1, kept=kept), tmp_path / "b")

    # Assert: only the last two tasks ran, each seeing the reservations it saw in the whole run
    assert len(asked) == len(asked_all) - 4
    assert seen == [row for row in seen_all if row[1] not in first]
    assert any(set(first) & held for _label, _tid, held in seen)  # the kept tasks' reservations, put back
