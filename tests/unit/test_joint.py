"""Joint network and compute scheduling: the sites' CPU in the network state, the round
prediction (checked by hand), the `joint` scheduler's choices, and the measured task profiles."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.runtime import profiles
from orchestrator.runtime.compute_model import ComputeModel, training_cost
from orchestrator.runtime.profiles import (
    CACHE_VERSION,
    MeasuredProfile,
    fit_training_cost,
    load_profile,
    measure,
    profile_key,
    training_profile,
)
from orchestrator.scheduling import SCHEDULERS, NetworkState, get_scheduler
from orchestrator.scheduling.joint import Joint, TrainingProfile, predict_round
from orchestrator.scheduling.state import AGGREGATE_CPU, TRAIN_CPU, compute_demand
from orchestrator.scheduling.tasks import Task, generate_tasks
from topologies.loaders import load
from topologies.model import NetworkModel
from workers.compute import TrainingCost
from workers.spec import LearningSpec


def star(rate_mbps: float = 1000.0) -> NetworkModel:
    """G, A, B, C around a hub H with compute; one wavelength of `rate_mbps` per link."""
    return NetworkModel.build(
        "star", [{"name": n} for n in ("G", "A", "B", "C", "H")],
        [{"a": "H", "b": n, "length_km": 100, "wavelengths": 1, "wavelength_mbps": rate_mbps}
         for n in ("G", "A", "B", "C")],
    )


STAR_TASK = Task(id=3, global_site="G", local_sites=("A", "B", "C"), demand_mbps=300)


def line() -> NetworkModel:
    return NetworkModel.build("line", [{"name": "G"}, {"name": "L"}],
                              [{"a": "G", "b": "L", "length_km": 100, "capacity_mbps": 80_000}])


# -- compute in the network state ------------------------------------------------------------------
def test_admit_and_release_reserve_the_cpu_of_a_tasks_roles() -> None:
    state = NetworkState(star())
    s = get_scheduler("spt").schedule(state, STAR_TASK)
    assert s.aggregation_sites == {"G", "H"}

    assert compute_demand(s) == {"A": TRAIN_CPU, "B": TRAIN_CPU, "C": TRAIN_CPU, "G": AGGREGATE_CPU,
                                 "H": AGGREGATE_CPU}
    state.admit(s)
    assert state.ai_cpu("A") == TRAIN_CPU and state.cpu_used("H") == AGGREGATE_CPU
    assert state.cpu_load("A") == pytest.approx(1.0)
    cut = state.without_links([("H", "C")], around="G")
    assert cut.ai_cpu("A") == TRAIN_CPU and "C" not in cut.model.sites

    state.release(STAR_TASK.id)
    assert all(state.cpu_used(n) == 0 for n in state.model.sites)


def test_cpu_share_is_shared_out_when_a_site_is_oversubscribed() -> None:
    state = NetworkState(star())
    state.set_background_cpu({"A": 1.0, "B": 0.5})

    assert state.cpu_share("A", 1.0) == pytest.approx(0.5)   # two cores asked of one
    assert state.cpu_share("B", 0.5) == 1.0                   # exactly full
    assert state.cpu_share("C", 1.0) == 1.0
    assert state.cpu_load("A") == 1.0 and state.cpu_capacity("A") == 1.0


@pytest.mark.parametrize("loads", [{"Z": 1.0}, {"A": -1.0}, {"A": math.nan}, {"A": True}])
def test_bad_background_cpu_is_refused(loads: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        NetworkState(star()).set_background_cpu(loads)


def test_a_blocked_schedule_uses_no_cpu() -> None:
    state = NetworkState(star())
    big = Task(id=1, global_site="G", local_sites=("A",), demand_mbps=5000)
    assert compute_demand(get_scheduler("spt").schedule(state, big)) == {}


# -- the prediction ----------------------------------------------------------------------------------
PROFILE = TrainingProfile(train_cpu_s_per_example=1e-5, train_cpu_s_per_round=2e-3, examples_per_round=1000,
                          aggregate_cpu_s_per_mb=2e-3)
LINE_TASK = Task(id=1, global_site="G", local_sites=("L",), model_bytes=1_000_000, demand_mbps=1000)


def test_prediction_of_one_local_by_hand() -> None:
    state = NetworkState(line())
    s = get_scheduler("spt").schedule(state, LINE_TASK)
    hop = 8e6 / 80_000e6 + 100 * 0.005e-3  # 1 MB at 80 Gbit/s (nothing else there) + 100 km of fiber
    train = 2e-3 + 1e-5 * 1000  # the round's fixed cost and its examples
    aggregate = 2e-3 * 1.0 * 1  # one child's MB at G

    p = predict_round(state, LINE_TASK, s, PROFILE)

    assert p.arrival_s["L"] == pytest.approx(hop)
    assert p.train_s == {"L": pytest.approx(train)}
    assert p.round_s == pytest.approx(hop + train + hop + aggregate)


def test_prediction_feels_site_load_and_link_load() -> None:
    state = NetworkState(line())
    s = get_scheduler("spt").schedule(state, LINE_TASK)
    idle = predict_round(state, LINE_TASK, s, PROFILE)

    state.set_background_cpu({"L": 1.0})  # the local gets half a core: training takes twice as long
    loaded = predict_round(state, LINE_TASK, s, PROFILE)
    assert loaded.train_s["L"] == pytest.approx(2 * idle.train_s["L"])
    assert loaded.round_s == pytest.approx(idle.round_s + idle.train_s["L"])
    assert predict_round(state, LINE_TASK, s, PROFILE, site_load=False).round_s == pytest.approx(idle.round_s)

    state.set_background({("G", "L"): 79_500.0})  # 500 Mbit/s left: the task gets its reserved 1000
    slow = predict_round(state, LINE_TASK, s, PROFILE).arrival_s["L"]
    assert slow == pytest.approx(8e6 / 1000e6 + 100 * 0.005e-3)


def test_prediction_of_a_blocked_schedule_is_refused() -> None:
    state = NetworkState(line())
    blocked = get_scheduler("spt").schedule(state, Task(id=1, global_site="G", local_sites=("L",),
                                                         demand_mbps=1e6))
    with pytest.raises(ValueError, match="blocked"):
        predict_round(state, LINE_TASK, blocked)


# -- the scheduler -----------------------------------------------------------------------------------
def test_joint_is_registered_and_takes_options() -> None:
    assert SCHEDULERS["joint"] is Joint
    assert get_scheduler("joint", weight="hops").weight == "hops"
    with pytest.raises(ConfigError):
        get_scheduler("joint", weight="aux")
    with pytest.raises(ConfigError):
        get_scheduler("joint", profile={"train_cpu_s_per_example": 1})
    with pytest.raises(ValueError):
        TrainingProfile(examples_per_round=0)


def test_joint_aggregates_at_an_idle_hub_and_not_at_a_hot_one() -> None:
    """Three updates through the hub's 1 Gbit/s link to G take three times one: aggregating at an
    idle hub pays; at a hub whose core is shared ten ways, its aggregation costs more than that."""
    state = NetworkState(star())
    idle = get_scheduler("joint").schedule(state, STAR_TASK)
    assert idle.scheduler == "joint" and idle.aggregation_sites == {"G", "H"}
    mst = get_scheduler("mst").schedule(state, STAR_TASK)
    assert predict_round(state, STAR_TASK, idle).round_s < 0.8 * predict_round(state, STAR_TASK, mst).round_s

    state.set_background_cpu({"H": 9.0})
    hot = get_scheduler("joint").schedule(state, STAR_TASK)
    assert hot.aggregation_sites == {"G"}
    spt = get_scheduler("spt").schedule(state, STAR_TASK)  # still aggregates at H
    assert predict_round(state, STAR_TASK, hot).round_s < 0.6 * predict_round(state, STAR_TASK, spt).round_s
    # Blind to the sites' load, joint keeps the hub's aggregation and loses that.
    blind = get_scheduler("joint", site_load=False).schedule(state, STAR_TASK)
    assert blind.aggregation_sites == {"G", "H"}


def test_joint_predicts_no_worse_than_any_network_only_scheduler_on_loaded_nsfnet() -> None:
    model = load("sndlib/nobel-us")
    rng = random.Random(5)
    for task in generate_tasks(model, count=6, locals_per_task=4, seed=2):
        state = NetworkState(model)
        state.set_background_cpu({s: rng.choice([0.0, 0.0, 1.0, 3.0]) for s in model.sites})
        best = predict_round(state, task, get_scheduler("joint").schedule(state, task)).round_s
        for name in ("mst", "spt", "steiner", "spff"):
            other = get_scheduler(name).schedule(state, task)
            assert best <= predict_round(state, task, other).round_s * (1 + 1e-9), name


def test_joint_is_pure_and_deterministic() -> None:
    model = load("sndlib/nobel-us")
    state = NetworkState(model)
    state.set_background_cpu({"Boulder": 2.0})
    task = generate_tasks(model, count=1, locals_per_task=5, seed=4)[0]
    before = (dict(state.background_cpu), {n: state.ai_cpu(n) for n in model.sites})

    a, b = get_scheduler("joint").schedule(state, task), get_scheduler("joint").schedule(state, task)

    assert a == b
    assert (dict(state.background_cpu), {n: state.ai_cpu(n) for n in model.sites}) == before


def test_joint_blocks_only_when_every_candidate_does() -> None:
    state = NetworkState(star())
    s = get_scheduler("joint").schedule(state, Task(id=1, global_site="G", local_sites=("A",), demand_mbps=5000))
    assert s.blocked and s.scheduler == "joint" and "no" in s.reason


# -- task profiles -------------------------------------------------------------------------------
def test_measured_profile_of_the_workers_mlp(tmp_path: Path) -> None:
    cache = tmp_path / "profiles.json"

    p = load_profile("mlp", cache=cache)

    assert p.model == "mlp" and p.dataset == "digits" and p.train_examples == 1438
    assert 0 < p.train_cpu_s_per_example < 0.01 and 0 < p.aggregate_cpu_s_per_mb < 1
    assert 0 <= p.train_cpu_s_per_round < 1
    assert p.model_bytes > 0
    doc = json.loads(cache.read_text())
    assert doc["version"] == CACHE_VERSION == 2 and len(doc["profiles"]) == 1
    tp = training_profile(p, local_epochs=3)
    assert tp.examples_per_round == 3 * 1438 and tp.train_cpu_s_per_example == p.train_cpu_s_per_example
    assert tp.train_cpu_s_per_round == p.train_cpu_s_per_round


def test_a_cached_profile_is_used_as_it_is(tmp_path: Path) -> None:
    import torch

    cache = tmp_path / "profiles.json"
    key = profile_key("mlp", torch_version=str(torch.__version__))
    cached = MeasuredProfile(model="mlp", dataset="digits", batch_size=32, train_cpu_s_per_example=0.125,
                             train_cpu_s_per_round=0.25, aggregate_cpu_s_per_mb=0.5, train_examples=1438,
                             model_bytes=19240, torch_version=str(torch.__version__), model_args={}, dataset_args={})
    cache.write_text(json.dumps({"version": CACHE_VERSION, "profiles": {key: cached.to_dict()}}))

    assert load_profile("mlp", cache=cache) == cached
    # A broken cache is measured again and replaced, not trusted.
    cache.write_text("{not json")
    assert load_profile("mlp", cache=cache).train_cpu_s_per_example != 0.125
    assert json.loads(cache.read_text())["version"] == CACHE_VERSION


def _fake_measure(calls: list[str]) -> Any:
    def measure(model: str, **_kw: Any) -> MeasuredProfile:
        calls.append(model)
        return MeasuredProfile(model=model, dataset="digits", batch_size=32, train_cpu_s_per_example=1e-5,
                               train_cpu_s_per_round=1e-3, aggregate_cpu_s_per_mb=0.5, train_examples=1438,
                               model_bytes=19240, torch_version="x")
    return measure


def test_a_profile_without_the_fixed_cost_is_measured_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    calls: list[str] = []
    monkeypatch.setattr(profiles, "measure", _fake_measure(calls))
    cache = tmp_path / "profiles.json"
    key = profile_key("mlp", torch_version=str(torch.__version__))
    old = {"model": "mlp", "dataset": "digits", "batch_size": 32, "train_cpu_s_per_example": 0.125,
           "aggregate_cpu_s_per_mb": 0.5, "train_examples": 1438, "model_bytes": 19240,
           "torch_version": str(torch.__version__), "model_args": {}, "dataset_args": {}}
    # a version 1 cache (no per-round cost): measured again, and rewritten as the current version
    cache.write_text(json.dumps({"version": 1, "profiles": {key: old}}))
    p = load_profile("mlp", cache=cache)
    assert calls == ["mlp"] and (p.train_cpu_s_per_example, p.train_cpu_s_per_round) == (1e-5, 1e-3)
    doc = json.loads(cache.read_text())
    assert doc["version"] == CACHE_VERSION and doc["profiles"][key]["train_cpu_s_per_round"] == 1e-3
    assert load_profile("mlp", cache=cache).train_cpu_s_per_round == 1e-3 and calls == ["mlp"]  # cached now
    # an entry of the current version that lacks the field is measured again too, not read as 0
    cache.write_text(json.dumps({"version": CACHE_VERSION, "profiles": {key: old}}))
    assert load_profile("mlp", cache=cache).train_cpu_s_per_round == 1e-3 and calls == ["mlp", "mlp"]


def test_the_fit_recovers_a_known_fixed_cost_and_slope() -> None:
    fixed, slope = 1.2e-3, 1.5e-5
    def t(n: int, noise: float = 0.0) -> float:
        return fixed + slope * n + noise
    # each size's median counts: the outliers (another process's work on the host) do not
    samples = {1438: [t(1438, e) for e in (0.0, 4e-3, -1e-7, 9e-3, -2e-7)],
               60: [t(60, e) for e in (-3e-7, 0.0, 3e-3, -1e-7, 2e-3)]}
    assert fit_training_cost(samples) == (pytest.approx(fixed), pytest.approx(slope))
    # more sizes: least squares through their medians
    assert fit_training_cost({n: [t(n)] for n in (30, 60, 120, 1438)}) == (pytest.approx(fixed), pytest.approx(slope))


def test_the_fit_never_models_a_negative_fixed_cost() -> None:
    # the small part timed below the line through the whole split: clamped at 0, slope through the origin
    fixed, slope = fit_training_cost({1000: [1e-2], 100: [5e-4]})
    assert fixed == 0.0 and slope == pytest.approx((1000 * 1e-2 + 100 * 5e-4) / (1000**2 + 100**2))
    # one size: no intercept can be told
    assert fit_training_cost({1000: [1e-2, 3e-2, 2e-2]}) == (0.0, pytest.approx(2e-5))
    with pytest.raises(ValueError):
        fit_training_cost({})
    with pytest.raises(ValueError):
        fit_training_cost({0: [1e-3]})


def test_the_predicted_training_includes_the_rounds_fixed_cost() -> None:
    state = NetworkState(line())
    s = get_scheduler("spt").schedule(state, LINE_TASK)
    without = dataclasses.replace(PROFILE, train_cpu_s_per_round=0.0)
    assert PROFILE.train_cpu_s(4) == pytest.approx(2e-3 + 1e-5 * 1000 / 4)
    assert PROFILE.train_cpu_s(4) - without.train_cpu_s(4) == pytest.approx(2e-3)

    idle, bare = predict_round(state, LINE_TASK, s, PROFILE), predict_round(state, LINE_TASK, s, without)
    assert idle.round_s - bare.round_s == pytest.approx(2e-3)
    state.set_background_cpu({"L": 1.0})  # half a core: the fixed part takes twice as long too
    assert predict_round(state, LINE_TASK, s, PROFILE).train_s["L"] == pytest.approx(2 * (2e-3 + 1e-5 * 1000))
    with pytest.raises(ValueError, match="train_cpu_s_per_round"):
        TrainingProfile(train_cpu_s_per_round=-1.0)


def test_a_modelled_tasks_training_cost_with_cost_profile_is_its_profiles(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: the measurement faked; the profile asked for explicitly (the default is counted).
    monkeypatch.setattr(profiles, "measure", _fake_measure([]))
    options, compute = LearningSpec(), ComputeModel(cost="profile")
    assert options.compute_timing == "modeled"

    # Execute / Assert
    got = training_cost(options, compute, cache=tmp_path / "p.json")
    assert got == TrainingCost(s_per_example=1e-5, s_per_round=1e-3)
    measured = dataclasses.replace(options, compute_timing="measured")
    assert training_cost(measured, compute, cache=tmp_path / "p.json") == TrainingCost()


def test_profiling_a_model_that_cannot_be_built_is_one_clear_error() -> None:
    with pytest.raises(ConfigError, match="cannot be profiled"):
        measure("no-such-model")
    with pytest.raises(ValueError, match="unknown profile keys"):
        MeasuredProfile.from_dict({"model": "mlp", "colour": 1})
