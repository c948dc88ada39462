"""Aggregation: the streaming path equals the reference; any tree equals flat FedAvg."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workers.aggregate import WeightedAccumulator, aggregate, aggregate_tensors

SHAPES = {"w": (3, 4), "b": (4,)}


def _update(rng: np.random.Generator) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for k, s in SHAPES.items()}


def test_accumulator_matches_reference() -> None:
    rng = np.random.default_rng(1)
    updates = [(_update(rng), int(n)) for n in rng.integers(1, 500, size=7)]

    got = aggregate_tensors(updates)
    ref = aggregate([([u["w"].numpy(), u["b"].numpy()], n) for u, n in updates])

    np.testing.assert_allclose(got["w"].numpy(), ref[0], atol=1e-6)
    np.testing.assert_allclose(got["b"].numpy(), ref[1], atol=1e-6)
    assert got["w"].dtype == torch.float32


def test_zero_count_update_has_no_weight() -> None:
    a = {"w": torch.ones(2)}
    b = {"w": torch.full((2,), 100.0)}

    got = aggregate_tensors([(a, 10), (b, 0)])

    assert torch.equal(got["w"], torch.ones(2))


@pytest.mark.parametrize(
    "results",
    [[], [([np.ones(2)], 0)], [([np.ones(2)], -1), ([np.ones(2)], 3)]],
    ids=["empty", "zero-total", "negative"],
)
def test_reference_rejects_bad_input(results: list) -> None:
    with pytest.raises(ValueError):
        aggregate(results)


def test_accumulator_rejects_mismatched_shapes() -> None:
    acc = WeightedAccumulator()
    acc.add({"w": torch.zeros(3)}, 1)
    with pytest.raises(ValueError, match="shape"):
        acc.add({"w": torch.zeros(4)}, 1)
    with pytest.raises(ValueError, match="names"):
        acc.add({"v": torch.zeros(3)}, 1)


@st.composite
def trees(draw: st.DrawFn) -> tuple[dict[int, int], set[int], list[int]]:
    """A random rooted tree over nodes 0..n-1 (root 0): parent map, leaves with a model, counts."""
    n = draw(st.integers(min_value=2, max_value=14))
    parent = {i: draw(st.integers(min_value=0, max_value=i - 1)) for i in range(1, n)}
    # every non-root node may hold a model; relays (internal nodes without one) are allowed
    holders = {i for i in range(1, n) if draw(st.booleans()) or i not in parent.values()}
    counts = [draw(st.integers(min_value=1, max_value=1000)) for _ in range(n)]
    return parent, holders, counts


@settings(max_examples=60, deadline=None)
@given(trees(), st.integers(min_value=0, max_value=2**31 - 1))
def test_tree_aggregation_equals_flat_fedavg(
    tree: tuple[dict[int, int], set[int], list[int]], seed: int
) -> None:
    parent, holders, counts = tree
    rng = np.random.default_rng(seed)
    updates = {i: _update(rng) for i in holders}
    children: dict[int, list[int]] = {}
    for c, p in parent.items():
        children.setdefault(p, []).append(c)

    def up(node: int) -> tuple[dict[str, torch.Tensor] | None, int]:
        """What `node` sends up: its partial aggregate as float32 (as on the wire) and its count."""
        acc = WeightedAccumulator()
        if node in updates:
            acc.add(updates[node], counts[node])
        for c in children.get(node, []):
            sub, n = up(c)
            if sub is not None:
                acc.add(sub, n)
        return (acc.result(), acc.num_examples) if acc.num_examples else (None, 0)

    tree_result, tree_count = up(0)
    flat = aggregate([([u["w"].numpy(), u["b"].numpy()], counts[i]) for i, u in updates.items()])

    assert tree_result is not None
    assert tree_count == sum(counts[i] for i in holders)
    np.testing.assert_allclose(tree_result["w"].numpy(), flat[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(tree_result["b"].numpy(), flat[1], rtol=0, atol=1e-6)


def test_chunk_sums_over_a_sliced_layout_equal_flat_fedavg() -> None:
    from workers.aggregate import ChunkSum
    from workers.framing import chunk_layout, chunk_view

    # Prepare: three updates of a model whose big tensor is cut into row slices across chunks.
    gen = torch.Generator().manual_seed(3)
    template = {"w": torch.zeros(50, 8), "b": torch.zeros(8), "h": torch.zeros(3, dtype=torch.float16)}
    updates = [({k: torch.randn(v.shape, generator=gen).to(v.dtype) for k, v in template.items()}, n)
                for n in (3, 10, 7)]
    layout = chunk_layout(template, 8 * 4 * 12)
    assert any(p.first_row is not None for c in layout for p in c.pieces)

    # Execute: fold every chunk's contributions as the round engine does, then reassemble.
    rebuilt = {k: torch.zeros_like(v) for k, v in template.items()}
    for spec in layout:
        acc = ChunkSum()
        for i, (state, n) in enumerate(updates):
            acc.add(str(i), chunk_view(state, spec), n)
        mean = acc.mean()
        assert mean is not None
        for p in spec.pieces:
            p.view(rebuilt[p.base]).copy_(mean[p.name])

    # Assert: equal to the plain reference within float32 rounding, dtypes kept.
    names = sorted(template)
    ref = aggregate([([u[k].double().numpy() for k in names], n) for u, n in updates])
    for k, r in zip(names, ref, strict=True):
        assert rebuilt[k].dtype == template[k].dtype
        tol = 1e-2 if template[k].dtype == torch.float16 else 1e-6
        assert np.allclose(rebuilt[k].double().numpy(), r, atol=tol), k
