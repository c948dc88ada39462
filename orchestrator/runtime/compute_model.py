"""The modelled compute of a task: what a local's round of training costs on one emulated core, set
by the experiment, so that the same config models the same training on any host, any day.

An experiment's ``compute`` section (`ComputeModel`; ``netai task run``'s ``--compute-cost`` and
the flags beside it) says where the cost comes from (``cost``):

- ``counted`` (the default): from the model itself. torch's FLOP counter counts one training step of
  the task's model on one batch of its dataset, built with the workers' own code
  (`workers.learning.Learner.step_flops_per_example`), and the cost takes the linear form the workers
  model a round with (`workers.compute.TrainingCost`)::

      s_per_example = flops_per_example / (core_gflops x 1e9) + step_overhead_us / 1e6 / batch_size
      s_per_round   = round_overhead_ms / 1e3

  where an optimizer step's overhead (dispatch, loss, the update: what the counter does not count)
  is spread over its batch, and a round pays a fixed cost whatever its examples (set-up, shuffle,
  the training thread, the partial batch's step). The fixed cost is a setting of its own, not one
  step's overhead: a step costing the round's measured fixed cost (about 1 ms) would put 31 us on
  every example at batch 32, three times what the host takes.
- ``pinned``: the config's own figures, ``train_us_per_example`` and ``train_ms_per_round``.
- ``profile``: this host's measured profile (`orchestrator.runtime.profiles`, cached per user),
  figures that depend on how busy the host was when measured; an explicit choice only.

A topology site's ``cpu`` is its number of emulated cores: a local's round lasts its cost /
min(threads, cpu) x the time dilation (`workers.compute.modelled_s`; the simulation alike).

How the defaults were chosen. torch counts 20,224 FLOPs per example for the default model (``mlp``
on ``digits``: 64-64-10, forward 9,472 and backward 10,752), 4,092,800 for the 2.8 MB mlp
(``{hidden: 800, layers: 2}``). An emulated core of 10 GFLOP/s with 250 us per optimizer step and
1 ms per round models the default at 2.02 + 7.81 = 9.8 us per example and 1 ms per round; real
training on an idle 2-core host of this kind measured 4.5-5.7 us per example and 1.05-1.19 ms per
round, so it fits inside the modelled time with about 2x margin. The 2.8 MB mlp comes out at 417 us
per example, 0.151 s per round for a local at 8 locals (360 examples x epochs), against about 0.1 s
measured: a conservative core, in the same order.

Counting builds the model and loads the dataset (no timing). A count is kept, once per process and
across processes (`orchestrator.runtime.model_counts`: keyed on the settings, the versions of
torch, numpy and scikit-learn, and the source that counts; a built-in model on a built-in dataset
only), so a later ``netai`` neither counts again nor imports torch. The profile cache is only read and written
with ``cost: profile``. This module imports torch only when it counts.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.runtime import model_counts, profiles
from orchestrator.scheduling.joint import TrainingProfile
from workers.compute import NOT_MODELLED, TrainingCost
from workers.spec import SpecError, choice, number, optional, setting

#: Where the modelled training cost comes from (`ComputeModel.cost`; see the module docstring).
COUNTED, PINNED, PROFILE = "counted", "pinned", "profile"
COST_SOURCES = (COUNTED, PINNED, PROFILE)
#: The settings of each source besides ``cost`` (a setting of another source is refused).
SOURCE_SETTINGS = {COUNTED: ("core_gflops", "step_overhead_us", "round_overhead_ms"),
                   PINNED: ("train_us_per_example", "train_ms_per_round"), PROFILE: ()}
#: What the run records when training is not modelled (``task.compute_timing: measured``).
NOT_MODELLED_SOURCE = "not modelled (compute_timing: measured)"


@dataclass(frozen=True, kw_only=True)
class ComputeModel:
    """How a task's modelled training cost is set: the experiment's ``compute`` section. Each
    setting is declared here once, with its default, unit and check (`workers.spec.setting`)."""

    cost: str = setting(COUNTED, check=choice(COST_SOURCES),
                        doc="where the modelled training cost comes from: counted (the model's FLOPs on "
                            "an emulated core), pinned (the figures given) or profile (this host's measured profile)")
    core_gflops: float = setting(10.0, check=number(0, lo_open=True), unit="GFLOP/s",
                                 doc="speed of one emulated core in a training step's operations (counted)")
    step_overhead_us: float = setting(250.0, check=number(0), unit="us",
                                      doc="an optimizer step's cost besides its counted FLOPs, spread over "
                                          "its batch (counted)")
    round_overhead_ms: float = setting(1.0, check=number(0), unit="ms",
                                       doc="a local's round of training whatever its examples: set-up and the "
                                           "partial batch's step (counted)")
    train_us_per_example: float | None = setting(None, check=optional(number(0)), unit="us",
                                                 doc="training per example and epoch on one core (pinned)")
    train_ms_per_round: float | None = setting(None, check=optional(number(0)), unit="ms",
                                               doc="training per round whatever its examples, on one core (pinned)")

    def check(self) -> None:
        """Check every setting, then the pinned figures against the source.

        Raises
        ------
        SpecError
            The first bad setting, naming it (`SpecError.named` names it as the user wrote it).
        """
        for f in fields(ComputeModel):
            problem = f.metadata["check"](getattr(self, f.name))
            if problem is not None:
                raise SpecError(f.name, f" {problem}")
        pinned = ("train_us_per_example", "train_ms_per_round")
        if self.cost != PINNED:
            given = next((k for k in pinned if getattr(self, k) is not None), None)
            if given is not None:
                raise SpecError(given, f" is a pinned figure: it needs cost {PINNED}, not {self.cost}")
            return
        missing = next((k for k in pinned if getattr(self, k) is None), None)
        if missing is not None:
            raise SpecError(missing, f" is required with cost {PINNED} (both train_us_per_example and "
                                     "train_ms_per_round)")
        if not (self.train_us_per_example or self.train_ms_per_round):
            raise SpecError("train_us_per_example", " and train_ms_per_round are both 0: that models no "
                                                    "training (use task.compute_timing: measured)")

    @classmethod
    def of(cls, given: Mapping[str, Any]) -> ComputeModel:
        """The compute model of the settings `given` (the others at their defaults), checked.

        Raises
        ------
        SpecError
            A bad setting (`check`), or one that is not a setting of the chosen cost source.
        TypeError
            A name that is no setting (the caller checks names first).
        """
        model = cls(**given)
        model.check()
        own = SOURCE_SETTINGS[model.cost]
        other = next((k for k in given if k not in ("cost", *own)), None)
        if other is not None:
            raise SpecError(other, f" is not a setting of cost {model.cost}"
                            + (f" (its settings: {', '.join(own)})" if own else ""))
        return model

    def section(self) -> dict[str, Any]:
        """The section as a config file holds it: the source and its own settings."""
        return {"cost": self.cost} | {k: getattr(self, k) for k in SOURCE_SETTINGS[self.cost]}


#: The default compute model (read it, never change it).
DEFAULT_COMPUTE = ComputeModel()


def describe(name: str) -> tuple[str, str, Any]:
    """(what it is, unit, default) of the compute setting `name` (for help texts)."""
    for f in fields(ComputeModel):
        if f.name == name:
            return f.metadata["doc"], f.metadata["unit"], f.default
    raise KeyError(name)


@dataclass(frozen=True)
class ModelledTraining:
    """A task's modelled training (`resolve`): its cost, where it came from, and what the run
    records of it (`environment`)."""

    source: str
    cost: TrainingCost
    #: The dataset's training split (the locals share it every epoch); 0 when not modelled.
    train_examples: int = 0
    compute: ComputeModel = field(default_factory=ComputeModel)
    #: ``counted``: what torch counted per example of a training step.
    flops_per_example: float | None = None
    #: ``profile``: the cache file the host's profile came from.
    profile_cache: str | None = None

    def environment(self) -> dict[str, Any]:
        """The run's record of its compute model, plain scalars and strings (``compute_*`` keys)."""
        if not self.cost.modelled:
            return {"compute_cost": self.source}
        env: dict[str, Any] = {"compute_cost": self.source}
        if self.source == COUNTED:
            env |= {"compute_flops_per_example": self.flops_per_example,
                    "compute_core_gflops": self.compute.core_gflops,
                    "compute_step_overhead_us": self.compute.step_overhead_us,
                    "compute_round_overhead_ms": self.compute.round_overhead_ms}
        if self.source == PROFILE:
            env["compute_profile"] = f"measured on this host (CPU seconds of one host core), from its cache {self.profile_cache}"
        return env | {"compute_train_s_per_example": self.cost.s_per_example,
                      "compute_train_s_per_round": self.cost.s_per_round}

    def joint_profile(self, local_epochs: int) -> TrainingProfile:
        """The ``joint`` scheduler's `TrainingProfile` of this training (aggregation at its default)."""
        return TrainingProfile(train_cpu_s_per_example=self.cost.s_per_example,
                               train_cpu_s_per_round=self.cost.s_per_round,
                               examples_per_round=max(1, self.train_examples) * local_epochs)


def counted_cost(flops_per_example: float, batch_size: int, compute: ComputeModel = DEFAULT_COMPUTE) -> TrainingCost:
    """The counted training cost (the module docstring's formula) of `flops_per_example` at
    `batch_size` on `compute`'s emulated core."""
    step_s = compute.step_overhead_us / 1e6
    return TrainingCost(s_per_example=flops_per_example / (compute.core_gflops * 1e9) + step_s / batch_size,
                        s_per_round=compute.round_overhead_ms / 1e3)


def _agent_config(settings: Mapping[str, Any]) -> Any:
    from workers.config import AgentConfig

    return AgentConfig(task=1, site="count", host="127.0.0.1", broadcast_port=1, upload_port=2, rounds=1,
                       num_parts=1, part_index=0, threads=1, **settings)


def _settings_json(options: Any) -> str:
    """What a count depends on, as canonical JSON (the key of `_count`'s per-process memo, and part of
    the kept count's, `model_counts.key`)."""
    return json.dumps({"model": options.model, "model_args": dict(options.model_args), "dataset": options.dataset,
                       "dataset_args": dict(options.dataset_args), "batch_size": options.batch_size}, sort_keys=True)


@functools.lru_cache(maxsize=16)
def _count(settings_json: str) -> tuple[float, int]:
    key = model_counts.key("flops", json.loads(settings_json))
    kept = model_counts.flops(key) if key is not None else None
    if kept is not None:
        return kept
    flops, examples = _count_now(settings_json)
    if key is not None and flops > 0:
        model_counts.keep(key, {"flops_per_example": flops, "train_examples": examples})
    return flops, examples


def _count_now(settings_json: str) -> tuple[float, int]:
    import torch

    from workers.learning import Learner

    settings = json.loads(settings_json)
    threads = torch.get_num_threads()
    try:
        learner = Learner(_agent_config(settings))  # the workers' own builders, as `profiles.measure`
        return learner.step_flops_per_example(), learner.num_examples
    except Exception as e:  # noqa: BLE001 -- a user's model or dataset factory may raise anything: one line
        raise ConfigError(f"model {settings['model']!r} on {settings['dataset']!r} cannot be counted: "
                          f"{type(e).__name__}: {e}") from None
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=16)
def _split_examples(dataset: str, dataset_args_json: str) -> int:
    from workers.data import open_dataset

    try:
        return len(open_dataset(dataset, args=json.loads(dataset_args_json)).train_y)
    except Exception as e:  # noqa: BLE001 -- a user's dataset factory may raise anything: one line
        raise ConfigError(f"dataset {dataset!r} cannot be loaded: {type(e).__name__}: {e}") from None


def count_training(options: Any) -> tuple[float, int]:
    """(FLOPs per example of one training step, examples of the training split) of the task's model
    on its dataset (`options`: its learning settings), counted once (`_count`: kept per process, and
    across processes for a built-in model and dataset).

    Raises
    ------
    ConfigError
        If the model or dataset cannot be built, or torch counts no FLOPs (one line: pin the cost).
    """
    flops, examples = _count(_settings_json(options))
    if flops <= 0:
        raise ConfigError(f"model {options.model!r}: torch counted no FLOPs in its training step (ops it has no "
                          "formula for): pin its cost (compute: {cost: pinned, train_us_per_example: .., "
                          "train_ms_per_round: ..})")
    return flops, examples


def _modelled(options: Any, compute: ComputeModel, cache: Path | None) -> ModelledTraining:
    if compute.cost == COUNTED:
        flops, examples = count_training(options)
        return ModelledTraining(COUNTED, counted_cost(flops, options.batch_size, compute), examples, compute,
                                flops_per_example=flops)
    if compute.cost == PINNED:
        assert compute.train_us_per_example is not None and compute.train_ms_per_round is not None  # check()
        examples = _split_examples(options.dataset, json.dumps(dict(options.dataset_args), sort_keys=True))
        return ModelledTraining(PINNED, TrainingCost(s_per_example=compute.train_us_per_example / 1e6,
                                                     s_per_round=compute.train_ms_per_round / 1e3), examples, compute)
    path = cache or profiles.default_cache()
    p = profiles.load_profile(options.model, dataset=options.dataset, batch_size=options.batch_size,
                              model_args=options.model_args, dataset_args=options.dataset_args, cache=path)
    return ModelledTraining(PROFILE, TrainingCost(s_per_example=p.train_cpu_s_per_example,
                                                  s_per_round=p.train_cpu_s_per_round), p.train_examples, compute,
                            profile_cache=str(path))


def resolve(options: Any, compute: ComputeModel = DEFAULT_COMPUTE, *, cache: Path | None = None) -> ModelledTraining:
    """The modelled training of a task with learning settings `options` under `compute`: none when
    its ``compute_timing`` is ``measured``. Call it before anything starts (``profile`` may train the
    model for real on a first measurement; `cache`: its cache file, default `profiles.default_cache`).

    Raises
    ------
    ConfigError
        A bad compute model, a model or dataset that cannot be built, or none of its FLOPs counted.
    """
    if getattr(options, "compute_timing", "measured") != "modeled":
        return ModelledTraining(NOT_MODELLED_SOURCE, NOT_MODELLED, compute=compute)
    try:
        compute.check()
    except SpecError as e:
        raise ConfigError(e.named(f"compute.{e.setting}")) from None
    return _modelled(options, compute, cache)


def training_cost(options: Any, compute: ComputeModel = DEFAULT_COMPUTE, *, cache: Path | None = None) -> TrainingCost:
    """What a task's locals model their training with (`workers.compute`): `resolve`'s cost."""
    return resolve(options, compute, cache=cache).cost


def for_training(scheduler: Any, training: ModelledTraining, local_epochs: int) -> Any:
    """`scheduler`; a ``joint`` built without a profile of its own now predicts training as the task
    models it (`ModelledTraining.joint_profile`), so that it plans with what the run will model."""
    from orchestrator.scheduling.joint import Joint

    if isinstance(scheduler, Joint) and not scheduler.profile_given and training.cost.modelled:
        scheduler.profile = training.joint_profile(local_epochs)
    return scheduler
