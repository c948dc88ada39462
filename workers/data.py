"""Datasets of the FL workers, all available offline, and their split among local models.

- ``digits``: scikit-learn's 8x8 handwritten digits (1797 images, 10 classes; ships with
  scikit-learn, no download), scaled to [0, 1], shape (1, 8, 8). A stratified held-out test split
  is kept for the global model.
- ``synthetic``: Gaussian inputs of any shape labelled by a fixed random linear teacher, so it is
  learnable; for large inputs (``input_shape``) and many examples without any file.
- a spec, as for models: ``package.module:factory`` or ``path/to/file.py:factory`` (the file is
  shipped to the site servers by content, like a model file). The factory is called as
  ``factory(seed=SEED, **dataset_args)`` and returns a `Dataset` or a mapping with ``train_x``,
  ``train_y``, ``test_x``, ``test_y`` (tensors or NumPy arrays) and optionally ``num_classes``;
  `open_dataset` checks what it returns (`check_dataset`).

`partition` splits the training examples among local models: ``iid`` (a seeded shuffle cut in
near-equal parts) or ``dirichlet`` (per class, proportions drawn from Dir(alpha); small alpha is
strongly non-IID). Every worker calls it with the same seed and takes its own part, so no data
moves over the network.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import torch

Partitioning = Literal["iid", "dirichlet"]
DATASETS = ("digits", "synthetic")


@dataclass(frozen=True)
class Dataset:
    """Train and test tensors of one dataset (inputs float32, labels int64)."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    input_shape: tuple[int, ...]
    num_classes: int


def _digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits (1797 images of 8x8 pixels, labels 0-9), read from the data file it ships,
    as its ``load_digits`` reads it, without importing scikit-learn: a site server then holds about
    80 MB less (fourteen servers, about 1 GB)."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError("the digits dataset needs scikit-learn installed (its data file)")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    data = np.loadtxt(path, delimiter=",")
    return data[:, :-1], data[:, -1].astype(int)


def load_dataset(
    name: str,
    *,
    seed: int = 0,
    test_fraction: float = 0.2,
    input_shape: tuple[int, ...] = (3, 32, 32),
    num_classes: int = 10,
    num_examples: int = 2000,
) -> Dataset:
    """Load a dataset by name (``digits`` or ``synthetic``).

    `input_shape`, `num_classes` and `num_examples` apply to ``synthetic`` only.

    Raises
    ------
    ValueError
        Unknown name or a test fraction outside (0, 1).
    """
    if not 0 < test_fraction < 1:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    if name == "digits":
        pixels, labels = _digits()
        x = (pixels.astype(np.float32) / 16.0).reshape(-1, 1, 8, 8)
        y = labels.astype(np.int64)
        shape: tuple[int, ...] = (1, 8, 8)
        classes = 10
    elif name == "synthetic":
        dim = math.prod(input_shape)
        x = rng.standard_normal((num_examples, dim), dtype=np.float32)
        teacher = rng.standard_normal((dim, num_classes), dtype=np.float32)
        y = np.argmax(x @ teacher, axis=1).astype(np.int64)
        x = x.reshape(num_examples, *input_shape)
        shape, classes = tuple(input_shape), num_classes
    else:
        raise ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASETS)}")
    train_idx, test_idx = _stratified_split(y, test_fraction, rng)
    return Dataset(
        name=name,
        train_x=torch.from_numpy(np.ascontiguousarray(x[train_idx])),
        train_y=torch.from_numpy(y[train_idx]),
        test_x=torch.from_numpy(np.ascontiguousarray(x[test_idx])),
        test_y=torch.from_numpy(y[test_idx]),
        input_shape=shape,
        num_classes=classes,
    )


def open_dataset(spec: str, *, seed: int = 0, args: Mapping[str, Any] | None = None) -> Dataset:
    """The dataset a spec names: a built-in name (`load_dataset`) or ``module:factory`` /
    ``file.py:factory`` (see the module docstring), checked (`check_dataset`).

    Raises
    ------
    ValueError
        One line naming the dataset and what is wrong (unknown name or argument, a factory that
        cannot be loaded or raises, or returns something unusable).
    """
    kwargs = dict(args or {})
    if "input_shape" in kwargs and isinstance(kwargs["input_shape"], list):
        kwargs["input_shape"] = tuple(kwargs["input_shape"])
    if ":" not in spec:
        try:
            return load_dataset(spec, seed=seed, **kwargs)
        except TypeError as e:
            raise ValueError(f"dataset {spec!r}: {e}") from None
    from workers.models import ModelSpecError, resolve_factory

    try:
        factory = resolve_factory(spec)
    except ModelSpecError as e:
        raise ValueError(f"dataset {spec!r} cannot be loaded: {e}") from None
    try:
        got = factory(seed=seed, **kwargs)
    except Exception as e:  # noqa: BLE001 -- the user's factory may raise anything: one line
        raise ValueError(f"dataset {spec!r}: the factory raised {type(e).__name__}: {e}") from None
    return check_dataset(spec, got)


def check_dataset(name: str, got: Any) -> Dataset:
    """A `Dataset` from what a dataset factory returned, checked: float inputs of one shape and
    finite values, int labels in 0..num_classes-1, non-empty train and test splits."""
    if isinstance(got, Dataset):
        parts: Mapping[str, Any] = {"train_x": got.train_x, "train_y": got.train_y, "test_x": got.test_x,
                                    "test_y": got.test_y, "num_classes": got.num_classes}
    elif isinstance(got, Mapping):
        parts = got
    else:
        raise ValueError(f"dataset {name!r}: the factory returned {type(got).__name__}, not a Dataset or mapping")
    unknown = set(parts) - {"train_x", "train_y", "test_x", "test_y", "num_classes"}
    missing = {"train_x", "train_y", "test_x", "test_y"} - set(parts)
    if unknown or missing:
        raise ValueError(f"dataset {name!r}: unknown keys {sorted(unknown)} / missing keys {sorted(missing)}")
    t = {k: torch.as_tensor(parts[k]) for k in ("train_x", "train_y", "test_x", "test_y")}
    for split in ("train", "test"):
        x, y = t[f"{split}_x"], t[f"{split}_y"]
        if not x.is_floating_point() or x.dim() < 2 or not len(x):
            raise ValueError(f"dataset {name!r}: {split}_x must be a non-empty float array (examples first)")
        if y.dtype.is_floating_point or y.dtype == torch.bool or y.dim() != 1 or len(y) != len(x):
            raise ValueError(f"dataset {name!r}: {split}_y must be integer labels, one per example of {split}_x")
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"dataset {name!r}: {split}_x has non-finite values")
    if t["train_x"].shape[1:] != t["test_x"].shape[1:]:
        raise ValueError(f"dataset {name!r}: train and test inputs differ in shape")
    labels = torch.cat([t["train_y"], t["test_y"]])
    classes = parts.get("num_classes", int(labels.max()) + 1)
    if isinstance(classes, bool) or not isinstance(classes, int) or classes < 2:
        raise ValueError(f"dataset {name!r}: num_classes must be an integer >= 2, got {classes!r}")
    if int(labels.min()) < 0 or int(labels.max()) >= classes:
        raise ValueError(f"dataset {name!r}: labels must be in 0..{classes - 1}")
    return Dataset(name=name, train_x=t["train_x"].to(torch.float32).contiguous(),
                   train_y=t["train_y"].to(torch.int64), test_x=t["test_x"].to(torch.float32).contiguous(),
                   test_y=t["test_y"].to(torch.int64), input_shape=tuple(t["train_x"].shape[1:]),
                   num_classes=classes)


def _stratified_split(
    y: npt.NDArray[np.int64], test_fraction: float, rng: np.random.Generator
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    train: list[npt.NDArray[np.int64]] = []
    test: list[npt.NDArray[np.int64]] = []
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        k = round(len(idx) * test_fraction)
        test.append(idx[:k])
        train.append(idx[k:])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(test))


def partition(
    labels: npt.NDArray[np.integer] | torch.Tensor,
    num_parts: int,
    *,
    scheme: Partitioning = "iid",
    alpha: float = 0.5,
    seed: int = 0,
    min_size: int = 1,
) -> list[npt.NDArray[np.int64]]:
    """Split example indices among `num_parts` local models.

    Parameters
    ----------
    labels
        Class label of every training example.
    scheme
        ``iid``: a seeded shuffle cut into near-equal parts. ``dirichlet``: per class, the
        class's examples are divided by proportions drawn from Dir(alpha) (McMahan-style non-IID).
    alpha
        Concentration of the Dirichlet draw (``dirichlet`` only); must be positive.
    min_size
        Every part gets at least this many examples (redrawn up to 100 times for ``dirichlet``).

    Returns
    -------
    list of index arrays, disjoint, covering all examples, each sorted.

    Raises
    ------
    ValueError
        Bad `num_parts`, `alpha` or scheme, or too few examples for `min_size`.
    """
    y = labels.numpy() if isinstance(labels, torch.Tensor) else np.asarray(labels)
    n = len(y)
    if num_parts < 1:
        raise ValueError(f"num_parts must be at least 1, got {num_parts}")
    if n < num_parts * min_size:
        raise ValueError(f"{n} examples cannot give {num_parts} parts of at least {min_size}")
    rng = np.random.default_rng(seed)
    if scheme == "iid":
        return [np.sort(p).astype(np.int64) for p in np.array_split(rng.permutation(n), num_parts)]
    if scheme != "dirichlet":
        raise ValueError(f"unknown partitioning {scheme!r}: use 'iid' or 'dirichlet'")
    if not alpha > 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    for _ in range(100):
        parts: list[list[int]] = [[] for _ in range(num_parts)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            props = rng.dirichlet(np.full(num_parts, alpha))
            cuts = (np.cumsum(props)[:-1] * len(idx)).astype(int)
            for k, piece in enumerate(np.split(idx, cuts)):
                parts[k].extend(piece.tolist())
        if min(len(p) for p in parts) >= min_size:
            return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]
    raise ValueError(f"no Dirichlet(alpha={alpha}) draw gave every part {min_size} examples; raise alpha")
