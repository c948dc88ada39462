"""`netai validate` gives the simulated schedulers the background the emulated ones were given, per
task, and says whether both engines' schedulers made the same decisions."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from orchestrator.experiment.config import parse_config
from orchestrator.experiment.validate import first_views, split_views
from orchestrator.results import agreement_report as out
from orchestrator.results.db import ResultsDB
from orchestrator.results.queries import decisions, scheduler_views
from orchestrator.scheduling import NetworkState
from orchestrator.scheduling.cost import capacity_rate
from orchestrator.simulation.background import SimBackground
from orchestrator.simulation.ports import SimBatch, SimNetwork
from orchestrator.simulation.spec import SimParams
from topologies.model import NetworkModel

pytest.importorskip("simgrid")


def triangle() -> NetworkModel:
    return NetworkModel.build("tri", [{"name": n} for n in "ABC"], [
        {"a": a, "b": b, "capacity_mbps": 100.0, "delay_ms": 1.0, "wavelengths": 1}
        for a, b in itertools.combinations("ABC", 2)])


def test_the_first_schedulers_snapshot_stands_for_its_task(tmp_path: Path) -> None:
    model = triangle()
    with ResultsDB(tmp_path / "r.db") as db:
        run = db.start_run("x", {})
        for scheduler, task_id, load in (("spff", 7, 10.0), ("mst", 7, 99.0), ("mst", 8, 20.0)):
            state = NetworkState(model)
            state.set_background({("A", "B"): load})
            db.record_network_state(run, scheduler, task_id, state)

        by_scheduler = scheduler_views(db.conn, run)
    views, split = first_views(by_scheduler), split_views(by_scheduler)

    # Every directed link of the task's snapshot, the first scheduler's (spff's for task 7), and
    # task 7 named as one whose schedulers were given different views.
    assert split == [7]
    assert sorted(views) == [7, 8]
    assert len(views[7]) == 6 and views[7][("A", "B")] == 10.0 and views[7][("B", "A")] == 0.0
    assert views[8][("A", "B")] == 20.0


def test_a_replayed_task_gets_its_view_and_the_others_the_modelled_one() -> None:
    model = triangle()
    batch = SimBatch(model, SimParams(), capacity_rate(model), background=None)
    network = SimNetwork(batch, propagation=False, replay={5: {("A", "B"): 42.0}})

    assert network.background(NetworkState(model), task_id=5) == {("A", "B"): 42.0}
    assert network.background(NetworkState(model), task_id=6) is None  # not replayed: no background modelled
    assert network.background(NetworkState(model), task_id=None) is None
    assert network.replayed == {5} and network.asked == {5, 6}


def test_a_replayed_background_governs_the_simulated_decisions(tmp_path: Path) -> None:
    from orchestrator.experiment.simulated import ReplayedBackground, run_simulated

    # Prepare: a simulated run of a small config, then the same config given, for its one task, a
    # background that fills every link.
    cfg = parse_config({"name": "replay", "engine": "simulation", "topology": "triangle",
                        "schedulers": ["spff", "mst"], "locals": [2], "tasks_per_point": 1,
                        "task": {"rounds": 1}, "simulation": {"rates": "emulated"}, "background": {"enabled": False}})
    plain = run_simulated(cfg, out_root=tmp_path / "a", model_bytes=200_000, figures=False)
    with ResultsDB(plain.run_dir / "results.db") as db:
        views = first_views(scheduler_views(db.conn, plain.run_id))
        caps = {(r["a"], r["b"]): r["capacity_mbps"] for r in db.query(
            "SELECT a, b, capacity_mbps FROM network_state WHERE run_id = ?", (plain.run_id,))}
        plain_env = db.run(plain.run_id)["environment"]
    (task_id,) = views
    full = ReplayedBackground("a test's run", {task_id: caps})

    replayed = run_simulated(cfg, out_root=tmp_path / "b", model_bytes=200_000, figures=False, replay=full)

    with ResultsDB(replayed.run_dir / "results.db") as db:
        seen = first_views(scheduler_views(db.conn, replayed.run_id))
        states = db.query("SELECT scheduler, state FROM tasks WHERE run_id = ? ORDER BY scheduler", (replayed.run_id,))
        env = db.run(replayed.run_id)["environment"]
        decided = decisions(db.conn, replayed.run_id)
    assert plain.status == "completed" and plain_env["scheduler_background"] == "none: no background"
    assert seen == {task_id: caps}  # what each scheduler saw is the replay, link for link
    assert states == [{"scheduler": "mst", "state": "blocked"}, {"scheduler": "spff", "state": "blocked"}]
    assert env["scheduler_background"] == "replayed: what the schedulers of a test's run were given, per task (1 task)"
    assert decided == {("mst", task_id): "not scheduled (blocked)", ("spff", task_id): "not scheduled (blocked)"}


def test_schedule_identity_lists_each_pair_that_differs_or_is_missing() -> None:
    emu = {("mst", 1): "a", ("mst", 2): "b", ("spff", 1): "c"}
    sim = {("mst", 1): "a", ("mst", 2): "B", ("spff", 1): "c", ("spff", 2): "d"}

    total, differing = out.schedule_identity(emu, sim)

    assert (total, differing) == (4, [("mst", 2), ("spff", 2)])
    assert out.schedules_line(total, differing) == (
        "decisions (scheduler, task): the same in both engines for 2 of 4; differing: mst task 2, spff task 2")
    assert out.schedules_line(*out.schedule_identity(emu, emu)) == (
        "decisions (scheduler, task): the same in both engines for all 3")


def test_the_background_line_compares_the_measured_views_with_the_modelled_one() -> None:
    line = out.background_view_line("replayed: x", [90.0, 110.0], 125.0)

    assert line == ("scheduler background: replayed: x; measured, summed over links: mean 100.0 Mbit/s over 2 "
                    "tasks [90.0, 110.0], the simulation's modelled view 125.0 (measured/modelled 0.800)")
    assert out.background_view_line("none: no background", [], None) == "scheduler background: none: no background"


def test_the_modelled_total_is_the_sum_of_the_simulated_schedulers_view(tmp_path: Path) -> None:
    from controller.htb import BACKGROUND_SHARE
    from orchestrator.experiment.simulated import controller_route, run_simulated
    from topologies.plan import EmulationPlan

    cfg = parse_config({"name": "bgsum", "engine": "simulation", "topology": "triangle", "schedulers": ["spff"],
                        "locals": [2], "tasks_per_point": 1, "task": {"rounds": 1},
                        "simulation": {"rates": "emulated"}, "background": {"enabled": True, "pattern": "constant"}})
    model = cfg.network()
    plan = EmulationPlan.from_model(model, max_link_mbps=cfg.emulation.max_link_mbps)
    bg = SimBackground.plan(model, plan, cfg.background, topology=cfg.topology, seed=cfg.seed, emulated_rates=True,
                            share=BACKGROUND_SHARE)
    assert bg is not None
    view = bg.routed(lambda a, b: controller_route(plan, a, b)).view_mbps()

    run = run_simulated(cfg, out_root=tmp_path, model_bytes=200_000, figures=False)

    with ResultsDB(run.run_dir / "results.db") as db:
        env = db.run(run.run_id)["environment"]
        seen = first_views(scheduler_views(db.conn, run.run_id))
    assert env["modelled_background_total_mbps"] == pytest.approx(sum(view.values()), abs=1e-3) and view
    assert env["scheduler_background"] == "modelled: the background flows' mean traffic, the same for every task"
    (task_view,) = seen.values()
    assert {k: v for k, v in task_view.items() if v} == pytest.approx(view)


def test_a_partial_replay_says_how_many_tasks_fell_back_to_the_model() -> None:
    from orchestrator.experiment.simulated import ReplayedBackground, _scheduler_background

    model = triangle()
    replay = ReplayedBackground("run x", {5: {("A", "B"): 1.0}})
    network = SimNetwork(SimBatch(model, SimParams(), capacity_rate(model)), propagation=False, replay=replay.by_task)
    for task_id in (5, 6, 7):
        network.background(NetworkState(model), task_id=task_id)

    assert _scheduler_background(replay, network, off=False) == (
        "replayed: what the schedulers of run x were given, per task (1 of 3 tasks; the others modelled)")
    assert _scheduler_background(None, network, off=True) == "none: no background"
