"""The learning spec (`workers.spec`): one declaration, one check, and the way from an experiment
config to the wire and back into the agent's config."""

from __future__ import annotations

import inspect
import json
from dataclasses import fields
from typing import Any

import pytest

from orchestrator.cli import build_parser
from orchestrator.cli.learning import FLAGS, learning_options
from orchestrator.cli.task import _key_values, _selection
from orchestrator.errors import ConfigError
from orchestrator.experiment.config import TASK_KEYS, TaskConfig, parse_config
from orchestrator.experiment.run_context import fl_options
from orchestrator.runtime.task_runner import FLOptions, agent_configs
from orchestrator.runtime.timing import TRAIN_ALLOWANCE_S, task_timing
from orchestrator.scheduling.schedule import Schedule
from workers.config import AgentConfig
from workers.spec import DEFAULTS, LearningSpec, SpecError, describe

NAMES = [f.name for f in fields(LearningSpec)]
BASE = {"name": "x", "topology": "triangle", "locals": [1]}


def _role(**learning: Any) -> AgentConfig:
    """A role with only its own fields given: every learning setting from the spec (or `learning`)."""
    return AgentConfig(task=1, site="L", host="127.0.0.2", broadcast_port=1, upload_port=2, **learning)


def _cli(*argv: str) -> LearningSpec:
    args = build_parser().parse_args(["task", "run", "--locals", "2", *argv])
    return learning_options(args, model_args=_key_values(args.model_arg), selection=_selection(args))


def _schedule() -> Schedule:
    tree = {"A": "G", "L1": "A", "L2": "A", "L3": "G"}
    return Schedule(task_id=7, scheduler="hand", global_site="G", local_sites=("L1", "L2", "L3"), demand_mbps=1.0,
                    broadcast_parent=tree, upload_parent=tree)


# -- one declaration ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_every_setting_has_one_default_seen_alike_everywhere(name: str) -> None:
    # Prepare: the default as each consumer sees it without being told the setting.
    spec = getattr(DEFAULTS, name)
    seen = {
        "FLOptions": getattr(FLOptions(), name),
        "TaskConfig": getattr(TaskConfig(), name),
        "task section": getattr(parse_config(BASE).task, name),
        "netai task run": getattr(_cli(), name),
        "AgentConfig": getattr(_role(), name),
        "AgentConfig over the wire": getattr(AgentConfig.from_dict(
            {"task": 1, "site": "L", "host": "127.0.0.2", "broadcast_port": 1, "upload_port": 2,
             "upload_parent": {"site": "G", "host": "127.0.0.1"},
             "broadcast_parent": {"site": "G", "host": "127.0.0.1"}}), name),
    }

    # Assert
    assert seen == dict.fromkeys(seen, spec)
    doc, unit, default = describe(name)
    assert doc and default == spec
    assert unit == ("s" if name.endswith("_s") else "bytes" if name.endswith("_bytes") else "")


def test_the_cli_flags_take_their_defaults_from_the_spec() -> None:
    parser = build_parser()
    args = parser.parse_args(["task", "run", "--locals", "2"])

    for name, (flag, _, _) in FLAGS.items():
        assert getattr(args, flag.lstrip("-").replace("-", "_")) == getattr(DEFAULTS, name), flag
    assert args.train_allowance == TaskConfig().train_allowance_s == TRAIN_ALLOWANCE_S


def test_derived_timing_uses_the_specs_connect_timeout() -> None:
    default = inspect.signature(task_timing).parameters["connect_timeout_s"].default

    assert default == DEFAULTS.connect_timeout_s == 30.0


def test_the_task_section_names_only_spec_settings_and_writes_them_back() -> None:
    # Execute: a section with every key set away from its default.
    raw = {"model": "cnn", "model_args": {"hidden": 8}, "rounds": 5, "partition": "dirichlet", "alpha": 0.2,
           "lr": 0.05, "local_epochs": 1, "batch_size": 8, "strategy": "fedprox", "mu": 0.01,
           "compression": "topk", "k": 0.2, "dataset": "synthetic", "dataset_args": {"input_shape": [1, 4, 4]},
           "selection": {"policy": "random", "k": 1, "seed": 2}, "compute_timing": "measured", "demand_mbps": 3.0,
           "train_allowance_s": 9.0}
    cfg = parse_config(BASE | {"task": raw})

    # Assert: each key reached its setting, and the config written back reads the same.
    assert set(TASK_KEYS.values()) <= set(NAMES)
    assert {key: getattr(cfg.task, TASK_KEYS.get(key, key)) for key in raw} == raw
    assert cfg.to_dict()["task"] == raw
    assert parse_config(cfg.to_dict()) == cfg


# -- one check ----------------------------------------------------------------------------------------
BAD: list[tuple[dict[str, Any], str]] = [
    ({"rounds": 0}, "rounds must be an integer in 1..1000, got 0"),
    ({"model": ""}, "model must be a non-empty string"),
    ({"model_args": {"w": object()}}, "model_args must hold JSON values only"),
    ({"partitioning": "shards"}, "partitioning must be one of iid, dirichlet"),
    ({"alpha": 0}, "alpha must be a number > 0"),
    ({"seed": -1}, "seed must be an integer >= 0"),
    ({"lr": float("nan")}, "lr must be a number > 0"),
    ({"local_epochs": True}, "local_epochs must be an integer in 1..1000"),
    ({"connect_timeout_s": 0}, "connect_timeout_s must be a number > 0"),
    ({"global_timeout_s": -1.0}, "global_timeout_s must be a number > 0"),
    ({"max_chunk_bytes": 100}, "max_chunk_bytes must be an integer >= 1024"),
    ({"threads": 0}, "threads must be an integer >= 1"),
    ({"selection": ["random"]}, "selection must be a mapping like"),
    ({"mu": 0.1}, "mu (FedProx's proximal term) needs strategy fedprox, not 'fedavg'"),
    ({"k": 0.1}, "k (the fraction top-k keeps) needs compression topk, not 'none'"),
    ({"dataset": "cifar"}, "dataset: unknown dataset 'cifar'"),
]


@pytest.mark.parametrize(("bad", "message"), BAD)
def test_a_bad_setting_is_one_line_naming_it(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError) as info:
        LearningSpec(**bad).check()

    assert str(info.value).startswith(message)
    assert info.value.setting == next(iter(bad))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("bad", "message"), [
    ({"partition": "shards"}, "cfg.yaml: task.partition must be one of iid, dirichlet, got 'shards'"),
    ({"rounds": 1001}, "cfg.yaml: task.rounds must be an integer in 1..1000, got 1001"),
    ({"dataset": "cifar"}, "cfg.yaml: task.dataset: unknown dataset 'cifar'"),
    ({"model_args": {"w": float("inf")}}, "cfg.yaml: task.model_args must hold JSON values only"),
])
def test_the_config_names_the_key_as_written(bad: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(BASE | {"task": bad}, where="cfg.yaml")

    assert str(info.value).startswith(message)


@pytest.mark.parametrize(("argv", "message"), [
    (("--rounds", "0"), "--rounds must be an integer in 1..1000, got 0"),
    (("--lr", "-1"), "--lr must be a number > 0, got -1.0"),
    (("--child-timeout", "0"), "--child-timeout must be a number > 0, got 0.0"),
    (("--seed", "-3"), "--seed must be an integer >= 0, got -3"),
])
def test_the_cli_names_the_flag(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        _cli(*argv)

    assert str(info.value) == message


def test_the_runtime_checks_before_any_role_starts() -> None:
    with pytest.raises(ConfigError, match=r"task 7: batch_size must be an integer in 1\.\.1000000, got 0"):
        agent_configs(_schedule(), addresses={n: "10.0.0.1" for n in _schedule().overlay_nodes},
                      options=FLOptions(batch_size=0))


def test_the_agent_refuses_a_bad_setting_from_the_wire() -> None:
    wire = json.loads(json.dumps(_role(rounds=2).to_dict() | {
        "upload_parent": {"site": "G", "host": "127.0.0.1"}, "broadcast_parent": {"site": "G", "host": "127.0.0.1"}}))

    assert AgentConfig.from_dict(wire).rounds == 2
    with pytest.raises(ValueError, match="connect_timeout_s must be a number > 0, got 0"):
        AgentConfig.from_dict(wire | {"connect_timeout_s": 0})


# -- config -> wire -> agent config -------------------------------------------------------------------
def test_config_to_wire_to_agent_config_keeps_every_setting() -> None:
    # Prepare: an experiment config with its learning settings away from their defaults.
    cfg = parse_config(BASE | {"seed": 4, "task": {
        "model_args": {"hidden": 16}, "rounds": 4, "partition": "dirichlet", "alpha": 0.3, "lr": 0.02,
        "local_epochs": 3, "batch_size": 4, "strategy": "fedprox", "mu": 0.5, "compression": "topk", "k": 0.25,
        "dataset": "synthetic", "dataset_args": {"input_shape": [1, 4, 4], "num_examples": 90},
        "selection": {"policy": "random", "k": 2, "seed": 3}}})
    schedule = _schedule()
    options = fl_options(cfg.task, rounds=cfg.task.rounds, seed=cfg.seed + schedule.task_id)

    # Execute: the agent configs, as JSON text on the wire, read back by the agents.
    sent = agent_configs(schedule, addresses={n: f"10.0.0.{i + 1}" for i, n in enumerate(schedule.overlay_nodes)},
                         options=options)
    received = {n: AgentConfig.from_dict(json.loads(json.dumps(c.to_dict()))) for n, c in sent.items()}

    # Assert: every role has the task's settings; only what is the node's own differs (its child
    # timeout scales with its subtree; G alone holds the selection policy).
    assert received == sent
    assert options == LearningSpec.of(cfg.task, seed=11)
    heights = {"G": 2, "A": 1, "L1": 1, "L2": 1, "L3": 1}
    for node, role in received.items():
        own = {"child_timeout_s": options.child_timeout_s * heights[node],
               "selection": options.selection if node == "G" else None}
        assert LearningSpec.of(role) == LearningSpec.of(options, **own), node
