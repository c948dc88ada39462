"""Stronger tree baselines the paper left to future work: `steiner` and `spt`.

Both build one physical tree rooted at G, used for the broadcast (G -> leaves) and, reversed,
for the upload. Tree nodes other than G and the locals aggregate only where they have compute
and the tree branches there; elsewhere they just switch traffic (`overlay_from_physical_tree`).

References
----------
L. Kou, G. Markowsky, L. Berman, "A fast algorithm for Steiner trees", Acta Informatica 15, 1981.
K. Mehlhorn, "A faster approximation algorithm for the Steiner problem in graphs", IPL 27, 1988.
"""

from __future__ import annotations

import itertools
from typing import Literal

import networkx as nx
from networkx.algorithms.approximation import steiner_tree

from orchestrator.scheduling.base import (
    Scheduler,
    WeightName,
    broadcast_edges_from,
    dijkstra,
    feasible_adjacency,
    link_weight_fn,
    overlay_from_physical_tree,
    tree_schedule,
    upload_edges_from,
    walk_back,
)
from orchestrator.scheduling.schedule import Schedule
from orchestrator.scheduling.state import NetworkState
from orchestrator.scheduling.tasks import Task


def _finish(name: str, state: NetworkState, task: Task, parent: dict[str, str]) -> Schedule:
    overlay = overlay_from_physical_tree(state, task, parent)
    return tree_schedule(
        name=name,
        state=state,
        task=task,
        broadcast=broadcast_edges_from(overlay),
        upload=upload_edges_from(overlay),
    )


class Steiner(Scheduler):
    """Approximate minimum Steiner tree joining G and the locals (networkx, Kou or Mehlhorn)."""

    name = "steiner"

    def __init__(self, *, weight: WeightName = "delay", method: Literal["kou", "mehlhorn"] = "kou") -> None:
        if method not in ("kou", "mehlhorn"):
            raise ValueError(f"unknown Steiner method {method!r}: use 'kou' or 'mehlhorn'")
        self.weight: WeightName = weight
        self.method = method

    def _schedule(self, state: NetworkState, task: Task) -> Schedule:
        wfn = link_weight_fn(state, self.weight)
        adj = feasible_adjacency(state, task.demand_mbps, wfn, both_directions=True)
        h = nx.Graph()
        h.add_nodes_from(state.model.sites)
        for u, nbrs in adj.items():
            for v, w in nbrs:
                h.add_edge(u, v, w=w)
        terminals = list(task.terminals)
        comp = nx.node_connected_component(h, task.global_site)
        missing = [t for t in terminals if t not in comp]
        if missing:
            return Schedule.blocked_for(
                task, self.name, f"no path with enough residual capacity in both directions to {missing[0]}"
            )
        # networkx needs a connected graph; links left out for capacity may have split it.
        tree = steiner_tree(h.subgraph(comp), terminals, weight="w", method=self.method)
        parent = {c: p for p, c in nx.bfs_edges(tree, task.global_site)}
        return _finish(self.name, state, task, parent)


class SPT(Scheduler):
    """Shortest-path tree from G (the union of shortest paths G -> L_i), aggregating at branch
    points that have compute."""

    name = "spt"

    def __init__(self, *, weight: WeightName = "delay") -> None:
        self.weight: WeightName = weight

    def _schedule(self, state: NetworkState, task: Task) -> Schedule:
        wfn = link_weight_fn(state, self.weight)
        adj = feasible_adjacency(state, task.demand_mbps, wfn, both_directions=True)
        g = task.global_site
        dist, pred = dijkstra(adj, g, task.local_sites)
        missing = [t for t in task.local_sites if t not in dist]
        if missing:
            return Schedule.blocked_for(
                task, self.name, f"no path with enough residual capacity in both directions to {missing[0]}"
            )
        parent: dict[str, str] = {}
        for local in task.local_sites:
            path = walk_back(pred, g, local)
            for p, c in itertools.pairwise(path):
                parent[c] = p
        return _finish(self.name, state, task, parent)
