"""What the instrument adds along a broadcast's deepest relay chain, as a share of the round: the
fidelity verdict's chain check (`orchestrator.results.fidelity`, docs/fidelity.md, "The verdict").

A hop's overhead (`orchestrator.lifecycle.fidelity`) is what the instrument adds to it beyond what
the emulated network allows: on a relay, the site server's own software time, in emulated time its
wall time / K. One hop's share is small, but a deep tree (mst's, at 8 locals 4-7 relays deep) pays
it at every relay on the way to its last leaf, while a shallow one (spff's, one hop) pays it once:
the per-hop median can stay within a chunk's time while the rounds carry a host share that favours
the shallow tree. So per round the overheads are summed along each root-to-leaf chain of its
broadcast's hops and the largest sum is taken over the round's latency; a point's figure is the
mean of that share over its rounds.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

from orchestrator.results import queries
from orchestrator.results.db import ResultsDB

#: A chain longer than this is a cycle in bad records, not a tree (NSFNET's deepest tree is 13 hops).
MAX_DEPTH = 64


def chain_overhead(hops: Mapping[str, tuple[str, float]]) -> float:
    """The largest sum of overheads along a root-to-leaf chain of one round's broadcast, from its
    hops as child -> (parent, overhead in seconds)."""
    best = 0.0
    for node in hops:
        total, depth = 0.0, 0
        while node in hops and depth < MAX_DEPTH:
            parent, over = hops[node]
            total, node, depth = total + over, parent, depth + 1
        best = max(best, total)
    return best


def chain_shares(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, int], float]:
    """Per point (scheduler, locals): the mean over its rounds of the deepest chain's overhead over
    the round's latency, from hop rows with ``scheduler``, ``n_locals``, ``task_id``, ``round``,
    ``parent``, ``child``, ``overhead_s`` and the round's ``latency_s``."""
    rounds: dict[tuple[str, int, int, int], tuple[float, dict[str, tuple[str, float]]]] = {}
    for r in rows:
        key = (r["scheduler"], int(r["n_locals"]), int(r["task_id"]), int(r["round"]))
        latency, hops = rounds.setdefault(key, (float(r["latency_s"]), {}))
        hops[r["child"]] = (r["parent"], float(r["overhead_s"]))
    shares: dict[tuple[str, int], list[float]] = {}
    for (scheduler, n_locals, _, _), (latency, hops) in rounds.items():
        if latency > 0:
            shares.setdefault((scheduler, n_locals), []).append(chain_overhead(hops) / latency)
    return {point: statistics.fmean(values) for point, values in shares.items()}


def run_chain_shares(db: ResultsDB, run_id: int) -> dict[tuple[str, int], float]:
    """`chain_shares` of the run's broadcast hops, each with its round's latency."""
    return chain_shares(queries.point_hop_chains(db.conn, run_id))
