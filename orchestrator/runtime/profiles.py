"""Task profiles: what a model's training and aggregation cost in CPU, measured on this machine.

`measure` trains the model for real with the workers' own code (`workers.learning.Learner`, one
torch thread, the task's dataset and batch size), on the whole training split and on one of
`PROFILE_PARTS` parts of it, `REPEATS` times each, and fits a round's training cost as a line
``fixed + per_example x examples x epochs`` (`fit_training_cost`: a round pays a fixed cost too,
its set-up, the partial batch's step, the training thread, which a per-example figure taken over
the whole split spreads thin and a local with a small part pays in full); it aggregates updates
with the round engine's accumulator (`workers.aggregate.WeightedAccumulator`), timing both in CPU seconds (training in the
process's, since the workers train on a thread of their own; aggregation in the measuring
thread's): the figure is the work, not the wait, so other processes on the machine do not inflate it.
`load_profile` measures once per model and caches the result in a JSON file (`default_cache`, or
the path given); `training_profile` turns it into the `orchestrator.scheduling.joint.TrainingProfile`
the ``joint`` scheduler predicts rounds with.

A profile is this host's figure, and it depends on how busy the host was when it was measured:
modelled training takes it only when an experiment asks for it (``compute: {cost: profile}``,
`orchestrator.runtime.compute_model`); by default the cost is counted from the model itself.

Cache file (JSON, written atomically; a file that does not parse is measured again and replaced)::

    {"version": 2, "profiles": {"<key>": {"model": "mlp", "dataset": "digits", ...}}}

where ``<key>`` is the canonical JSON of what was measured (model, model_args, dataset,
dataset_args, batch_size) and of torch's version. Version 1 had no ``train_cpu_s_per_round``: its
entries are measured again (so is any entry without it).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.scheduling.joint import TrainingProfile
from workers.config import check_cost
from workers.spec import DEFAULTS

log = logging.getLogger(__name__)

CACHE_VERSION = 2
#: Environment variable naming the folder of the project's caches (else ``$XDG_CACHE_HOME/netai``,
#: default ``~/.cache/netai``); the tests point it at a folder of their own.
ENV_CACHE_DIR = "NETAI_CACHE_DIR"
#: Children whose updates `measure` folds into one aggregate.
AGGREGATE_CHILDREN = 4
#: The small partition `measure` also trains on: one of this many parts of the training split (a
#: local's share when this many locals split it).
PROFILE_PARTS = 24
#: Trainings timed of each size, the whole split's and the small part's taking turns (so that both see
#: the host alike); each size's figure is the median (one run is at the mercy of the host's other
#: work; the minimum would under-model what a site pays).
REPEATS = 9


def cache_dir() -> Path:
    """The folder of the project's per-user caches: `$NETAI_CACHE_DIR`, else ``$XDG_CACHE_HOME/netai``
    (default ``~/.cache/netai``); read when called."""
    folder = os.environ.get(ENV_CACHE_DIR)
    if folder:
        return Path(folder)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "netai"


def default_cache() -> Path:
    """The profile cache file: ``profiles.json`` in `cache_dir`."""
    return cache_dir() / "profiles.json"


@dataclass(frozen=True)
class MeasuredProfile:
    """One model's measured costs on this machine."""

    model: str
    dataset: str
    batch_size: int
    #: CPU seconds per training example and epoch (one thread): the slope of `fit_training_cost`.
    train_cpu_s_per_example: float
    #: CPU seconds a round of local training costs whatever its examples: the intercept.
    train_cpu_s_per_round: float
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
        for name in ("train_cpu_s_per_example", "train_cpu_s_per_round", "aggregate_cpu_s_per_mb"):
            check_cost(name, getattr(p, name))
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


def fit_training_cost(samples: Mapping[int, Sequence[float]]) -> tuple[float, float]:
    """``(fixed, per_example)`` of the line ``t = fixed + per_example x n`` through the median time of
    each size: `samples` maps a number of examples (x epochs) to CPU seconds of its trainings; least
    squares over the sizes' medians (two sizes: the line through both).

    A negative intercept (the small part timed faster than the line through the whole split allows:
    noise) is clamped at 0 and the slope then fitted through the origin, so no round is modelled
    shorter than its examples' share of the whole split. One size alone: no intercept can be told,
    0 and the size's own per-example figure. Raises ValueError on no samples or a size <= 0."""
    points = [(float(n), statistics.median(ts)) for n, ts in sorted(samples.items()) if ts]
    if not points or any(n <= 0 for n, _ in points):
        raise ValueError(f"need trainings of a positive number of examples, got sizes {sorted(samples)}")
    mean_n = sum(n for n, _ in points) / len(points)
    mean_t = sum(t for _, t in points) / len(points)
    spread = sum((n - mean_n) ** 2 for n, _ in points)
    if spread > 0:
        slope = sum((n - mean_n) * (t - mean_t) for n, t in points) / spread
        fixed = mean_t - slope * mean_n
        if fixed >= 0 and slope >= 0:
            return fixed, slope
        if slope < 0:  # the small part cost more than the whole split: all of it is fixed cost
            return max(mean_t, 0.0), 0.0
    through_origin = sum(n * t for n, t in points) / sum(n * n for n, _ in points)
    return 0.0, max(through_origin, 0.0)


def _train_cpu(learners: Sequence[Any], repeats: int) -> list[tuple[int, list[float]]]:
    """Each learner's example count and the process CPU seconds of its `repeats` trainings, the
    learners taking turns. The workers train on a thread of their own (`workers.learning`): the
    process's CPU time counts it, the calling thread's would not (nothing else of this process runs
    meanwhile)."""
    examples = [0] * len(learners)
    times: list[list[float]] = [[] for _ in learners]
    for _ in range(repeats):
        for i, learner in enumerate(learners):
            start = time.process_time()
            examples[i] = learner.train()
            times[i].append(time.process_time() - start)
    return list(zip(examples, times, strict=True))


def _learner(cfg: Any) -> Any:
    from workers.learning import Learner

    try:
        return Learner(cfg)  # warms up: torch's one-time costs are not in the figure
    except Exception as e:  # noqa: BLE001 -- a user's model factory may raise anything: one line
        raise ConfigError(f"model {cfg.model!r} on {cfg.dataset!r} cannot be profiled: {type(e).__name__}: {e}") \
            from None


def measure(
    model: str = DEFAULTS.model, *, dataset: str = DEFAULTS.dataset, batch_size: int = DEFAULTS.batch_size,
    epochs: int = 1,
    model_args: Mapping[str, Any] | None = None, dataset_args: Mapping[str, Any] | None = None,
) -> MeasuredProfile:
    """Train `model` on the whole training split of `dataset` and on one of `PROFILE_PARTS` parts of
    it, `epochs` epochs a training, fit the round's fixed and per-example cost (`fit_training_cost`),
    and aggregate `AGGREGATE_CHILDREN` updates, with the workers' code; return the CPU costs.

    Raises
    ------
    ConfigError
        If the model or dataset cannot be built (one line).
    """
    import torch

    from workers.aggregate import WeightedAccumulator
    from workers.config import AgentConfig

    if epochs <= 0 or batch_size <= 0:
        raise ConfigError(f"epochs and batch_size must be positive, got {epochs} and {batch_size}")
    cfg = AgentConfig(
        task=1, site="profile", host="127.0.0.1", broadcast_port=1, upload_port=2, rounds=1,
        model=model, model_args=dict(model_args or {}), dataset=dataset, dataset_args=dict(dataset_args or {}),
        num_parts=1, part_index=0, local_epochs=epochs, batch_size=batch_size, threads=1,
    )
    threads = torch.get_num_threads()
    try:
        learner = _learner(cfg)
        examples = learner.num_examples
        parts = min(PROFILE_PARTS, examples)  # a local's share when `parts` locals split the training set
        learners = [learner] + ([_learner(replace(cfg, num_parts=parts))] if parts > 1 else [])
        samples: dict[int, list[float]] = {}
        for n, times in _train_cpu(learners, REPEATS):
            samples.setdefault(n * epochs, []).extend(times)
        fixed, per_example = fit_training_cost(samples)
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
        train_cpu_s_per_example=per_example, train_cpu_s_per_round=fixed,
        aggregate_cpu_s_per_mb=aggregate_cpu / (AGGREGATE_CHILDREN * mb),
        train_examples=examples, model_bytes=learner.model_bytes, torch_version=str(torch.__version__),
        model_args=dict(model_args or {}), dataset_args=dict(dataset_args or {}),
    )


def read_store(path: Path, *, version: int, field: str, what: str, redo: str) -> dict[str, Any]:
    """The entries (`field`) of a versioned JSON store of the project's caches; none, with a warning
    naming `what` and `redo`, when the file does not parse or is of another version; none when absent."""
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        log.warning("%s: unreadable %s (%s): %s again", path, what, e, redo)
        return {}
    if not isinstance(doc, dict) or doc.get("version") != version or not isinstance(doc.get(field), dict):
        log.warning("%s: not version %d %s: %s again", path, version, what, redo)
        return {}
    return dict(doc[field])


def _read_cache(path: Path) -> dict[str, Any]:
    return read_store(path, version=CACHE_VERSION, field="profiles", what="profile cache", redo="measuring")


def write_store(path: Path, entries: Mapping[str, Any], *, version: int, field: str, mode: int | None = None) -> None:
    """Replace `read_store`'s file with `entries` (`field`) atomically: written beside it, then renamed
    over it (`mode`: its permissions, else the temporary file's, the owner's only). Raises `OSError`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}-", suffix=".json", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"version": version, field: dict(entries)}, f, indent=2, sort_keys=True)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _write_cache(path: Path, profiles: Mapping[str, Any]) -> None:
    write_store(path, profiles, version=CACHE_VERSION, field="profiles")


def load_profile(
    model: str = DEFAULTS.model, *, dataset: str = DEFAULTS.dataset, batch_size: int = DEFAULTS.batch_size,
    model_args: Mapping[str, Any] | None = None, dataset_args: Mapping[str, Any] | None = None,
    cache: Path | None = None, refresh: bool = False,
) -> MeasuredProfile:
    """The cached profile of `model` (with these arguments, under this torch version), measured
    and added to the cache file when absent (or when `refresh`)."""
    import torch

    path = cache or default_cache()
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
        train_cpu_s_per_round=measured.train_cpu_s_per_round,
        examples_per_round=measured.train_examples * local_epochs,
        aggregate_cpu_s_per_mb=measured.aggregate_cpu_s_per_mb,
    )

