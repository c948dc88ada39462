"""What is counted of a model, kept across processes (`orchestrator.runtime.model_counts`): a later
process takes the FLOP count and the model's size and frames without torch, the same figures as
counted afresh; the key holds everything a count depends on; a model named by a spec is never kept;
a bad store is counted again and replaced."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import compute_model, model_counts
from orchestrator.runtime.compute import _built_sizes, model_sizes
from orchestrator.runtime.compute_model import count_training
from workers.spec import LearningSpec

ROOT = Path(__file__).resolve().parents[2]
#: torch's count of the default mlp (tests/unit/test_compute_model.py counts it by hand).
DEFAULT_MLP_FLOPS = 20_224
#: A process that counts the default mlp's training and sizes it, and says whether it imported torch.
COUNT = ("import json, sys\n"
         "from orchestrator.runtime.compute import model_sizes\n"
         "from orchestrator.runtime.compute_model import count_training\n"
         "from workers.spec import LearningSpec\n"
         "flops, examples = count_training(LearningSpec())\n"
         "size, frames = model_sizes('mlp', {})\n"
         "print(json.dumps([flops, examples, size, frames(4096), 'torch' in sys.modules]))")


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A cache folder of this test's own, and no count in this process's memo."""
    monkeypatch.setenv("NETAI_CACHE_DIR", str(tmp_path / "cache"))
    compute_model._count.cache_clear()
    yield tmp_path / "cache" / model_counts.FILE
    compute_model._count.cache_clear()


def _count_in_a_process() -> list[object]:
    res = subprocess.run([sys.executable, "-c", COUNT], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ})
    assert res.returncode == 0, res.stderr
    got: list[object] = json.loads(res.stdout)
    return got


def test_counts_are_kept_and_a_later_process_takes_them_without_importing_torch(store: Path) -> None:
    # Prepare: the figures of the model built here.
    size, frames = _built_sizes("mlp", {}, "digits", None)
    built = [DEFAULT_MLP_FLOPS, 1438, size, list(frames(4096))]

    # Execute: two processes count and size the same model, one after the other.
    first = _count_in_a_process()
    second = _count_in_a_process()

    # Assert: the first counted (torch imported) and kept its counts; the second took the same
    # figures from the store and never imported torch.
    assert first == [*built, True]
    assert second == [*built, False]
    counts = json.loads(store.read_text())["counts"].values()
    assert {"flops_per_example": DEFAULT_MLP_FLOPS, "train_examples": 1438} in counts
    assert {"model_bytes": size, "frames": {"4096": list(frames(4096))}} in counts


def test_a_chunk_size_not_kept_yet_is_counted_and_added(store: Path) -> None:
    # Prepare: the model's size kept, with the frames of one chunk size.
    _, built = _built_sizes("mlp", {}, "digits", None)
    _, frames = model_sizes("mlp", {})
    assert frames(8192) == built(8192)

    # Execute: a later call (as a later process: the store read afresh) at another chunk size.
    _, later = model_sizes("mlp", {})
    got = later(1024)

    # Assert: the figures built here, and both chunk sizes now kept.
    assert got == built(1024) and later(8192) == built(8192)
    key = model_counts.key("sizes", {"model": "mlp", "model_args": {}, "dataset": "digits", "dataset_args": {}})
    assert key is not None
    kept = model_counts.sizes(key, store)
    assert kept is not None and set(kept[1]) == {"8192", "1024"}


def test_the_key_changes_with_the_settings_the_versions_and_the_workers_source(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: the settings of the default mlp, and a copy of the workers package to edit.
    settings = json.loads(compute_model._settings_json(LearningSpec()))
    copy = tmp_path / "workers"
    shutil.copytree(model_counts.WORKERS, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(model_counts, "WORKERS", copy)
    base = model_counts.key("flops", settings)

    # Execute and assert: each thing a count depends on moves the key; nothing else does.
    assert model_counts.key("flops", settings) == base
    assert model_counts.key("sizes", settings) != base
    assert model_counts.key("flops", {**settings, "batch_size": 16}) != base
    assert model_counts.key("flops", {**settings, "model_args": {"hidden": 200}}) != base
    assert model_counts.key("flops", {**settings, "dataset": "synthetic"}) != base
    assert model_counts.key("flops", {**settings, "dataset_args": {"seed": 1}}) != base
    (copy / "models" / "__init__.py").write_text((copy / "models" / "__init__.py").read_text() + "\n# edited\n")
    model_counts._code_digest.cache_clear()
    edited = model_counts.key("flops", settings)
    assert edited not in (base, None)
    real = model_counts._version
    keys = {base, edited}
    for dist in model_counts.VERSIONED:
        monkeypatch.setattr(model_counts, "_version", lambda d, dist=dist: "0" if d == dist else real(d))
        moved = model_counts.key("flops", settings)
        assert moved not in keys and moved is not None, dist
        keys.add(moved)
    model_counts._code_digest.cache_clear()


@pytest.mark.parametrize("spec", [{"model": "examples/models/wide_mlp.py:wide_mlp"},
                                  {"model": "mlp", "dataset": "my_data:make"}])
def test_a_model_or_dataset_named_by_a_spec_is_never_kept(spec: dict[str, str], store: Path) -> None:
    settings = json.loads(compute_model._settings_json(LearningSpec(**spec)))

    assert model_counts.key("flops", settings) is None
    assert model_counts.key("sizes", settings) is None
    if spec["model"] != "mlp":  # a model file: counted and sized, and nothing written
        flops, _ = count_training(LearningSpec(**spec))
        size, frames = model_sizes(spec["model"], {})
        assert flops > 0 and size > 0 and frames(4096)
        assert not store.exists()


def test_a_model_registered_over_a_built_in_or_under_a_new_name_is_never_kept(
        store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from workers import models

    # Prepare: the built-in mlp kept by a first count.
    size, _ = model_sizes("mlp", {})
    assert model_counts.key("sizes", {"model": "mlp", "model_args": {}, "dataset": "digits",
                                      "dataset_args": {}}) is not None

    # Execute: mlp replaced in this process by a narrower model, and one under a new name.
    monkeypatch.setitem(models._REGISTRY, "mlp",
                        lambda **kw: models.mlp(**{**kw, "hidden": 8}))
    monkeypatch.setitem(models._REGISTRY, "mine", models.mlp)
    replaced, _ = model_sizes("mlp", {})
    mine, _ = model_sizes("mine", {})

    # Assert: both built here (the replaced mlp is not the kept one), neither keyed.
    assert replaced < size and mine == size
    for name in ("mlp", "mine"):
        assert model_counts.key("sizes", {"model": name, "model_args": {}, "dataset": "digits",
                                          "dataset_args": {}}) is None


@pytest.mark.parametrize("content", ["{not json", json.dumps({"version": 0, "counts": {}}), "BAD_ENTRY"])
def test_a_bad_store_or_entry_is_counted_again_and_replaced(content: str, store: Path) -> None:
    # Prepare: a store that does not parse, of another version, or whose counts are no counts.
    flops_key = model_counts.key("flops", json.loads(compute_model._settings_json(LearningSpec())))
    sizes_key = model_counts.key("sizes", {"model": "mlp", "model_args": {}, "dataset": "digits",
                                           "dataset_args": {}})
    assert flops_key is not None and sizes_key is not None
    if content == "BAD_ENTRY":
        content = json.dumps({"version": model_counts.VERSION,
                              "counts": {flops_key: {"flops_per_example": -1, "train_examples": 1438},
                                         sizes_key: {"model_bytes": "big", "frames": {}}}})
    store.parent.mkdir(parents=True)
    store.write_text(content)

    # Execute
    flops, examples = count_training(LearningSpec())
    size, _ = model_sizes("mlp", {})

    # Assert: counted (the true figures, not the bad ones), and the store now holds them.
    assert (flops, examples) == (DEFAULT_MLP_FLOPS, 1438)
    assert size == _built_sizes("mlp", {}, "digits", None)[0]
    assert model_counts.flops(flops_key, store) == (DEFAULT_MLP_FLOPS, 1438)
    assert model_counts.sizes(sizes_key, store) == (size, {})
