"""Emulated compute (`workers.compute`): a local's training lasts its site's modelled time, and an
overrun (the host slower than the site it emulates) is logged, with real roles on loopback servers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.lifecycle.fidelity import training_rows
from orchestrator.runtime.backends import LoopbackBackend
from orchestrator.runtime.compute import ComputeManager
from orchestrator.runtime.compute_port import ServerCompute
from orchestrator.runtime.summaries import read_events
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.cost import capacity_rate
from orchestrator.scheduling.tasks import Task
from topologies.loaders import load
from workers.compute import TrainingCost, hold, modelled_s
from workers.config import AgentConfig
from workers.spec import LearningSpec

SITES = ("A", "B", "C")


def test_modelled_time_counts_examples_epochs_site_speed_and_dilation() -> None:
    assert modelled_s(1e-3, 500, 2, train_s_per_round=0.0, site_speed=1.0, time_dilation=1.0) == pytest.approx(1.0)
    assert modelled_s(1e-3, 500, 2, train_s_per_round=0.0, site_speed=0.5, time_dilation=3.0) == pytest.approx(6.0)
    # measured: not modelled
    assert modelled_s(0.0, 500, 2, train_s_per_round=0.0, site_speed=1.0, time_dilation=1.0) is None


def test_modelled_time_is_the_rounds_fixed_cost_plus_its_examples_over_the_sites_speed() -> None:
    # 75 examples, 2 epochs: (2 ms + 8 us x 150) at half a core, dilated 4 times
    assert modelled_s(8e-6, 75, 2, train_s_per_round=2e-3, site_speed=0.5, time_dilation=4.0) \
        == pytest.approx((2e-3 + 8e-6 * 150) / 0.5 * 4)
    # the fixed cost is paid once a round, not per epoch
    one, two = (modelled_s(8e-6, 75, e, train_s_per_round=2e-3, site_speed=1.0, time_dilation=1.0) for e in (1, 2))
    assert one is not None and two is not None and two - one == pytest.approx(8e-6 * 75)
    # a profile whose whole cost is fixed is still modelled
    assert modelled_s(0.0, 75, 2, train_s_per_round=2e-3, site_speed=1.0, time_dilation=1.0) == pytest.approx(2e-3)


def _agent(**kw: Any) -> dict[str, Any]:
    return {"task": 1, "site": "B", "host": "10.0.0.2", "broadcast_port": 1, "upload_port": 2, "rounds": 1,
            "upload_parent": {"site": "A", "host": "10.0.0.1"}, "broadcast_parent": {"site": "A", "host": "10.0.0.1"},
            "part_index": 0, **kw}


def test_a_site_server_takes_the_fixed_cost_as_json_and_rejects_a_bad_one() -> None:
    cfg = AgentConfig.from_dict(_agent(train_s_per_example=8e-6, train_s_per_round=2e-3))
    assert (cfg.train_s_per_example, cfg.train_s_per_round) == (8e-6, 2e-3)
    assert AgentConfig.from_dict(cfg.to_dict()) == cfg
    for bad in (-1e-3, float("inf"), float("nan"), "2e-3", True):
        with pytest.raises(ValueError, match="train_s_per_round"):
            AgentConfig.from_dict(_agent(train_s_per_round=bad))
    with pytest.raises(ValueError, match="s_per_round"):
        TrainingCost(s_per_example=1e-5, s_per_round=float("inf"))
    assert TrainingCost(s_per_round=1e-3).modelled and not TrainingCost().modelled


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t
        self.slept: list[float] = []

    def now(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


def test_early_training_is_held_to_the_modelled_end_and_a_late_one_is_an_overrun() -> None:
    emitted: list[tuple[str, dict[str, Any]]] = []

    def emit(event: str, **kw: Any) -> float:
        emitted.append((event, kw))
        return 0.0

    clock = _Clock(10.3)  # training started at 10.0 and took 0.3 s; the site takes 0.5 s
    assert hold(10.0, 0.5, emit=emit, round_=2, sleep=clock.sleep, clock=clock.now) == 0.0
    assert clock.t == pytest.approx(10.5) and emitted == []

    clock = _Clock(10.8)  # took 0.8 s: the host was slower than the site
    assert hold(10.0, 0.5, emit=emit, round_=3, sleep=clock.sleep, clock=clock.now) == pytest.approx(0.3)
    assert clock.slept == []
    assert emitted == [("train_overrun", {"round": 3, "real_s": pytest.approx(0.8), "modelled_s": 0.5})]

    assert hold(10.0, None, emit=emit, round_=4, sleep=clock.sleep, clock=clock.now) == 0.0  # measured


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComputeManager]:
    with ComputeManager(LoopbackBackend(SITES, log_root=tmp_path_factory.mktemp("servers")), SITES) as cm:
        yield cm


def _run(cm: ComputeManager, tmp: Path, training: TrainingCost) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any]]:
    model = load("triangle")
    task = Task(1, "A", ("B", "C"), rounds=2)
    schedule = get_scheduler("mst").schedule(NetworkState(model), task)
    options = replace(LearningSpec(), rounds=2, local_epochs=1)
    compute = ServerCompute(cm, model=model, rate=capacity_rate(model), propagation=False, train_allowance_s=30.0,
                            options=lambda _t: options, training=training)
    run = compute.launch(schedule, task=task, schedule=schedule, log_dir=compute.task_dir(tmp.name), first_round=1,
                         init_model=None)
    configs = {n: run.configs[n] for n in schedule.overlay_nodes}
    run.start()
    try:
        while not run.check(cm.poll(schedule.overlay_nodes)):
            time.sleep(0.05)
    finally:
        run.stop()
    return {n: read_events(p) for n, p in run.paths.items()}, configs


def _train_times(events: list[dict[str, Any]]) -> dict[int, float]:
    start = {e["round"]: e["t"] for e in events if e["event"] == "train_start"}
    return {e["round"]: e["t"] - start[e["round"]] for e in events if e["event"] == "train_end"}


def test_real_roles_hold_their_update_to_the_modelled_time(servers: ComputeManager, tmp_path: Path) -> None:
    # 0.05 s a round + 1438/2 examples x 1 epoch: ~0.41 s a round
    events, configs = _run(servers, tmp_path, TrainingCost(s_per_example=5e-4, s_per_round=0.05))
    for site in ("B", "C"):
        examples = next(e["num_examples"] for e in events[site] if e["event"] == "train_end")
        modelled = 0.05 + 5e-4 * examples
        assert configs[site].train_s_per_example == 5e-4 and configs[site].site_speed == 1.0
        assert configs[site].train_s_per_round == 0.05
        assert all(t >= modelled for t in _train_times(events[site]).values()), events[site]
        assert not [e for e in events[site] if e["event"] == "train_overrun"]
        # train_end says how much of the modelled time the real training used (held: at most all of it)
        ends = [e for e in events[site] if e["event"] == "train_end"]
        assert all(0 < e["real_s"] <= e["modelled_s"] == pytest.approx(modelled, rel=1e-3) for e in ends), ends
    assert configs["A"].train_s_per_example == configs["A"].train_s_per_round == 0.0  # G trains nothing


def test_a_host_slower_than_the_site_logs_an_overrun_every_round(servers: ComputeManager, tmp_path: Path) -> None:
    events, _ = _run(servers, tmp_path, TrainingCost(s_per_example=1e-12))  # a site a million times faster than this host
    for site in ("B", "C"):
        overruns = [e for e in events[site] if e["event"] == "train_overrun"]
        assert [e["round"] for e in overruns] == [1, 2]
        assert all(e["real_s"] > e["modelled_s"] > 0 for e in overruns)
    rows = training_rows(events)
    assert [(r["round"], r["site"]) for r in rows] == [(1, "B"), (1, "C"), (2, "B"), (2, "C")]
    assert all(r["real_s"] > r["modelled_s"] > 0 for r in rows)
