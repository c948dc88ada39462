"""The learning spec: every setting of how a task learns, declared once, with its default, unit and check.

`LearningSpec` is the one declaration. Everything downstream derives from it and declares none of
these settings again: the runtime's `FLOptions` is this class, an experiment config's ``task``
section (`orchestrator.experiment.config.TaskConfig`) and one role's `workers.config.AgentConfig`
extend it, the ``netai task run`` flags take their defaults and help from it
(`orchestrator.cli.learning`), and it reaches every role as JSON, inside the agent config the
site server receives (`AgentConfig.to_dict` / `from_dict`, never pickle). `LearningSpec.check` is
the one validation: the experiment config, the CLI, the runtime (before any role starts) and the
agent config all call it, and a bad value is one line naming the setting (`SpecError`).

It lives in `workers` because the workers may not import the orchestrator, and both need it.
This module imports no torch and no project module (`check` loads `workers.selection`, which
imports no torch either): the CLI and config validation load it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

#: Chunk size of GLOBAL and UPDATE messages (1 MiB was fastest in benchmarks/bench_transfer.py).
DEFAULT_CHUNK_BYTES = 1024 * 1024
#: Kept in step with `workers.strategies.STRATEGIES`, `workers.compression.COMPRESSIONS` and
#: `workers.data.DATASETS` (this module imports no torch; a unit test checks they agree).
STRATEGIES = ("fedavg", "fedprox")
COMPRESSIONS = ("none", "fp16", "int8", "int8-chunk", "topk")
BUILTIN_DATASETS = ("digits", "synthetic")
#: How the training set is split among a task's local models (`workers.data`).
PARTITIONINGS = ("iid", "dirichlet")
#: How a local's training time is taken (`workers.compute`): modelled from its site, or as measured here.
COMPUTE_TIMINGS = ("modeled", "measured")
#: The fraction of elements ``topk`` keeps when `k` is not given.
DEFAULT_TOPK = 0.01


class SpecError(ValueError):
    """A learning setting with a bad value: one line, the setting's name then what is wrong.
    `named(key)` is the same line naming the setting the way the user wrote it (``task.partition``,
    ``--lr``)."""

    def __init__(self, setting: str, problem: str) -> None:
        self.setting = setting
        self.problem = problem
        super().__init__(self.named(setting))

    def named(self, key: str) -> str:
        return f"{key}{self.problem}"


#: A check: None when the value is good, else what is wrong ("must be ..., got ...").
Check = Callable[[Any], str | None]


def _is_number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and not math.isnan(v)


def integer(lo: int, hi: int | None = None) -> Check:
    """An int (not a bool) in lo..hi (no upper bound when `hi` is None)."""
    def check(v: Any) -> str | None:
        if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
            return f"must be an integer {f'>= {lo}' if hi is None else f'in {lo}..{hi}'}, got {v!r}"
        return None

    return check


def number(lo: float, hi: float | None = None, *, lo_open: bool = False) -> Check:
    """An int or float (not a bool, not NaN) above `lo` (or at it unless `lo_open`), at most `hi`."""
    def check(v: Any) -> str | None:
        if not _is_number(v) or not (v > lo if lo_open else v >= lo) or (hi is not None and v > hi):
            bound = f"{'>' if lo_open else '>='} {lo:g}" + ("" if hi is None else f" and <= {hi:g}")
            return f"must be a number {bound}, got {v!r}"
        return None

    return check


def choice(options: tuple[str, ...]) -> Check:
    def check(v: Any) -> str | None:
        return None if v in options else f"must be one of {', '.join(options)}, got {v!r}"

    return check


def text(v: Any) -> str | None:
    """A non-empty string."""
    return None if isinstance(v, str) and v else f"must be a non-empty string, got {v!r}"


def _json_value(v: Any) -> bool:
    if v is None or isinstance(v, str | bool | int):
        return True
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, list | tuple):
        return all(_json_value(x) for x in v)
    if isinstance(v, Mapping):
        return all(isinstance(k, str) and _json_value(x) for k, x in v.items())
    return False


def json_args(v: Any) -> str | None:
    """Keyword arguments of a factory: names to JSON values (they travel to the roles as JSON)."""
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        return f"must be a mapping of argument names to values, got {v!r}"
    bad = [k for k, x in v.items() if not _json_value(x)]
    if bad:
        return f"must hold JSON values only (numbers, strings, booleans, lists, mappings), not {bad[0]}={v[bad[0]]!r}"
    return None


def optional(inner: Check) -> Check:
    """`inner`, or None (the default)."""
    return lambda v: None if v is None else inner(v)


def policy_config(v: Any) -> str | None:
    """A selection policy config (``{"policy": SPEC, **options}``, `workers.selection`) or None;
    the policy itself is built where it runs (`workers.selection.make_policy`)."""
    if v is None or (isinstance(v, Mapping) and all(isinstance(k, str) for k in v)):
        return None
    return f"must be a mapping like {{policy: random, k: 4, seed: 1}}, got {v!r}"


def setting(default: Any = None, *, check: Check, doc: str, unit: str = "", factory: Callable[[], Any] | None = None
            ) -> Any:
    """A field of `LearningSpec`: its default, its check, what it is and its unit (``s``,
    ``bytes``; empty when it has none). The one place a learning setting is declared."""
    meta = {"check": check, "doc": doc, "unit": unit}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True, kw_only=True)
class LearningSpec:
    """How a task learns: every setting its roles share (see the module docstring)."""

    model: str = setting("mlp", check=text, doc="registered model, module:callable or file.py:callable")
    model_args: Mapping[str, Any] = setting(check=json_args, factory=dict,
                                            doc="keyword arguments of the model factory (JSON values)")
    rounds: int = setting(3, check=integer(1, 1000), doc="rounds of the task")
    dataset: str = setting("digits", check=text,
                           doc="a built-in dataset (digits, synthetic), module:factory or file.py:factory")
    dataset_args: Mapping[str, Any] = setting(check=json_args, factory=dict,
                                              doc="keyword arguments of the dataset factory (JSON values)")
    partitioning: str = setting("iid", check=choice(PARTITIONINGS),
                                doc="how the training set is split among the locals")
    alpha: float = setting(0.5, check=number(0, lo_open=True), doc="Dirichlet concentration (non-IID)")
    seed: int = setting(0, check=integer(0), doc="seed of the model's initialisation and of the data split")
    local_epochs: int = setting(2, check=integer(1, 1000), doc="local epochs per round")
    batch_size: int = setting(32, check=integer(1, 1_000_000), doc="local SGD batch size")
    lr: float = setting(0.1, check=number(0, lo_open=True), doc="local SGD learning rate")
    strategy: str = setting("fedavg", check=choice(STRATEGIES), doc="fedavg or fedprox (with mu; workers.strategies)")
    mu: float = setting(0.0, check=number(0), doc="FedProx's proximal coefficient")
    compression: str = setting("none", check=choice(COMPRESSIONS), doc="how UPDATEs travel (workers.compression)")
    k: float | None = setting(None, check=optional(number(0, 1, lo_open=True)),
                              doc=f"the fraction of each piece's elements topk keeps (None: {DEFAULT_TOPK})")
    #: In a task's spec: the wait of a node whose upload subtree has height 1 when no timing is derived
    #: from the schedule (deeper nodes wait proportionally longer, so a parent never gives up on a
    #: child that is itself still waiting for a straggler). In a role's `AgentConfig`: that node's own.
    child_timeout_s: float = setting(60.0, check=number(0, lo_open=True), unit="s",
                                     doc="per-child wait of a node, from its round's start (scaled by its subtree height)")
    connect_timeout_s: float = setting(30.0, check=number(0, lo_open=True), unit="s",
                                       doc="bound on setting up (or re-establishing) one connection, retries included")
    global_timeout_s: float = setting(600.0, check=number(0, lo_open=True), unit="s",
                                      doc="a role gives up after this long without any event")
    #: Every node of a task must have the same (the orchestrator derives it, `optimal_chunk_bytes`).
    max_chunk_bytes: int | None = setting(DEFAULT_CHUNK_BYTES, check=optional(integer(1024)), unit="bytes",
                                          doc="model chunk size: relays forward and aggregators combine chunk by "
                                              "chunk (None: one chunk per message)")
    threads: int = setting(1, check=integer(1), doc="torch threads of a role's training")
    compute_timing: str = setting("modeled", check=choice(COMPUTE_TIMINGS),
                                  doc="a local's training time in the emulated timeline: modeled (its site's "
                                      "compute and the task's measured profile; real training still runs, its "
                                      "overruns recorded) or measured (what it takes on this host)")
    selection: Mapping[str, Any] | None = setting(None, check=policy_config,
                                                  doc="local-model selection ({policy: SPEC, **options}; "
                                                      "None: every local trains in every round)")

    def check(self) -> None:
        """Check every setting, then the settings together.

        Raises
        ------
        SpecError
            The first bad setting, naming it and what is wrong.
        """
        for f in fields(LearningSpec):
            problem = f.metadata["check"](getattr(self, f.name))
            if problem is not None:
                raise SpecError(f.name, f" {problem}")
        if self.mu and self.strategy != "fedprox":
            raise SpecError("mu", f" (FedProx's proximal term) needs strategy fedprox, not {self.strategy!r}")
        if self.k is not None and self.compression != "topk":
            raise SpecError("k", f" (the fraction top-k keeps) needs compression topk, not {self.compression!r}")
        if self.dataset not in BUILTIN_DATASETS and ":" not in self.dataset:
            raise SpecError("dataset", f": unknown dataset {self.dataset!r}: built in are {', '.join(BUILTIN_DATASETS)}; "
                            "or give 'module:factory' or 'path/to/file.py:factory'")

    def settings(self) -> dict[str, Any]:
        """The learning settings of this object (of a subclass too) by name, mappings copied."""
        out: dict[str, Any] = {}
        for f in fields(LearningSpec):
            v = getattr(self, f.name)
            out[f.name] = dict(v) if isinstance(v, Mapping) else v
        return out

    @classmethod
    def of(cls, source: LearningSpec, **changes: Any) -> LearningSpec:
        """The plain spec of `source`'s learning settings (from a `TaskConfig` or an `AgentConfig`),
        with `changes`."""
        return LearningSpec(**(source.settings() | changes))


def describe(name: str) -> tuple[str, str, Any]:
    """(what it is, unit, default) of the learning setting `name` (for help texts and docs)."""
    for f in fields(LearningSpec):
        if f.name == name:
            default = f.default_factory() if callable(f.default_factory) else f.default
            return f.metadata["doc"], f.metadata["unit"], default
    raise KeyError(name)


#: Every learning setting at its default (read it, never change its mappings).
DEFAULTS = LearningSpec()
