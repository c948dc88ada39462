"""Task profiles: what a model's training and aggregation cost in CPU, measured on this machine.

`measure` trains the model for real with the workers' own code (`workers.learning.Learner`, one
torch thread, the task's dataset and batch size) and aggregates updates with the round engine's
accumulator (`workers.aggregate.WeightedAccumulator`), timing both in CPU seconds (training in the
process's, since the workers train on a thread of their own; aggregation in the measuring
thread's): the figure is the work, not the wait, so other processes on the machine do not inflate it. `load_profile` measures once per model and caches the result in a JSON
file (`DEFAULT_CACHE`, or the path given); `training_profile` turns it into the
`orchestrator.scheduling.joint.TrainingProfile` the ``joint`` scheduler predicts rounds with.

Cache file (JSON, written atomically; a file that does not parse is measured again and replaced)::

    {"version": 1, "profiles": {"<key>": {"model": "mlp", "dataset": "digits", ...}}}

where ``<key>`` is the canonical JSON of what was measured (model, model_args, dataset,
dataset_args, batch_size) and of torch's version.
"""

from __future__ import annotations

import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.scheduling.joint import TrainingProfile
from workers.spec import DEFAULTS

log = logging.getLogger(__name__)

CACHE_VERSION = 1
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "netai" / "profiles.json"
#: Children whose updates `measure` folds into one aggregate.
AGGREGATE_CHILDREN = 4


@dataclass(frozen=True)
class MeasuredProfile:
    """One model's measured costs on this machine."""

    model: str
    dataset: str
    batch_size: int
    #: CPU seconds per training example (one epoch over `train_examples`, one thread).
    train_cpu_s_per_example: float
    #: CPU seconds to fold one child's update of 1 MB into an aggregate.
    aggregate_cpu_s_per_mb: float
    #: Size of the dataset's training split: a task's locals share it every epoch.
    train_examples: int
    model_bytes: int
    torch_version: str
    model_args: Mapping[str, Any] | None = None
    dataset_args: Mapping[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["model_args"] = dict(self.model_args or {})
        d["dataset_args"] = dict(self.dataset_args or {})
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> MeasuredProfile:
        """Raises ValueError on unknown or missing keys or bad values."""
        known = {f.name for f in fields(cls)}
        if set(d) - known:
            raise ValueError(f"unknown profile keys {sorted(set(d) - known)}")
        p = cls(**dict(d))
        for name in ("train_cpu_s_per_example", "aggregate_cpu_s_per_mb"):
            value = getattr(p, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        for name in ("train_examples", "model_bytes", "batch_size"):
            value = getattr(p, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        return p


def profile_key(
    model: str, *, dataset: str = DEFAULTS.dataset, batch_size: int = DEFAULTS.batch_size,
    model_args: Mapping[str, Any] | None = None, dataset_args: Mapping[str, Any] | None = None,
    torch_version: str = "",
) -> str:
    """The cache key of a measurement: canonical JSON of what it depends on."""
    return json.dumps(
        {"model": model, "model_args": dict(model_args or {}), "dataset": dataset,
         "dataset_args": dict(dataset_args or {}), "batch_size": batch_size, "torch": torch_version},
        sort_keys=True, separators=(",", ":"),
    )


def measure(
    model: str = DEFAULTS.model, *, dataset: str = DEFAULTS.dataset, batch_size: int = DEFAULTS.batch_size,
    epochs: int = 1,
    model_args: Mapping[str, Any] | None = None, dataset_args: Mapping[str, Any] | None = None,
) -> MeasuredProfile:
    """Train `model` on the whole training split of `dataset` for `epochs` epochs and aggregate
    `AGGREGATE_CHILDREN` updates, with the workers' code, and return the CPU costs.

    Raises
    ------
    ConfigError
        If the model or dataset cannot be built (one line).
    """
    import torch

    from workers.aggregate import WeightedAccumulator
    from workers.config import AgentConfig
    from workers.learning import Learner

    if epochs <= 0 or batch_size <= 0:
        raise ConfigError(f"epochs and batch_size must be positive, got {epochs} and {batch_size}")
    cfg = AgentConfig(
        task=1, site="profile", host="127.0.0.1", broadcast_port=1, upload_port=2, rounds=1,
        model=model, model_args=dict(model_args or {}), dataset=dataset, dataset_args=dict(dataset_args or {}),
        num_parts=1, part_index=0, local_epochs=epochs, batch_size=batch_size, threads=1,
    )
    threads = torch.get_num_threads()
    try:
        learner = Learner(cfg)  # warms up: torch's one-time costs are not in the figure
    except Exception as e:  # noqa: BLE001 -- a user's model factory may raise anything: one line
        raise ConfigError(f"model {model!r} on {dataset!r} cannot be profiled: {type(e).__name__}: {e}") from None
    try:
        # The workers train on a thread of their own (`workers.learning`): the process's CPU time counts
        # it, the calling thread's would not (nothing else of this process runs meanwhile).
        start = time.process_time()
        examples = learner.train()
        train_cpu = time.process_time() - start
        update = learner.state()
        acc = WeightedAccumulator()
        start = time.thread_time()
        for k in range(AGGREGATE_CHILDREN):
            acc.add(update, 1 + k)
        acc.result()
        aggregate_cpu = time.thread_time() - start
    finally:
        torch.set_num_threads(threads)
    mb = learner.model_bytes / 1e6
    return MeasuredProfile(
        model=model, dataset=dataset, batch_size=batch_size,
        train_cpu_s_per_example=train_cpu / (examples * epochs),
        aggregate_cpu_s_per_mb=aggregate_cpu / (AGGREGATE_CHILDREN * mb),
        train_examples=examples, model_bytes=learner.model_bytes, torch_version=str(torch.__version__),
        model_args=dict(model_args or {}), dataset_args=dict(dataset_args or {}),
    )


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("%s: unreadable profile cache (%s): measuring again", path, e)
        return {}
    if not isinstance(doc, dict) or doc.get("version") != CACHE_VERSION or not isinstance(doc.get("profiles"), dict):
        log.warning("%s: not a version %d profile cache: measuring again", path, CACHE_VERSION)
        return {}
    return dict(doc["profiles"])


def _write_cache(path: Path, profiles: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".profiles-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"version": CACHE_VERSION, "profiles": dict(profiles)}, f, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def load_profile(
    model: str = DEFAULTS.model, *, dataset: str = DEFAULTS.dataset, batch_size: int = DEFAULTS.batch_size,
    model_args: Mapping[str, Any] | None = None, dataset_args: Mapping[str, Any] | None = None,
    cache: Path | None = None, refresh: bool = False,
) -> MeasuredProfile:
    """The cached profile of `model` (with these arguments, under this torch version), measured
    and added to the cache file when absent (or when `refresh`)."""
    import torch

    path = cache or DEFAULT_CACHE
    key = profile_key(model, dataset=dataset, batch_size=batch_size, model_args=model_args,
                      dataset_args=dataset_args, torch_version=str(torch.__version__))
    profiles = _read_cache(path)
    if not refresh and key in profiles:
        try:
            return MeasuredProfile.from_dict(profiles[key])
        except (TypeError, ValueError) as e:
            log.warning("%s: bad cached profile of %r (%s): measuring again", path, model, e)
    measured = measure(model, dataset=dataset, batch_size=batch_size, model_args=model_args,
                       dataset_args=dataset_args)
    profiles[key] = measured.to_dict()
    _write_cache(path, profiles)
    return measured


def training_profile(measured: MeasuredProfile, *,
                     local_epochs: int = DEFAULTS.local_epochs) -> TrainingProfile:
    """The scheduler's `TrainingProfile` of a task training `local_epochs` epochs per round."""
    if local_epochs <= 0:
        raise ConfigError(f"local_epochs must be positive, got {local_epochs}")
    return TrainingProfile(
        train_cpu_s_per_example=measured.train_cpu_s_per_example,
        examples_per_round=measured.train_examples * local_epochs,
        aggregate_cpu_s_per_mb=measured.aggregate_cpu_s_per_mb,
    )


def train_s_per_example(options: Any, cache: Path | None = None) -> float:
    """What a task's locals model their training with (`workers.compute`): the CPU seconds per
    example of its model's profile when its ``compute_timing`` is ``modeled`` (measured once and
    cached), else 0 (training takes what it takes on this host). Call it before anything starts:
    a first measurement trains the model for real."""
    if getattr(options, "compute_timing", "measured") != "modeled":
        return 0.0
    return load_profile(options.model, dataset=options.dataset, batch_size=options.batch_size,
                        model_args=options.model_args, dataset_args=options.dataset_args,
                        cache=cache).train_cpu_s_per_example
