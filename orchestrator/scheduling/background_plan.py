"""The background traffic's plan (pure): which flows, at what rates, on which paths, with which
on/off periods. The emulation runs it with iperf3 (`orchestrator.emulation.background`), the
flow-level simulation replays it in simulated time (`orchestrator.simulation.background`): one plan,
two engines.

`plan_background` picks the flows: the `pairs` largest entries of the topology's demand matrix
(TopoHub ships one for SNDlib networks; otherwise all pairs weigh the same), or seeded random
pairs for the ``constant`` and ``poisson`` patterns; it scales the rates so that the most loaded
directed link (routes by shortest delay, like the controller's background routes) carries `load`
times its emulated rate. ``poisson`` flows alternate exponential on and off periods
(`on_off_periods`, flow i seeded ``seed + i``, `ON_OFF_PERIODS` of them).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.scheduling.base import dijkstra, walk_back
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan

IPERF_BASE_PORT = 5201
#: On/off periods drawn per ``poisson`` flow (the flow stays off after the last one).
ON_OFF_PERIODS = 10_000


@dataclass(frozen=True)
class BackgroundConfig:
    """The background load of an experiment (the ``background:`` section of its config)."""

    enabled: bool = True
    pattern: str = "demand-matrix"
    load: float = 0.3
    pairs: int = 6
    mean_on_s: float = 2.0
    mean_off_s: float = 2.0


@dataclass(frozen=True)
class BackgroundFlow:
    """One background flow: `src` sends to `dst` at `rate_mbps` (emulated Mbit/s)."""

    src: str
    dst: str
    rate_mbps: float
    port: int
    path: tuple[str, ...]


def demand_matrix(topology: str, model: NetworkModel) -> dict[tuple[str, str], float]:
    """Demands between compute sites: TopoHub's matrix when the topology has one, else 1 each."""
    hosts = model.compute_sites
    demands: dict[tuple[str, str], float] = {}
    if "/" in topology and not Path(topology).exists():
        try:
            import topohub

            raw = topohub.get(topology, use_names=True)["graph"].get("demands", {})
        except (KeyError, OSError, RuntimeError):
            raw = {}
        for src, row in raw.items():
            for dst, value in row.items():
                if src in model.sites and dst in model.sites and src in hosts and dst in hosts and src != dst:
                    demands[(str(src), str(dst))] = float(value)
    if not demands:
        demands = {(a, b): 1.0 for a in hosts for b in hosts if a != b}
    return demands


def _routes(model: NetworkModel) -> dict[str, list[tuple[str, float]]]:
    adj: dict[str, list[tuple[str, float]]] = {s: [] for s in model.sites}
    for ln in model.iter_links():
        w = max(ln.delay_ms, 1e-3)
        adj[ln.a].append((ln.b, w))
        adj[ln.b].append((ln.a, w))
    return adj


def plan_background(
    model: NetworkModel, plan: EmulationPlan, cfg: BackgroundConfig, *, topology: str, seed: int
) -> list[BackgroundFlow]:
    """Choose and scale the background flows (see the module docstring).

    Raises
    ------
    ConfigError
        If the topology has fewer than two compute sites.
    """
    if len(model.compute_sites) < 2:
        raise ConfigError("background traffic needs at least two sites with compute (hosts)")
    demands = demand_matrix(topology, model)
    rng = random.Random(seed)
    pairs = sorted(demands)
    rng.shuffle(pairs)
    if cfg.pattern == "demand-matrix":
        pairs.sort(key=lambda p: -demands[p])  # stable: ties keep the seeded order
        weights = [demands[p] for p in pairs[: cfg.pairs]]
    else:
        weights = [1.0] * min(cfg.pairs, len(pairs))
    chosen = pairs[: len(weights)]
    adj = _routes(model)
    paths = []
    for src, dst in chosen:
        _, pred = dijkstra(adj, src, [dst])
        paths.append(walk_back(pred, src, dst))
    rate_of = {frozenset((ln.a, ln.b)): ln.emulated_mbps for ln in plan.links}
    load: dict[tuple[str, str], float] = {}
    for w, path in zip(weights, paths, strict=True):
        for u, v in itertools.pairwise(path):
            load[(u, v)] = load.get((u, v), 0.0) + w
    peak = max(load[(u, v)] / rate_of[frozenset((u, v))] for u, v in load) if load else 1.0
    scale = cfg.load / peak if peak > 0 else 0.0
    return [
        BackgroundFlow(src=s, dst=d, rate_mbps=w * scale, port=IPERF_BASE_PORT + i, path=path)
        for i, ((s, d), w, path) in enumerate(zip(chosen, weights, paths, strict=True))
    ]


def on_off_periods(cfg: BackgroundConfig, seed: int, count: int) -> list[tuple[float, float]]:
    """`count` (on_s, off_s) periods drawn from exponentials with the configured means."""
    rng = random.Random(seed)
    return [(rng.expovariate(1 / cfg.mean_on_s), rng.expovariate(1 / cfg.mean_off_s)) for _ in range(count)]
