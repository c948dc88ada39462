"""`netai validate`'s statistics: paired sim/emu ratios with intervals, claim overlap, carried bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import parse_config
from orchestrator.results.agreement import claim_agreement, paired_tasks, point_agreement, ratio_of_means
from orchestrator.results.agreement_report import carried_line, claim_lines, draw_tasks, point_lines
from orchestrator.results.summary import TaskSummary


def task(sched: str, tid: int, n: int, latency: float, carried: int = 1000, state: str = "done") -> TaskSummary:
    return TaskSummary(scheduler=sched, task_id=tid, n_locals=n, state=state, reserved_mbps=1.0, carried_bytes=carried,
                       rounds=3, mean_latency_s=latency, mean_ratio_to_bound=None, final_accuracy=None)


def test_ratio_of_means_is_paired_and_its_interval_holds_it() -> None:
    iv = ratio_of_means([1.1, 2.2, 3.3], [1.0, 2.0, 3.0])
    assert iv.ratio == pytest.approx(1.1)
    assert iv.low == pytest.approx(1.1) and iv.high == pytest.approx(1.1)  # every resample has the same ratio
    spread = ratio_of_means([1.0, 2.4, 2.7], [1.0, 2.0, 3.0])
    assert spread.ratio == pytest.approx(6.1 / 6.0)
    assert spread.low < spread.ratio < spread.high and spread.tasks == 3
    assert spread.within(0.10) and not ratio_of_means([1.3], [1.0]).within(0.10)


def test_ratio_of_means_refuses_unpaired_input() -> None:
    with pytest.raises(ValueError, match="paired"):
        ratio_of_means([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="not positive"):
        ratio_of_means([1.0], [0.0])


def test_points_pair_tasks_by_scheduler_and_id_and_compare_carried_bytes() -> None:
    emu = [task("spff", 1, 2, 1.0, 1000), task("spff", 2, 2, 3.0, 3000), task("mst", 1, 2, 0.5, 800),
           task("mst", 2, 2, 0.9, 1200, state="failed")]
    sim = [task("spff", 1, 2, 1.05, 1000), task("spff", 2, 2, 3.15, 3030), task("mst", 1, 2, 0.55, 800),
           task("mst", 2, 2, 0.8, 1200)]

    points = point_agreement(emu, sim)
    pairs = paired_tasks(emu, sim)

    assert len(pairs) == 3  # the task that failed in one engine is not compared
    by = {(p.scheduler, p.n_locals): p for p in points}
    assert by[("spff", 2)].latency.ratio == pytest.approx(4.2 / 4.0)
    assert by[("spff", 2)].carried_ratio == pytest.approx(4030 / 4000)
    assert by[("mst", 2)].latency.tasks == 1 and by[("mst", 2)].carried_ratio == pytest.approx(1.0)
    assert "worst 0.75%" in carried_line(points) and "within 2%" in carried_line(points)
    assert any("spff, 2 locals" in line and "1.050" in line and line.endswith("yes") for line in point_lines(points))


def test_claims_compare_each_engines_paired_ratio_and_their_overlap() -> None:
    emu = [task("spff", i, 8, 2.0) for i in range(3)] + [task("mst", i, 8, x) for i, x in enumerate((1.0, 1.2, 1.1))]
    close = [task("spff", i, 8, 2.0) for i in range(3)] + [task("mst", i, 8, x) for i, x in enumerate((1.1, 1.2, 1.0))]
    far = [task("spff", i, 8, 2.0) for i in range(3)] + [task("mst", i, 8, x) for i, x in enumerate((0.6, 0.6, 0.6))]

    near_claims, far_claims = claim_agreement(emu, close), claim_agreement(emu, far)

    assert [(c.numerator, c.denominator, c.n_locals) for c in near_claims] == [("mst", "spff", 8)]
    assert near_claims[0].emulated is not None and near_claims[0].emulated.mean == pytest.approx(0.55)
    assert near_claims[0].overlap is True and far_claims[0].overlap is False
    assert "NO" in claim_lines(far_claims)[1] and "yes" in claim_lines(near_claims)[1]


def test_the_figure_plots_every_compared_task(tmp_path: Path) -> None:
    pairs = [(task("spff", 1, 2, 1.0), task("spff", 1, 2, 1.05)), (task("mst", 1, 8, 0.5), task("mst", 1, 8, 0.45))]
    files = draw_tasks(pairs, tmp_path, "t")
    assert [f.name for f in files] == ["sim_vs_emu.png", "sim_vs_emu.svg"] and all(f.stat().st_size > 0 for f in files)


def test_validate_refuses_what_the_simulation_cannot_stand_for_before_starting(tmp_path: Path) -> None:
    from orchestrator.experiment.validate import validate

    online = parse_config({"name": "o", "topology": "triangle", "mode": "online", "locals": [2]})
    with pytest.raises(ConfigError, match="sequential"):
        validate(online, out_root=tmp_path)
    simulated = parse_config({"name": "s", "topology": "triangle", "engine": "simulation", "locals": [2]})
    with pytest.raises(ConfigError, match="engine: emulation"):
        validate(simulated, out_root=tmp_path)
    cfg = parse_config({"name": "q", "topology": "triangle", "locals": [2]})
    with pytest.raises(ConfigError, match=r"no results\.db"):
        validate(cfg, out_root=tmp_path, emulated_run=tmp_path / "nothing")
    assert list(tmp_path.iterdir()) == []  # nothing started, no folder made


def test_an_earlier_emulated_run_is_reused_only_for_the_same_config(tmp_path: Path) -> None:
    from orchestrator.experiment.calibrate import same_config_run
    from orchestrator.experiment.validate import simulated_twin
    from orchestrator.results.db import ResultsDB

    # Prepare: an emulated run of a config with the process backend, completed.
    cfg = parse_config({"name": "q", "topology": "triangle", "locals": [2], "seed": 4,
                        "emulation": {"backend": "process"}})
    with ResultsDB(tmp_path / "results.db") as db:
        run_id = db.start_run(cfg.name, cfg.to_dict(), engine="emulation")
        db.finish_run(run_id, "completed", "")

    # The same config with another backend is the same tasks; another seed is not.
    auto = parse_config({**cfg.to_dict(), "emulation": {**cfg.to_dict()["emulation"], "backend": "auto"}})
    assert same_config_run(tmp_path, auto) == run_id
    with pytest.raises(ConfigError, match=r"another config .*seed"):
        same_config_run(tmp_path, parse_config({**cfg.to_dict(), "seed": 5}))
    # A run recorded before the order key ran the schedulers in the config's order: it is the same
    # run as order: fixed, not as the default rotated order.
    old = {k: v for k, v in cfg.to_dict().items() if k != "order"}
    with ResultsDB(tmp_path / "old" / "results.db") as db:
        old_id = db.start_run(cfg.name, old, engine="emulation")
        db.finish_run(old_id, "completed", "")
    assert same_config_run(tmp_path / "old", parse_config({**old, "order": "fixed"})) == old_id
    with pytest.raises(ConfigError, match=r"another config \(differs in: order\)"):
        same_config_run(tmp_path / "old", cfg)
    # The simulated twin keeps the tasks and mirrors the emulated run's delay.
    twin = simulated_twin(cfg, propagation=False)
    assert twin.engine == "simulation" and twin.simulation.rates == "emulated" and not twin.simulation.propagation
    assert (twin.seed, twin.locals, twin.schedulers, twin.task) == (cfg.seed, cfg.locals, cfg.schedulers, cfg.task)
    # A time-dilated config's twin (auto or a fixed K) has no K: the emulation's records are in emulated time.
    for dilation in ("auto", 8):
        dilated = parse_config({**cfg.to_dict(), "emulation": {"backend": "process", "time_dilation": dilation}})
        twin = simulated_twin(dilated, propagation=False)
        assert twin.emulation.time_dilation == 1 and not twin.emulation.time_dilation_auto
        assert (twin.seed, twin.locals, twin.task) == (cfg.seed, cfg.locals, cfg.task)


def test_the_round_parts_table_lists_each_common_point_emulated_over_simulated() -> None:
    from orchestrator.results.agreement_report import parts_lines

    emu = {("mst", 8): {"broadcast_s": 0.5153, "train_s": 0.2956, "upload_s": 0.4823, "training_span_s": 0.2155},
           ("spff", 2): {"broadcast_s": 0.25, "train_s": 0.28, "upload_s": 0.24}}
    sim = {("mst", 8): {"broadcast_s": 0.5179, "train_s": 0.1528, "upload_s": 0.3763, "training_span_s": 0.1626},
           ("steiner", 8): {"broadcast_s": 0.6, "train_s": 0.1, "upload_s": 0.4}}

    lines = parts_lines(emu, sim)

    assert len(lines) == 2  # the header and the one point both runs have
    assert lines[1].startswith("mst, 8 locals")
    assert "515.3 / 517.9" in lines[1] and "295.6 / 152.8" in lines[1] and "215.5 / 162.6" in lines[1]
    assert "every training" in lines[0]


def test_the_validation_names_the_emulated_points_that_measured_the_host(tmp_path: Path) -> None:
    from orchestrator.results.agreement_report import fidelity_lines
    from orchestrator.results.db import ResultsDB

    # Prepare: an emulated run with two points; mst's training overran, spff's held.
    with ResultsDB(tmp_path / "results.db") as db:
        run = db.start_run("v", {"name": "v"})
        for sched, tid in (("mst", 1), ("spff", 2)):
            db.conn.execute("INSERT INTO tasks (run_id, scheduler, task_id, n_locals, global_site, local_sites_json, "
                            "model, rounds, demand_mbps, model_bytes, state) VALUES (?, ?, ?, 2, 'G', '[]', 'mlp', 1, "
                            "1.0, 1, 'done')", (run, sched, tid))
        db.record_fidelity(run, "mst", 1, hops=[], overruns=[{"round": 1, "site": "A", "real_s": 0.3,
                                                              "modelled_s": 0.1}])
        db.conn.commit()

    lines = fidelity_lines(tmp_path, run, [("mst", 2), ("spff", 2)], compute_modelled=True)

    assert lines[0].startswith("emulated reference: 1 of 2 points NOT faithful")
    assert lines[1:] == ["  mst, 2 locals: training"]


@pytest.mark.parametrize("k", [1.0, 2.0, 8.0, 32.0])
def test_the_twin_of_a_dilated_emulation_uses_its_chunk_size_and_per_chunk_time(k: float) -> None:
    from orchestrator.experiment.simulated import sim_params
    from orchestrator.experiment.validate import simulated_twin
    from orchestrator.runtime.timing import ALPHA_S, task_timing
    from orchestrator.scheduling import NetworkState, get_scheduler
    from orchestrator.scheduling.cost import emulated_rate
    from orchestrator.scheduling.tasks import Task
    from orchestrator.simulation.spec import chunk_bytes
    from topologies.loaders import load
    from topologies.plan import EmulationPlan

    cfg = parse_config({"name": "q", "topology": "sndlib/nobel-us", "locals": [4], "seed": 4,
                        "emulation": {"backend": "process", "time_dilation": k}})
    twin = simulated_twin(cfg, propagation=False, time_dilation=k)
    params = sim_params(twin)
    assert params.alpha_s == pytest.approx(ALPHA_S / k)
    model = load("sndlib/nobel-us")
    plan, sites = EmulationPlan.from_model(model, max_link_mbps=100), model.compute_sites
    task = Task(id=1, global_site=sites[0], local_sites=tuple(sites[1:5]), demand_mbps=100.0)
    schedule = get_scheduler("mst").schedule(NetworkState(model), task)
    model_bytes = 2_800_000
    # what the emulation at K chooses: its wall-time rates are the dilated plan's, its chunk size the
    # emulated rates' (the same at every K), and so the twin's
    emulated = task_timing(model, schedule, model_bytes, rate=emulated_rate(plan.dilated(k)),
                           train_allowance_s=1.0, time_dilation=k).chunk_bytes
    undilated = task_timing(model, schedule, model_bytes, rate=emulated_rate(plan), train_allowance_s=1.0).chunk_bytes
    assert emulated == undilated
    assert chunk_bytes(schedule, model_bytes, emulated_rate(plan), params) == emulated
    with pytest.raises(ValueError, match="time dilation"):
        simulated_twin(cfg, propagation=False, time_dilation=0.5)
