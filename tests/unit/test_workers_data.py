"""Datasets and their IID / Dirichlet split among local models."""

from __future__ import annotations

import numpy as np
import pytest

from workers.data import load_dataset, partition


def test_digits_has_a_stratified_held_out_split() -> None:
    ds = load_dataset("digits", seed=0)
    assert ds.input_shape == (1, 8, 8) and ds.num_classes == 10
    assert len(ds.train_x) + len(ds.test_x) == 1797
    assert 0.18 < len(ds.test_x) / 1797 < 0.22
    assert set(ds.test_y.tolist()) == set(range(10))
    assert float(ds.train_x.max()) <= 1.0


def test_synthetic_large_inputs() -> None:
    ds = load_dataset("synthetic", input_shape=(3, 32, 32), num_examples=300, num_classes=4)
    assert tuple(ds.train_x.shape[1:]) == (3, 32, 32)
    assert len(set(ds.train_y.tolist())) == 4


@pytest.mark.parametrize("scheme", ["iid", "dirichlet"])
def test_partition_is_disjoint_and_complete(scheme: str) -> None:
    y = load_dataset("digits").train_y
    parts = partition(y, 6, scheme=scheme, alpha=0.3, seed=1)  # type: ignore[arg-type]
    allidx = np.concatenate(parts)
    assert len(parts) == 6 and min(len(p) for p in parts) >= 1
    assert len(allidx) == len(y) == len(set(allidx.tolist()))


def test_partition_is_deterministic_per_seed() -> None:
    y = load_dataset("digits").train_y
    a = partition(y, 4, scheme="dirichlet", seed=5)
    b = partition(y, 4, scheme="dirichlet", seed=5)
    assert all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))


def test_small_alpha_is_more_skewed_than_iid() -> None:
    y = load_dataset("digits").train_y.numpy()

    def skew(parts: list[np.ndarray]) -> float:
        # mean over parts of the largest class share
        return float(np.mean([np.bincount(y[p], minlength=10).max() / len(p) for p in parts]))

    assert skew(partition(y, 5, scheme="dirichlet", alpha=0.1, seed=0)) > skew(partition(y, 5, seed=0)) + 0.2


@pytest.mark.parametrize(("kw", "needle"), [({"scheme": "zipf"}, "partitioning"), ({"scheme": "dirichlet", "alpha": 0}, "alpha")])
def test_partition_rejects_bad_options(kw: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        partition(np.zeros(10, dtype=np.int64), 2, **kw)


def test_unknown_dataset() -> None:
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("imagenet")


def test_digits_read_without_scikit_learn_match_load_digits() -> None:
    from sklearn.datasets import load_digits

    from workers.data import _digits

    pixels, labels = _digits()
    bunch = load_digits()
    assert np.array_equal(pixels, bunch.data) and np.array_equal(labels, bunch.target)
