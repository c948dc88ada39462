"""Weighted federated averaging (FedAvg) as pure typed functions.

`aggregate` is the plain reference (Flower's ``aggregate``): the example-weighted mean of several
weight sets. `ChunkSum` is the path the agent's round engine uses, one chunk of the model at a
time (`workers.rounds`). `WeightedAccumulator` is the same over whole tensor sets: it folds updates in one at a time,
as they arrive, into float64 running sums (no list of all updates, one buffer per tensor), so a
relay aggregates while its other children are still sending. Because a partial aggregate carries
its example count, aggregating along any tree gives the flat FedAvg of the leaves (up to float
rounding): sum_i n_i w_i / sum_i n_i is associative when each partial result is (mean, count).

References
----------
McMahan et al., "Communication-Efficient Learning of Deep Networks from Decentralized Data",
AISTATS 2017 (FedAvg). Flower: flwr/server/strategy/aggregate.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import torch

NDArrays = list[npt.NDArray[np.floating]]


def aggregate(results: Sequence[tuple[NDArrays, int]]) -> NDArrays:
    """Example-weighted mean of weight sets (the reference implementation).

    Parameters
    ----------
    results
        ``(weights, num_examples)`` pairs; every ``weights`` is a list of arrays of the same shapes.

    Returns
    -------
    NDArrays
        ``sum_i n_i * w_i / sum_i n_i`` per array, in float64.

    Raises
    ------
    ValueError
        If `results` is empty, the total example count is not positive, a count is negative, or
        the weight sets differ in length.
    """
    if not results:
        raise ValueError("nothing to aggregate")
    if any(n < 0 for _, n in results):
        raise ValueError("example counts must not be negative")
    total = sum(n for _, n in results)
    if total <= 0:
        raise ValueError("the total example count must be positive")
    if len({len(w) for w, _ in results}) != 1:
        raise ValueError("weight sets differ in the number of arrays")
    weighted = [[np.asarray(layer, dtype=np.float64) * n for layer in w] for w, n in results]
    return [sum(layers) / total for layers in zip(*weighted, strict=True)]


class WeightedAccumulator:
    """Streaming example-weighted mean of tensor sets (the agent's optimized path).

    Call `add` once per update (own training result, a child's partial aggregate) and `result`
    at the end. Sums are kept in float64; `result` casts back to each tensor's original dtype.

    Raises
    ------
    ValueError
        From `add` when names or shapes differ from the first update or a count is negative;
        from `result` when nothing with a positive count was added.
    """

    def __init__(self) -> None:
        self._sums: dict[str, torch.Tensor] = {}
        self._dtypes: dict[str, torch.dtype] = {}
        self.num_examples = 0
        self.num_updates = 0

    def add(self, tensors: Mapping[str, torch.Tensor], num_examples: int) -> None:
        if num_examples < 0:
            raise ValueError("example counts must not be negative")
        if not self._sums:
            for name, t in tensors.items():
                self._dtypes[name] = t.dtype
                self._sums[name] = t.detach().to(torch.float64) * num_examples
        else:
            if set(tensors) != set(self._sums):
                raise ValueError("tensor names differ from the first update")
            for name, t in tensors.items():
                acc = self._sums[name]
                if acc.shape != t.shape:
                    raise ValueError(f"{name}: shape {tuple(t.shape)} differs from {tuple(acc.shape)}")
                acc.add_(t.detach().to(torch.float64), alpha=num_examples)
        self.num_examples += num_examples
        self.num_updates += 1

    def result(self) -> dict[str, torch.Tensor]:
        """The weighted mean, in the tensors' original dtypes."""
        if self.num_examples <= 0:
            raise ValueError("nothing with a positive example count was aggregated")
        return {
            name: (acc / self.num_examples).to(self._dtypes[name]) for name, acc in self._sums.items()
        }


def aggregate_tensors(results: Sequence[tuple[Mapping[str, torch.Tensor], int]]) -> dict[str, torch.Tensor]:
    """`WeightedAccumulator` over a list: the optimized counterpart of `aggregate` for tensor sets."""
    acc = WeightedAccumulator()
    for tensors, n in results:
        acc.add(tensors, n)
    return acc.result()


@dataclass
class ChunkSum:
    """The example-weighted mean of one chunk's contributions, folded in as they arrive.

    One contribution is kept as it is (and passed on unchanged: the mean of one); from the second
    on, a `WeightedAccumulator` sums in float64. Contributions with no examples only mark the
    contributor as heard from.
    """

    have: set[str] = field(default_factory=set)
    num_examples: int = 0
    single: dict[str, torch.Tensor] | None = None
    sums: WeightedAccumulator | None = None

    def add(self, who: str, tensors: Mapping[str, torch.Tensor], n: int) -> None:
        self.have.add(who)
        if n <= 0:
            return
        if self.num_examples == 0:
            self.single = dict(tensors)
        else:
            if self.sums is None:
                assert self.single is not None
                self.sums = WeightedAccumulator()
                self.sums.add(self.single, self.num_examples)
                self.single = None
            self.sums.add(tensors, n)
        self.num_examples += n

    def mean(self) -> dict[str, torch.Tensor] | None:
        """The example-weighted mean (None when nothing with examples arrived)."""
        if self.num_examples == 0:
            return None
        if self.sums is not None:
            return self.sums.result()
        assert self.single is not None
        return self.single


def fingerprint(tensors: Mapping[str, torch.Tensor]) -> list[float]:
    """Two linear functionals of a tensor set (float64): the sum of every element, and the sum
    weighted by (index mod 7) - 3. Linear, so an aggregate's fingerprint is the example-weighted mean
    of its contributors' (up to float32 rounding): what the fault tests check a round against."""
    total = weighted = 0.0
    for name in sorted(tensors):
        t = tensors[name].detach().reshape(-1).to(torch.float64)
        w = torch.arange(t.numel(), dtype=torch.float64).remainder_(7).sub_(3)
        total += float(t.sum())
        weighted += float((t * w).sum())
    return [total, weighted]
