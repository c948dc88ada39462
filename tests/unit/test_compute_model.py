"""The modelled compute (`orchestrator.runtime.compute_model`): a task's training cost counted from
its model (host-independent), the ``compute`` section of a config, what a run records of it, one
meaning in the emulation and the simulation; and that the test session touches no user cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import parse_config
from orchestrator.runtime import compute_model, model_counts, profiles
from orchestrator.runtime.compute_model import ComputeModel, count_training, counted_cost, resolve
from orchestrator.simulation import calibration
from topologies.model import NetworkModel
from workers.compute import TrainingCost, modelled_s
from workers.spec import LearningSpec

ROOT = Path(__file__).resolve().parents[2]
#: Hand-counted FLOPs per example of the default mlp (64-64-10 on digits): forward 2 x (64x64 + 64x10);
#: backward the first layer's weight gradient (its input needs none) and the second's weight and input.
DEFAULT_MLP_FLOPS = 2 * (64 * 64 + 64 * 10) + 2 * 64 * 64 + 2 * (2 * 64 * 10)
MODELS = '''
import torch
from torch import nn

def linear(*, input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

class Scale(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.w = nn.Parameter(torch.ones(num_classes))
        self.num_classes = num_classes

    def forward(self, x):
        return x.flatten(1)[:, : self.num_classes] * self.w

def uncountable(*, input_shape, num_classes):
    return Scale(num_classes)
'''


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "models.py"
    path.write_text(MODELS)
    return path


@pytest.fixture
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A profile cache folder of this test's own (the session's is shared by every test)."""
    monkeypatch.setenv(profiles.ENV_CACHE_DIR, str(tmp_path / "cache"))
    return tmp_path / "cache" / "profiles.json"


def _fresh_count() -> None:
    compute_model._count.cache_clear()  # counted afresh, not from this process's memo


# -- the session's stores -------------------------------------------------------------------------
def test_the_test_session_points_no_cache_or_store_at_the_users_home() -> None:
    # Prepare: where the user's would be.
    home_cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    home_state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    code = ("from orchestrator.runtime.profiles import default_cache\n"
            "from orchestrator.simulation.calibration import default_path\n"
            "print(default_cache()); print(default_path())")

    # Execute: here and in a subprocess (as `netai ...` started by a test).
    here = [profiles.default_cache(), calibration.default_path()]
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    there = [Path(line) for line in res.stdout.split()]

    # Assert
    assert res.returncode == 0, res.stderr
    assert there == here
    for path in here:
        assert not path.is_relative_to(home_cache) and not path.is_relative_to(home_state), path
        assert not path.is_relative_to(Path.home() / ".cache"), path


# -- counting --------------------------------------------------------------------------------------
def test_the_flop_count_of_one_linear_layer_is_the_hand_counted_one(models: Path) -> None:
    # Prepare: Flatten + Linear(64, 10) on digits; the input needs no gradient.
    spec = LearningSpec(model=f"{models}:linear")

    # Execute
    flops, examples = count_training(spec)

    # Assert: forward 2 x 64 x 10 multiply-adds, backward the weight's gradient alone (as many).
    assert flops == 2 * 64 * 10 + 2 * 64 * 10
    assert examples == 1438


def test_the_default_mlp_counts_its_hand_counted_flops_and_costs_about_10_us_an_example(own_cache: Path) -> None:
    _fresh_count()  # and no kept count in this test's own cache folder: torch counts it
    flops, _ = count_training(LearningSpec())

    cost = counted_cost(flops, 32)

    assert flops == DEFAULT_MLP_FLOPS == 20_224
    assert cost == TrainingCost(s_per_example=20_224 / 10e9 + 250e-6 / 32, s_per_round=1e-3)
    assert 9e-6 < cost.s_per_example < 11e-6


def test_a_model_torch_counts_no_flops_of_fails_in_one_line_saying_to_pin_it(models: Path) -> None:
    spec = LearningSpec(model=f"{models}:uncountable")

    with pytest.raises(ConfigError, match="pin its cost") as e:
        resolve(spec)

    assert "\n" not in str(e.value)
    # pinned, the same model is modelled with the figures given
    pinned = resolve(spec, ComputeModel(cost="pinned", train_us_per_example=20.0, train_ms_per_round=2.0))
    assert pinned.cost == TrainingCost(s_per_example=20e-6, s_per_round=2e-3) and pinned.source == "pinned"


def test_the_same_config_gives_the_same_cost_with_no_cache_and_with_a_cache_of_other_figures(
        own_cache: Path) -> None:
    import torch

    # Prepare: the config; no cache file yet.
    cfg = parse_config({"name": "x", "topology": "triangle", "locals": [2]})
    assert not own_cache.exists()

    # Execute: counted with no cache file, then with one full of this model's other figures.
    _fresh_count()
    without = resolve(cfg.task, cfg.compute)
    assert not own_cache.exists()
    key = profiles.profile_key("mlp", torch_version=str(torch.__version__))
    other = profiles.MeasuredProfile(model="mlp", dataset="digits", batch_size=32, train_cpu_s_per_example=16e-6,
                                     train_cpu_s_per_round=0.25, aggregate_cpu_s_per_mb=0.5, train_examples=1438,
                                     model_bytes=19240, torch_version=str(torch.__version__))
    own_cache.parent.mkdir(parents=True, exist_ok=True)  # the FLOP count is kept there (model_counts)
    own_cache.write_text(json.dumps({"version": profiles.CACHE_VERSION, "profiles": {key: other.to_dict()}}))
    written = own_cache.read_text()
    (own_cache.parent / model_counts.FILE).unlink()  # counted afresh again, not taken from the first count
    _fresh_count()
    with_cache = resolve(cfg.task, cfg.compute)

    # Assert: identical, the cache neither read into it nor written.
    assert without.cost == with_cache.cost == counted_cost(DEFAULT_MLP_FLOPS, 32)
    assert without.environment() == with_cache.environment()
    assert own_cache.read_text() == written
    # with cost: profile (an explicit choice) the cache's figures are taken
    profiled = resolve(cfg.task, ComputeModel(cost="profile"))
    assert profiled.cost == TrainingCost(s_per_example=16e-6, s_per_round=0.25)


# -- the config section ----------------------------------------------------------------------------
@pytest.mark.parametrize(("compute", "message"), [
    ({"bogus": 1}, "unknown key compute.bogus"),
    ({"core_gflops": -1.0}, "compute.core_gflops must be a number > 0"),
    ({"core_gflops": 0}, "compute.core_gflops must be a number > 0"),
    ({"step_overhead_us": -5}, "compute.step_overhead_us must be a number >= 0"),
    ({"cost": "guessed"}, "compute.cost must be one of counted, pinned, profile"),
    ({"cost": "pinned"}, "compute.train_us_per_example is required with cost pinned"),
    ({"cost": "pinned", "train_us_per_example": 5}, "compute.train_ms_per_round is required with cost pinned"),
    ({"cost": "pinned", "train_us_per_example": 0, "train_ms_per_round": 0}, "compute.train_us_per_example and"),
    ({"train_us_per_example": 5}, "compute.train_us_per_example is a pinned figure: it needs cost pinned"),
    ({"cost": "pinned", "train_us_per_example": 5, "train_ms_per_round": 1, "core_gflops": 4},
     "compute.core_gflops is not a setting of cost pinned"),
    ({"cost": "profile", "round_overhead_ms": 2}, "compute.round_overhead_ms is not a setting of cost profile"),
])
def test_the_compute_section_refuses_a_bad_key_naming_it(compute: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message) as e:
        parse_config({"name": "x", "topology": "triangle", "locals": [2], "compute": compute})
    assert "\n" not in str(e.value)


def test_the_compute_section_round_trips_and_defaults_to_counted() -> None:
    pinned = parse_config({"name": "x", "topology": "triangle", "locals": [2],
                           "compute": {"cost": "pinned", "train_us_per_example": 12.5, "train_ms_per_round": 1.5}})

    assert parse_config(pinned.to_dict()) == pinned
    assert pinned.to_dict()["compute"] == {"cost": "pinned", "train_us_per_example": 12.5, "train_ms_per_round": 1.5}
    assert parse_config({"name": "x", "topology": "triangle", "locals": [2]}).compute == ComputeModel()


def test_every_shipped_config_pins_its_compute() -> None:
    from orchestrator.experiment.config import load_config

    for path in sorted((ROOT / "experiments").glob("*.yaml")):
        raw = yaml.safe_load(path.read_text())
        assert "compute" in raw and raw["compute"]["cost"] in ("counted", "pinned"), path.name
        assert load_config(path).compute.cost == raw["compute"]["cost"]


# -- what a run records, and one meaning in every engine --------------------------------------------
def test_the_runs_environment_records_the_compute_model_as_scalars(own_cache: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.experiment.session import environment
    from topologies.plan import EmulationPlan

    # Prepare: one config per source (the profile's measurement faked).
    fake = profiles.MeasuredProfile(model="mlp", dataset="digits", batch_size=32, train_cpu_s_per_example=7e-6,
                                    train_cpu_s_per_round=9e-4, aggregate_cpu_s_per_mb=0.5, train_examples=1438,
                                    model_bytes=19240, torch_version="x")
    monkeypatch.setattr(profiles, "measure", lambda *_a, **_kw: fake)
    sections = {"counted": {}, "pinned": {"cost": "pinned", "train_us_per_example": 12.0, "train_ms_per_round": 2.0},
                "profile": {"cost": "profile"}}

    # Execute
    envs = {}
    for name, section in sections.items():
        cfg = parse_config({"name": "x", "topology": "triangle", "locals": [2], "compute": section})
        envs[name] = environment(cfg, EmulationPlan.from_model(cfg.network()), SimpleNamespace(), "process")

    # Assert
    assert {name: env["compute_cost"] for name, env in envs.items()} == {n: n for n in sections}
    counted = envs["counted"]
    assert (counted["compute_flops_per_example"], counted["compute_core_gflops"], counted["compute_step_overhead_us"],
            counted["compute_round_overhead_ms"]) == (DEFAULT_MLP_FLOPS, 10.0, 250.0, 1.0)
    assert counted["compute_train_s_per_example"] == pytest.approx(9.8349e-6)
    assert counted["compute_train_s_per_round"] == 1e-3
    assert (envs["pinned"]["compute_train_s_per_example"], envs["pinned"]["compute_train_s_per_round"]) \
        == (pytest.approx(12e-6), pytest.approx(2e-3))
    assert "compute_flops_per_example" not in envs["pinned"]
    assert envs["profile"]["compute_train_s_per_example"] == 7e-6
    assert "this host" in envs["profile"]["compute_profile"] and str(own_cache) in envs["profile"]["compute_profile"]
    for env in envs.values():
        assert all(isinstance(v, str | int | float) for k, v in env.items() if k.startswith("compute_")), env


def test_the_simulation_models_the_training_the_emulation_models(tmp_path: Path) -> None:
    from orchestrator.experiment.run_context import lifecycle_for
    from orchestrator.experiment.simulated import sim_params
    from orchestrator.results.db import ResultsDB
    from orchestrator.scheduling import NetworkState, get_scheduler
    from orchestrator.scheduling.tasks import Task
    from orchestrator.simulation.spec import train_seconds
    from topologies.plan import EmulationPlan

    # Prepare: one config, run by each engine; sites of 1, 0.5 and 2 emulated cores.
    raw = {"name": "x", "topology": "triangle", "locals": [2], "task": {"local_epochs": 3},
           "compute": {"core_gflops": 4.0, "step_overhead_us": 100.0, "round_overhead_ms": 2.0}}
    emu_cfg, sim_cfg = parse_config(raw), parse_config({**raw, "engine": "simulation"})
    model = emu_cfg.network()
    plan = EmulationPlan.from_model(model)
    with ResultsDB(tmp_path / "r.db") as db:
        run = lifecycle_for(emu_cfg, SimpleNamespace(info=SimpleNamespace(), client=None), object(), db=db,
                            run_id=db.start_run("x", {}), plan=plan, model=model, run_dir=tmp_path)
    sites = NetworkModel.build("t", [{"name": "A"}, {"name": "B", "cpu": 0.5}, {"name": "C", "cpu": 2.0}],
                               [{"a": "A", "b": "B"}, {"a": "B", "b": "C"}])
    schedule = get_scheduler("mst").schedule(NetworkState(sites), Task(1, "A", ("B", "C")))

    # Execute
    emulated = run.compute.training
    params = sim_params(sim_cfg)
    simulated = train_seconds(schedule, params, sites)

    # Assert: the same cost, and the same round at every site (the emulation's formula, one thread).
    assert emulated == TrainingCost(s_per_example=params.seconds_per_example, s_per_round=params.seconds_per_round)
    assert emulated == counted_cost(DEFAULT_MLP_FLOPS, 32, emu_cfg.compute)
    assert params.site_speed and params.local_epochs == 3 and params.train_examples == 1438
    base, extra = divmod(params.train_examples, 2)
    for i, site in enumerate(schedule.local_sites):
        examples = base + (1 if i < extra else 0)
        assert simulated[site] == pytest.approx(modelled_s(
            emulated.s_per_example, examples, 3, train_s_per_round=emulated.s_per_round,
            site_speed=min(1.0, sites.site(site).cpu), time_dilation=1.0))


def test_an_experiments_joint_plans_with_the_tasks_modelled_training() -> None:
    from orchestrator.runtime.compute_model import for_training
    from orchestrator.scheduling.joint import Joint, TrainingProfile

    training = resolve(LearningSpec())
    own = TrainingProfile(train_cpu_s_per_example=1e-3)

    planned, kept = for_training(Joint(), training, 2), for_training(Joint(profile=own), training, 2)

    assert planned.profile == TrainingProfile(train_cpu_s_per_example=training.cost.s_per_example,
                                              train_cpu_s_per_round=1e-3, examples_per_round=2 * 1438)
    assert kept.profile == own


def test_task_run_takes_the_same_compute_model_from_its_flags() -> None:
    from orchestrator.cli import build_parser
    from orchestrator.cli.learning import compute_options

    parser = build_parser()
    args = parser.parse_args(["task", "run", "--locals", "2"])
    assert compute_options(args) == ComputeModel()
    pinned = parser.parse_args(["task", "run", "--locals", "2", "--compute-cost", "pinned",
                                "--train-us-per-example", "12", "--train-ms-per-round", "1.5"])
    assert compute_options(pinned) == ComputeModel(cost="pinned", train_us_per_example=12.0, train_ms_per_round=1.5)
    with pytest.raises(ConfigError, match=r"^--train-us-per-example is required with cost pinned"):
        compute_options(parser.parse_args(["task", "run", "--locals", "2", "--compute-cost", "pinned"]))
    with pytest.raises(ConfigError, match=r"^--core-gflops must be a number > 0"):
        compute_options(parser.parse_args(["task", "run", "--locals", "2", "--core-gflops", "-3"]))
