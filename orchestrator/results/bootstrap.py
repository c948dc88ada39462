"""The one confidence interval the results give: a seeded percentile bootstrap of a mean.

It imports nothing of the project, so that the fidelity verdict and the run's statistics both use it.
"""

from __future__ import annotations

import numpy as np


def bootstrap_ci(values: list[float], *, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the mean of `values` (seeded: reproducible)."""
    arr = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, len(arr), size=(resamples, len(arr)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)
