"""Time dilation K scales rates, delays, timeouts, modelled compute and recorded durations
consistently: the emulation runs K times slower, and every figure it records is in emulated time."""

from __future__ import annotations

import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation.network_port import ControllerNetwork
from orchestrator.lifecycle.core import RunClock
from orchestrator.lifecycle.dilation import undilate_overruns, undilate_round, undilate_setup
from orchestrator.runtime.summaries import RoundResult
from orchestrator.runtime.timing import task_timing
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.cost import emulated_rate
from orchestrator.scheduling.tasks import Task
from tests.unit.lifecycle_fakes import make_rig
from topologies.errors import TopologyError
from topologies.loaders import load
from topologies.plan import EmulationPlan
from workers.compute import modelled_s

K = 4.0


def test_a_dilated_plan_slows_every_link_and_stretches_every_delay() -> None:
    plan = EmulationPlan.from_model(load("sndlib/nobel-us"), max_link_mbps=100.0)
    slow = plan.dilated(K)
    assert slow.time_dilation == K and slow.bw_scale == pytest.approx(plan.bw_scale / K)
    for a, b in zip(plan.links, slow.links, strict=True):
        assert b.emulated_mbps == pytest.approx(a.emulated_mbps / K)
        assert b.delay_ms == pytest.approx(a.delay_ms * K)
        assert b.capacity_mbps == a.capacity_mbps
    assert EmulationPlan.from_dict(slow.to_dict()) == slow
    with pytest.raises(TopologyError):
        plan.dilated(0.5)


def test_bounds_use_the_undilated_rate_and_timeouts_the_dilated_one() -> None:
    model = load("sndlib/nobel-us")
    plan = EmulationPlan.from_model(model, max_link_mbps=100.0)
    slow = plan.dilated(K)
    network = ControllerNetwork(None, slow, delay_emulated=False)
    a, b = plan.links[0].a, plan.links[0].b
    assert network.rate(a, b) == pytest.approx(emulated_rate(plan)(a, b))  # the core's bounds: emulated time
    task = Task(1, "Seattle", ("Boulder", "Atlanta", "Ithaca"))
    sched = get_scheduler("mst").schedule(NetworkState(model), task)
    real = task_timing(model, sched, 2_000_000, rate=emulated_rate(plan), train_allowance_s=0.0)
    dilated = task_timing(model, sched, 2_000_000, rate=emulated_rate(slow), train_allowance_s=0.0)
    assert dilated.store_and_forward_s == pytest.approx(K * real.store_and_forward_s)


def test_the_run_clock_and_modelled_compute_scale_by_k() -> None:
    clock = RunClock(100.0, dilation=K)
    assert clock.of(108.0) == pytest.approx(2.0)
    assert modelled_s(1e-3, 100, 1, train_s_per_round=0.0, site_speed=1.0, time_dilation=K) == pytest.approx(K * 0.1)
    # the round's fixed cost lasts K times as long too
    assert modelled_s(1e-3, 100, 1, train_s_per_round=0.02, site_speed=1.0, time_dilation=K) \
        == pytest.approx(K * 0.12)


def _done(tmp_path: Path, dilation: float) -> Any:
    rig = make_rig(tmp_path / str(dilation), dilation=dilation)
    task = rig.task(1, ["r2", "r3"], rounds=2)
    live = rig.start("mst", task, NetworkState(rig.model))
    rig.run(live)
    return rig.recorder.rounds_of("mst", 1), rig.recorder.setups[("mst", 1)]


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_core_records_what_the_roles_measured_divided_by_k(tmp_path: Path) -> None:
    real, real_setup = _done(tmp_path, 1.0)
    # on the core's own logger (whatever an earlier test made of the loggers above it)
    log, lines = logging.getLogger("netai.tasks"), _Lines()
    level = log.level
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    try:
        slow, slow_setup = _done(tmp_path, K)
    finally:
        log.removeHandler(lines)
        log.setLevel(level)
    # the task's log line gives the recorded (emulated) latency, and says so
    line = next(m for m in lines.lines if "rounds, last latency" in m)
    assert f"last latency {slow[2].result.latency_s:.3f} s emulated (K={K:g})" in line
    assert sorted(real) == sorted(slow) == [1, 2]
    for r in (1, 2):
        assert slow[r].result.latency_s == pytest.approx(real[r].result.latency_s / K)
        assert slow[r].result.train_min_s == pytest.approx(real[r].result.train_min_s / K)
        # the bound takes the round's own (undilated) training; its transfers are the network's
        assert slow[r].bound.train_s == pytest.approx(real[r].bound.train_s / K)
        assert slow[r].bound.broadcast_s == pytest.approx(real[r].bound.broadcast_s)
    assert slow_setup["agents_ready_s"] == pytest.approx(real_setup["agents_ready_s"] / K)
    assert slow_setup["chunk_bytes"] == real_setup["chunk_bytes"]


def test_overruns_and_setup_figures_are_undilated() -> None:
    assert undilate_setup({"agents_ready_s": 2.0, "connect_s": 1.0, "store_and_forward_s": 0.5, "chunk_bytes": 1024},
                          K) == {"agents_ready_s": 0.5, "connect_s": 0.25, "store_and_forward_s": 0.5, "chunk_bytes": 1024}
    assert undilate_overruns([{"round": 1, "site": "B", "real_s": 4.0, "modelled_s": 2.0}], K) == [
        {"round": 1, "site": "B", "real_s": 1.0, "modelled_s": 0.5}]
    r = RoundResult(round=1, latency_s=0.8, broadcast_s=0.2, train_s=0.4, upload_s=0.2, accuracy=0.9, loss=0.1,
                    num_examples=10, stragglers=(), train_min_s=0.4)
    back = undilate_round(r, K)
    for f in fields(r):
        want = getattr(r, f.name) / K if f.name.endswith("_s") else getattr(r, f.name)
        assert getattr(back, f.name) == pytest.approx(want), f.name
