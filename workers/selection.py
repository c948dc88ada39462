"""Local-model selection: which local models train in a round (G decides; see docs/selection.md).

A *policy* is a `SelectionPolicy`: constructed once per task from validated options, then asked
once per round, at G, ``select(round, stats)`` with the `LocalStats` of every local model G knows
of (its example count and path cost from set-up, its update norm and losses from the last round it
trained in). It returns the sites that train in that round: a non-empty subset of ``stats``,
deterministic given its options (``seed`` included), the round and the stats.

G sends the choice in the JSON header of GLOBAL chunk 0 (``meta: {"select": [...]}``). An
unselected local still relays and aggregates for its subtree, but does not train and adds no
update: its UPDATE chunks carry no examples and no tensors (a few hundred bytes each, so that its
parent does not wait for it). Each aggregate is then the exact example-weighted mean over the
selected locals. Statistics travel up the upload tree as validated JSON in the header of an
UPDATE's last chunk and of READY (``meta: {"stats": {site: {...}}}``), never pickled.

Specs: a registered name (``all``, ``random``, ``data_size``, ``network_cost``, ``contribution``),
``package.module:Class`` or ``path/to/file.py:Class`` (a subclass of `SelectionPolicy`). Options:
``k`` (how many) or ``fraction`` (of the candidates, rounded up), ``seed``, and a policy's own
(``metric`` of ``contribution``). The default, ``all``, sends no metadata at all: the rounds are
exactly those without selection.

What this module must not do: touch sockets or files, or unpickle anything.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from workers.specs import import_target

#: What a policy may ask the locals to measure (`SelectionPolicy.measures`): ``update_norm`` (the
#: L2 norm of the update against the global model it started from) and ``loss`` (the mean training
#: loss on the local's own part before and after its training). Example count and path cost are
#: always reported when selection is on.
MEASURES = ("update_norm", "loss")
#: Bound on the sites one ``select`` or ``stats`` entry may name: a task with selection has at most
#: this many locals, so that its metadata (at most about 200 bytes a local) fits the 64 KiB header.
MAX_SITES = 256


class SelectionError(ValueError):
    """A bad policy spec, option or metadata (the message names it)."""


@dataclass(frozen=True, kw_only=True)
class LocalStats:
    """What G knows of one local model when it chooses (see the module docstring)."""

    num_examples: int = 0
    #: The local's network cost: the physical hops of its upload path to G (from the schedule).
    path_cost: float = 0.0
    #: The last round it trained in (0: none yet) and what that round measured.
    round: int = 0
    update_norm: float | None = None
    loss_before: float | None = None
    loss_after: float | None = None

    @property
    def loss_reduction(self) -> float | None:
        if self.loss_before is None or self.loss_after is None:
            return None
        return self.loss_before - self.loss_after

    def to_json(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


_STAT_KEYS = {"num_examples": int, "path_cost": float, "round": int, "update_norm": float,
              "loss_before": float, "loss_after": float}


def parse_stats(raw: Any) -> dict[str, LocalStats]:
    """Validate the ``stats`` metadata of an UPDATE or READY: site -> `LocalStats`.

    Raises
    ------
    SelectionError
        Not an object of at most `MAX_SITES` sites; an unknown key; a count that is not a
        non-negative integer; a measure that is not a finite non-negative number (losses may be any
        finite number).
    """
    if not isinstance(raw, dict) or len(raw) > MAX_SITES:
        raise SelectionError(f"stats must be an object of at most {MAX_SITES} sites")
    out: dict[str, LocalStats] = {}
    for site, entry in raw.items():
        if not isinstance(site, str) or not site or not isinstance(entry, dict):
            raise SelectionError(f"stats of {site!r} must be an object")
        unknown = set(entry) - set(_STAT_KEYS)
        if unknown:
            raise SelectionError(f"stats of {site!r}: unknown keys {sorted(unknown)}")
        kw: dict[str, Any] = {}
        for key, value in entry.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise SelectionError(f"stats of {site!r}: {key} must be a number, got {value!r}")
            if _STAT_KEYS[key] is int and (not isinstance(value, int) or value < 0):
                raise SelectionError(f"stats of {site!r}: {key} must be a non-negative integer, got {value!r}")
            if not math.isfinite(value) or (value < 0 and not key.startswith("loss")):
                raise SelectionError(f"stats of {site!r}: {key} must be finite and non-negative, got {value!r}")
            kw[key] = _STAT_KEYS[key](value)
        out[site] = LocalStats(**kw)
    return out


def parse_select(raw: Any) -> frozenset[str]:
    """Validate the ``select`` metadata of a GLOBAL: the sites that train this round."""
    if not isinstance(raw, list) or len(raw) > MAX_SITES or not all(isinstance(s, str) and s for s in raw):
        raise SelectionError(f"select must be a list of at most {MAX_SITES} site names")
    return frozenset(raw)


def check_meta(frame_type: str, meta: Any) -> None:
    """Validate a frame's ``meta`` for its type (GLOBAL: ``select``; UPDATE, READY: ``stats``)."""
    allowed = {"GLOBAL": "select", "UPDATE": "stats", "READY": "stats"}.get(frame_type)
    if not isinstance(meta, dict) or allowed is None or set(meta) - {allowed}:
        raise SelectionError(f"a {frame_type} frame carries no meta {sorted(meta) if isinstance(meta, dict) else meta}")
    if allowed in meta:
        (parse_select if allowed == "select" else parse_stats)(meta[allowed])


# -- policies ------------------------------------------------------------------------------------------
Check = Callable[[str, Any], Any]


def _positive_int(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise SelectionError(f"{key} must be an integer >= 1, got {v!r}")
    return v


def _fraction(key: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 1:
        raise SelectionError(f"{key} must be a number > 0 and <= 1, got {v!r}")
    return float(v)


def _seed(key: str, v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise SelectionError(f"{key} must be an integer >= 0, got {v!r}")
    return v


class SelectionPolicy:
    """Base class of selection policies (the contract is in the module docstring).

    A subclass sets `name`, may extend `options` (option name -> check returning the value) and
    overrides `rank` (the candidates in order of preference; the first `count` are chosen) or
    `select` itself. Options are checked when the policy is built; `k` and `fraction` exclude each
    other, and without either a policy keeps every candidate.
    """

    name: ClassVar[str] = ""
    options: ClassVar[Mapping[str, Check]] = {"k": _positive_int, "fraction": _fraction, "seed": _seed}
    #: What the locals must measure for this policy (see `MEASURES`).
    measures: tuple[str, ...] = ()

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            raise SelectionError(f"selection policy {self.name or type(self).__name__!r} takes no option "
                                 f"{unknown[0]!r}; allowed: {', '.join(self.options) or 'none'}")
        self.settings = {k: self.options[k](f"selection.{k}", v) for k, v in options.items()}
        if "k" in self.settings and "fraction" in self.settings:
            raise SelectionError("selection.k and selection.fraction exclude each other")
        self.seed: int = self.settings.get("seed", 0)

    def count(self, candidates: int) -> int:
        """How many of `candidates` locals train (at least 1, at most all)."""
        if "k" in self.settings:
            want = int(self.settings["k"])
        elif "fraction" in self.settings:
            want = math.ceil(float(self.settings["fraction"]) * candidates)
        else:
            want = candidates
        return max(1, min(candidates, want))

    def rank(self, round: int, stats: Mapping[str, LocalStats]) -> list[str]:
        """The candidates, most preferred first (default: by site name)."""
        return sorted(stats)

    def select(self, round: int, stats: Mapping[str, LocalStats]) -> list[str]:
        """The sites that train in `round`, sorted; [] only when there are no candidates."""
        if not stats:
            return []
        return sorted(self.rank(round, stats)[: self.count(len(stats))])


class AllPolicy(SelectionPolicy):
    """Every local trains (the default: no metadata is sent at all)."""

    name = "all"
    options: ClassVar[Mapping[str, Check]] = {}


class RandomPolicy(SelectionPolicy):
    """`count` locals drawn uniformly without replacement, from a generator seeded by (seed, round)."""

    name = "random"

    def rank(self, round: int, stats: Mapping[str, LocalStats]) -> list[str]:
        sites = sorted(stats)
        random.Random(self.seed * 1_000_003 + round).shuffle(sites)
        return sites


class DataSizePolicy(SelectionPolicy):
    """The locals with the most training examples (ties by site name)."""

    name = "data_size"

    def rank(self, round: int, stats: Mapping[str, LocalStats]) -> list[str]:
        return sorted(stats, key=lambda s: (-stats[s].num_examples, s))


class NetworkCostPolicy(SelectionPolicy):
    """The locals whose upload paths cost least: those that cost most are dropped (ties by name)."""

    name = "network_cost"

    def rank(self, round: int, stats: Mapping[str, LocalStats]) -> list[str]:
        return sorted(stats, key=lambda s: (stats[s].path_cost, s))


def _metric(key: str, v: Any) -> str:
    if v not in ("update_norm", "loss_reduction"):
        raise SelectionError(f"{key} must be update_norm or loss_reduction, got {v!r}")
    return str(v)


class ContributionPolicy(SelectionPolicy):
    """The locals whose last measured contribution was largest: the norm of their last update
    (``metric: update_norm``, the default) or the training-loss reduction of their last training
    (``loss_reduction``). Locals not measured yet come first (in name order), so that every local
    is measured once before the measurements decide."""

    name = "contribution"
    options: ClassVar[Mapping[str, Check]] = {**SelectionPolicy.options, "metric": _metric}

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.metric: str = self.settings.get("metric", "update_norm")
        self.measures = ("update_norm",) if self.metric == "update_norm" else ("loss",)

    def rank(self, round: int, stats: Mapping[str, LocalStats]) -> list[str]:
        def value(s: str) -> float | None:
            st = stats[s]
            return st.update_norm if self.metric == "update_norm" else st.loss_reduction

        unmeasured = sorted(s for s in stats if value(s) is None)
        measured = sorted((s for s in stats if value(s) is not None), key=lambda s: (-(value(s) or 0.0), s))
        return unmeasured + measured


_REGISTRY: dict[str, type[SelectionPolicy]] = {}


def register_policy(cls: type[SelectionPolicy]) -> type[SelectionPolicy]:
    """Register a policy class under its `name` (usable as a decorator)."""
    if not cls.name or ":" in cls.name:
        raise SelectionError(f"a policy name must be non-empty and contain no ':', got {cls.name!r}")
    _REGISTRY[cls.name] = cls
    return cls


for _cls in (AllPolicy, RandomPolicy, DataSizePolicy, NetworkCostPolicy, ContributionPolicy):
    register_policy(_cls)


def registered_policies() -> list[str]:
    return sorted(_REGISTRY)


def resolve_policy(spec: str) -> type[SelectionPolicy]:
    """The policy class a spec names: a registered name, ``module:Class`` or ``file.py:Class``."""
    if spec in _REGISTRY:
        return _REGISTRY[spec]
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise SelectionError(f"unknown selection policy {spec!r}: registered are {registered_policies()}; "
                             "or give 'module:Class' or 'path/to/file.py:Class'")
    module = import_target(target, what="selection policy", spec=spec, error=SelectionError)
    cls = getattr(module, attr, None)
    if not (isinstance(cls, type) and issubclass(cls, SelectionPolicy)):
        raise SelectionError(f"{target}:{attr} is not a subclass of workers.selection.SelectionPolicy")
    return cls


def make_policy(config: Mapping[str, Any] | None) -> SelectionPolicy:
    """A policy from its config (``{policy: SPEC, **options}``; None: ``all``).

    Raises
    ------
    SelectionError
        Not a mapping, an unknown spec, an unknown or bad option, measures the locals cannot take.
    """
    if config is None:
        return AllPolicy()
    if not isinstance(config, Mapping):
        raise SelectionError(f"selection must be a mapping with a policy, got {config!r}")
    options = dict(config)
    spec = options.pop("policy", "all")
    if not isinstance(spec, str) or not spec:
        raise SelectionError(f"selection.policy must be a non-empty string, got {spec!r}")
    policy = resolve_policy(spec)(**options)
    bad = [m for m in policy.measures if m not in MEASURES]
    if bad:
        raise SelectionError(f"selection policy {spec!r} asks for unknown measures {bad}; known: {MEASURES}")
    return policy


def is_all(config: Mapping[str, Any] | None) -> bool:
    """Whether `config` is the default policy (no selection, no metadata)."""
    return config is None or (dict(config).get("policy", "all") == "all" and set(config) <= {"policy"})


def update_norm(new: Mapping[str, Any], old: Mapping[str, Any]) -> float:
    """L2 norm of ``new - old`` over the floating-point tensors (torch tensors)."""
    total = 0.0
    for name, t in new.items():
        if t.is_floating_point():
            total += float((t.double() - old[name].double()).pow(2).sum())
    return math.sqrt(total)

