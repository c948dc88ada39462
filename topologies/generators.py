"""Generated topologies: rings, spine-leaf fabrics and random connected graphs.

Spec strings (for `topologies.loaders.load`): ``ring:N``, ``spine-leaf:SPINES:LEAVES``,
``random:N[:SEED]`` (a connected random geometric-like graph with about 3 links per site).
"""

from __future__ import annotations

import random

from topologies.errors import TopologyError
from topologies.model import DEFAULT_WAVELENGTH_MBPS, DEFAULT_WAVELENGTHS, NetworkModel


def ring(n: int, *, length_km: float = 100.0, wavelengths: int = DEFAULT_WAVELENGTHS,
         wavelength_mbps: float = DEFAULT_WAVELENGTH_MBPS) -> NetworkModel:
    """A ring of `n` >= 3 sites ``r1..rn``, every site with compute."""
    if n < 3:
        raise TopologyError(f"a ring needs at least 3 sites, got {n}")
    sites = [{"name": f"r{i + 1}"} for i in range(n)]
    links = [
        {"a": f"r{i + 1}", "b": f"r{(i + 1) % n + 1}", "length_km": length_km,
         "wavelengths": wavelengths, "wavelength_mbps": wavelength_mbps}
        for i in range(n)
    ]
    return NetworkModel.build(f"ring:{n}", sites, links)


def spine_leaf(spines: int, leaves: int, *, length_km: float = 1.0,
               wavelengths: int = DEFAULT_WAVELENGTHS,
               wavelength_mbps: float = DEFAULT_WAVELENGTH_MBPS) -> NetworkModel:
    """A spine-leaf fabric: every leaf ``leafJ`` (with compute) joins every spine ``spineI``
    (switching only)."""
    if spines < 1 or leaves < 2:
        raise TopologyError(f"spine-leaf needs >= 1 spine and >= 2 leaves, got {spines}:{leaves}")
    sites = [{"name": f"spine{i + 1}", "has_compute": False} for i in range(spines)]
    sites += [{"name": f"leaf{j + 1}"} for j in range(leaves)]
    links = [
        {"a": f"spine{i + 1}", "b": f"leaf{j + 1}", "length_km": length_km,
         "wavelengths": wavelengths, "wavelength_mbps": wavelength_mbps}
        for i in range(spines)
        for j in range(leaves)
    ]
    return NetworkModel.build(f"spine-leaf:{spines}:{leaves}", sites, links)


def random_connected(n: int, *, seed: int = 0, mean_degree: float = 3.0,
                     wavelengths: int = DEFAULT_WAVELENGTHS,
                     wavelength_mbps: float = DEFAULT_WAVELENGTH_MBPS) -> NetworkModel:
    """A connected random graph of `n` sites ``n1..nN`` on the plane (lengths from positions).

    A random spanning tree guarantees connectivity; extra links join near neighbours until the
    mean degree is reached. Deterministic for a given `seed`.
    """
    if n < 2:
        raise TopologyError(f"a random topology needs at least 2 sites, got {n}")
    rng = random.Random(seed)
    pos = [(rng.uniform(0, 2000), rng.uniform(0, 2000)) for _ in range(n)]

    def dist(i: int, j: int) -> float:
        return max(1.0, ((pos[i][0] - pos[j][0]) ** 2 + (pos[i][1] - pos[j][1]) ** 2) ** 0.5)

    edges: set[tuple[int, int]] = set()
    order = list(range(n))
    rng.shuffle(order)
    for k in range(1, n):
        j = order[rng.randrange(k)]
        i = order[k]
        edges.add((min(i, j), max(i, j)))
    target = int(mean_degree * n / 2)
    attempts = 0
    while len(edges) < target and attempts < 20 * n:
        attempts += 1
        i = rng.randrange(n)
        cands = rng.sample(range(n), min(n, 8))
        j = min((c for c in cands if c != i), key=lambda c: dist(i, c), default=i)
        if i != j:
            edges.add((min(i, j), max(i, j)))
    sites = [{"name": f"n{i + 1}"} for i in range(n)]
    links = [
        {"a": f"n{i + 1}", "b": f"n{j + 1}", "length_km": round(dist(i, j), 3),
         "wavelengths": wavelengths, "wavelength_mbps": wavelength_mbps}
        for i, j in sorted(edges)
    ]
    return NetworkModel.build(f"random:{n}:{seed}", sites, links)


def from_spec(spec: str) -> NetworkModel:
    """Build a generated topology from ``ring:N``, ``spine-leaf:S:L`` or ``random:N[:SEED]``."""
    kind, _, rest = spec.partition(":")
    try:
        args = [int(x) for x in rest.split(":")] if rest else []
    except ValueError:
        raise TopologyError(f"bad generator spec {spec!r}: arguments must be integers") from None
    if kind == "ring" and len(args) == 1:
        return ring(args[0])
    if kind == "spine-leaf" and len(args) == 2:
        return spine_leaf(args[0], args[1])
    if kind == "random" and len(args) in (1, 2):
        return random_connected(args[0], seed=args[1] if len(args) == 2 else 0)
    raise TopologyError(
        f"bad generator spec {spec!r}: use ring:N, spine-leaf:SPINES:LEAVES or random:N[:SEED]"
    )
