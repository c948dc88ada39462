"""The learning and compute flags of ``netai task run``, derived from the learning spec
(`workers.spec`) and the compute model (`orchestrator.runtime.compute_model.ComputeModel`).

Each flag's default, help and unit come from the setting it sets; `learning_options` and
`compute_options` turn the parsed flags into the task's `LearningSpec` and `ComputeModel`, checked
with their one check, so a bad value is one line naming the flag (exit status 2) before anything
starts. Settings without a flag keep the spec's defaults.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.runtime import compute_model
from workers.spec import COMPUTE_TIMINGS, PARTITIONINGS, LearningSpec, SpecError, describe

#: Learning setting -> (flag, argparse type, choices). ``--model-arg`` and ``--select`` /
#: ``--select-arg`` (mappings) are built by the command and passed to `learning_options`.
FLAGS: dict[str, tuple[str, type, tuple[str, ...] | None]] = {
    "rounds": ("--rounds", int, None),
    "model": ("--model", str, None),
    "partitioning": ("--partition", str, PARTITIONINGS),
    "alpha": ("--alpha", float, None),
    "local_epochs": ("--local-epochs", int, None),
    "lr": ("--lr", float, None),
    "seed": ("--seed", int, None),
    "child_timeout_s": ("--child-timeout", float, None),
    "compute_timing": ("--compute-timing", str, COMPUTE_TIMINGS),
}
#: Compute setting -> its flag (`compute_model.ComputeModel`: the experiment's ``compute`` section).
COMPUTE_FLAGS: dict[str, str] = {"cost": "--compute-cost", "core_gflops": "--core-gflops",
                                 "step_overhead_us": "--step-overhead-us", "round_overhead_ms": "--round-overhead-ms",
                                 "train_us_per_example": "--train-us-per-example",
                                 "train_ms_per_round": "--train-ms-per-round"}
#: Flags that say more than their setting's own description.
EXTRA_HELP = {"seed": "; also the seed of the task draw"}


def add_learning_args(parser: argparse.ArgumentParser) -> None:
    """Add the flags of `FLAGS`, each with its setting's default, description and unit."""
    for name, (flag, kind, choices) in FLAGS.items():
        doc, unit, default = describe(name)
        help_ = f"{doc}{EXTRA_HELP.get(name, '')} ({f'{unit}, ' if unit else ''}default %(default)s)"
        metavar = unit.upper() if unit and choices is None else None
        parser.add_argument(flag, type=kind, default=default, choices=choices, help=help_, metavar=metavar)


def learning_options(args: argparse.Namespace, *, model_args: Mapping[str, Any],
                     selection: Mapping[str, Any] | None) -> LearningSpec:
    """The task's learning spec from the parsed flags, checked.

    Raises
    ------
    ConfigError
        A bad value, naming its flag (``--model-arg`` / ``--select`` for the mappings).
    """
    given = {name: getattr(args, flag.lstrip("-").replace("-", "_")) for name, (flag, _, _) in FLAGS.items()}
    spec = LearningSpec(**given, model_args=dict(model_args), selection=selection)
    try:
        spec.check()
    except SpecError as e:
        flag = FLAGS[e.setting][0] if e.setting in FLAGS else {"model_args": "--model-arg",
                                                                "selection": "--select"}.get(e.setting, e.setting)
        raise ConfigError(e.named(flag)) from None
    return spec


def add_compute_args(parser: argparse.ArgumentParser) -> None:
    """Add the flags of `COMPUTE_FLAGS`, each with its setting's description, unit and default (a
    flag left out keeps the default: a setting of another cost source may not be given)."""
    for name, flag in COMPUTE_FLAGS.items():
        doc, unit, default = compute_model.describe(name)
        shown = "none" if default is None else default
        choices = compute_model.COST_SOURCES if name == "cost" else None
        parser.add_argument(flag, type=str if choices else float, default=None, choices=choices,
                            metavar=None if choices else unit.upper().replace("/", "_"),
                            help=f"{doc} ({f'{unit}, ' if unit else ''}default {shown})")


def compute_options(args: argparse.Namespace) -> compute_model.ComputeModel:
    """The task's compute model from the flags given, checked.

    Raises
    ------
    ConfigError
        A bad value, or a setting of another cost source, naming its flag.
    """
    given = {name: getattr(args, flag.lstrip("-").replace("-", "_")) for name, flag in COMPUTE_FLAGS.items()}
    try:
        return compute_model.ComputeModel.of({k: v for k, v in given.items() if v is not None})
    except SpecError as e:
        raise ConfigError(e.named(COMPUTE_FLAGS.get(e.setting, e.setting))) from None
