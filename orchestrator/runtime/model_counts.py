"""What is counted of a model, kept across processes: its training step's FLOPs (for ``cost:
counted``, `orchestrator.runtime.compute_model`), its size and a copy's chunk frames (for admission
and the flow-level simulation, `orchestrator.runtime.compute.model_sizes`). A ``netai`` that finds
them kept neither builds the model nor imports torch: counting took about 2 s of a process's start,
most of it importing torch and the compiler its FLOP counter imports.

A count is not a measurement. It is a pure function of the code that builds the model and its data
and of the task's settings: no timing, nothing of the host's load. So a kept count is the count, and
its key holds all it depends on:

- the settings (model, model_args, dataset, dataset_args; the batch size for FLOPs), as canonical
  JSON, and what is counted;
- the versions of torch (the counter, the ops' formulas, the tensors' sizes), numpy and
  scikit-learn (the digits file the dataset reads);
- the source of the ``workers`` package (the models, the datasets, the learner, the frames) and of
  the modules that count with it (`COUNTING`: this one, `compute_model`'s count and `compute`'s
  build), as the process read them when it first keyed a count.

Only a built-in model (`BUILTIN_MODELS`, as ``workers.models`` registers it) on a built-in dataset
is kept. A model registered under another name or over a built-in's (``register_model``), or
named by a spec (``module:attr``, ``file.py:attr``), runs code the key cannot hold, and is counted
afresh by every process.

File: ``model-counts.json`` in the project's cache folder (`profiles.cache_dir`), written atomically.
A file that does not parse, or an entry that is not a count, is counted again and replaced::

    {"version": 1, "counts": {"<sha256 of the key>": {"flops_per_example": 20224.0, "train_examples": 1438},
                              "<sha256 of another>": {"model_bytes": 19240, "frames": {"65536": [19712]}}}}
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeGuard

from orchestrator.runtime import profiles

log = logging.getLogger(__name__)

VERSION = 1
FILE = "model-counts.json"
#: The distributions whose versions a count depends on (`key`).
VERSIONED = ("torch", "numpy", "scikit-learn")
#: The package whose source builds the model, the data, the training step and the frames.
WORKERS = Path(__file__).resolve().parents[2] / "workers"
#: The modules that count with it: their source is in the key too.
COUNTING = tuple(Path(__file__).resolve().parent / name for name in ("model_counts.py", "compute_model.py",
                                                                      "compute.py"))
#: The models and datasets whose counts are kept: ``workers.models``' own factories, ``workers.data``'s.
BUILTIN_MODELS = ("mlp", "cnn", "large")
BUILTIN_DATASETS = ("digits", "synthetic")

Frames = Callable[[int | None], tuple[int, ...]]


def default_path() -> Path:
    """The store: `FILE` in `profiles.cache_dir` (read when called)."""
    return profiles.cache_dir() / FILE


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.lru_cache(maxsize=1)
def _code_digest(root: Path) -> str:
    h = hashlib.sha256()
    named = [(p.relative_to(root).as_posix(), p) for p in sorted(root.rglob("*.py"))]
    for name, path in [*named, *((f"orchestrator/runtime/{p.name}", p) for p in COUNTING)]:
        h.update(f"\0{name}\0".encode())
        h.update(path.read_bytes())
    return h.hexdigest()


def _builtin(model: object, dataset: object) -> bool:
    """Whether `model` is one of `BUILTIN_MODELS` as ``workers.models`` registers it (not replaced in
    this process by ``register_model``) and `dataset` one of `BUILTIN_DATASETS`."""
    if model not in BUILTIN_MODELS or dataset not in BUILTIN_DATASETS:
        return False
    models = sys.modules.get("workers.models")  # not imported: nothing could have replaced it
    return models is None or models._REGISTRY.get(model) is getattr(models, str(model), None)


def key(what: str, settings: Mapping[str, Any]) -> str | None:
    """The store's key of the count `what` (``flops``, ``sizes``) of a model with these `settings`
    (``model`` and ``dataset`` among them), or None when they are not built-in (`_builtin`) or the
    settings are not JSON."""
    if not _builtin(settings["model"], settings["dataset"]):
        return None
    try:
        text = json.dumps({"what": what, "settings": dict(settings)}, sort_keys=True)
    except (TypeError, ValueError):
        return None
    h = hashlib.sha256(text.encode())
    for dist in VERSIONED:
        h.update(f"\0{dist}={_version(dist)}".encode())
    h.update(_code_digest(WORKERS).encode())
    return h.hexdigest()


def _read(path: Path) -> dict[str, Any]:
    return profiles.read_store(path, version=VERSION, field="counts", what="model counts", redo="counting")


def _positive_int(x: object) -> TypeGuard[int]:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def flops(k: str, path: Path | None = None) -> tuple[float, int] | None:
    """The kept FLOP count under key `k`: (FLOPs per example, training examples), or None."""
    entry = _read(path or default_path()).get(k)
    if not isinstance(entry, dict):
        return None
    f, examples = entry.get("flops_per_example"), entry.get("train_examples")
    if not isinstance(f, (int, float)) or isinstance(f, bool) or not f > 0 or not _positive_int(examples):
        return None
    return float(f), examples


def sizes(k: str, path: Path | None = None) -> tuple[int, dict[str, tuple[int, ...]]] | None:
    """The kept size under key `k`: (the model's bytes, a copy's frames by chunk size, as text), or None."""
    entry = _read(path or default_path()).get(k)
    if not isinstance(entry, dict) or not _positive_int(entry.get("model_bytes")) \
            or not isinstance(entry.get("frames"), dict):
        return None
    frames = {c: tuple(f) for c, f in entry["frames"].items()
              if isinstance(f, list) and f and all(_positive_int(n) for n in f)}
    return int(entry["model_bytes"]), frames


def keep(k: str, entry: Mapping[str, Any], path: Path | None = None) -> None:
    """Add `entry` to the kept counts under `k` (read, merged and replaced atomically: a process
    writing at the same moment may lose its entry, which is then counted again)."""
    path = path or default_path()
    counts = _read(path)
    counts[k] = dict(entry)
    try:  # readable by a run of another user (every counted run writes it, root's under sudo too)
        profiles.write_store(path, counts, version=VERSION, field="counts", mode=0o644)
    except OSError as e:  # a cache that cannot be written is counted again next time
        log.warning("%s: cannot keep the model's counts (%s)", path, e)


def kept_sizes(settings: Mapping[str, Any], build: Callable[[], tuple[int, Frames]]) -> tuple[int, Frames]:
    """The model's bytes and its frames by chunk size, as `build` gives them (it builds the model),
    taken from the store where kept: `build` then runs only for a chunk size not kept yet, once."""
    k = key("sizes", settings)
    if k is None:
        return build()
    built = functools.cache(build)
    got = sizes(k)
    if got is None:
        got = (built()[0], {})
        keep(k, {"model_bytes": got[0], "frames": {}})
    model_bytes, known = got

    def frames_at(chunk: int | None) -> tuple[int, ...]:
        text = "none" if chunk is None else str(chunk)
        if text not in known:
            known[text] = tuple(int(n) for n in built()[1](chunk))
            keep(k, {"model_bytes": model_bytes, "frames": known})
        return known[text]

    return model_bytes, frames_at
