"""A scheduler plugin: the widest-path tree (docs/schedulers.md walks through it).

Every local model is reached from G on a path of the largest bottleneck residual capacity: the
path whose least free link (free in both directions, since the upload retraces the broadcast) has
the most Mbit/s left. Where the network is loaded this steers the task around the busy links that
a shortest-path tree would cross, at the price of longer paths. The paths from G form one tree
(the predecessor map of a maximin Dijkstra); among equally wide paths the search settles the
shorter one (by delay or hops) first, which is a tie-break, not a guarantee of the shortest.
The tree carries the broadcast and, reversed, the upload; tree nodes with compute where the tree
branches aggregate, like `spt` and `steiner` (`overlay_from_physical_tree`).

Use it without editing the project::

    netai compare --schedulers mst,examples/schedulers/widest_path.py:WidestPath
    netai schedule --scheduler examples/schedulers/widest_path.py:WidestPath --locals 4

or in an experiment config (a path relative to the config's folder), with options::

    schedulers:
      - {name: widest, spec: ../examples/schedulers/widest_path.py:WidestPath,
         options: {tie_break: hops, headroom_mbps: 500}}
"""

from __future__ import annotations

import heapq
import itertools
from typing import Literal

from orchestrator.scheduling.base import (
    Scheduler,
    broadcast_edges_from,
    link_weight_fn,
    overlay_from_physical_tree,
    tree_schedule,
    upload_edges_from,
    walk_back,
)
from orchestrator.scheduling.schedule import Schedule
from orchestrator.scheduling.state import EPS, NetworkState
from orchestrator.scheduling.tasks import Task


class WidestPath(Scheduler):
    """Widest-path (maximum bottleneck residual capacity) tree from G, aggregating at branch points
    that have compute.

    Options (keyword-only, annotated: the resolver checks names and types before anything runs):

    tie_break
        Among equally wide paths, prefer the shorter by ``delay`` (propagation) or by ``hops``.
    headroom_mbps
        Mbit/s a link must keep free beyond the task's demand to be used at all (both directions).
    """

    name = "widest"

    def __init__(self, *, tie_break: Literal["delay", "hops"] = "delay", headroom_mbps: float = 0.0) -> None:
        if headroom_mbps < 0:
            raise ValueError(f"headroom_mbps must be >= 0, got {headroom_mbps!r}")
        self.tie_break: Literal["delay", "hops"] = tie_break
        self.headroom_mbps = float(headroom_mbps)

    def _schedule(self, state: NetworkState, task: Task) -> Schedule:
        need = task.demand_mbps + self.headroom_mbps
        length = link_weight_fn(state, self.tie_break)
        # Free capacity of each usable link, the lesser of its two directions.
        adj: dict[str, list[tuple[str, float, float]]] = {s: [] for s in state.model.sites}
        for link in state.model.iter_links():
            free = min(state.residual_mbps(link.a, link.b), state.residual_mbps(link.b, link.a))
            if free + EPS >= need:
                adj[link.a].append((link.b, free, length(link.a, link.b)))
                adj[link.b].append((link.a, free, length(link.b, link.a)))
        g = task.global_site
        width, pred = self._widest(adj, g)
        missing = [t for t in task.local_sites if t not in width]
        if missing:
            return Schedule.blocked_for(
                task, self.name,
                f"no path with {need:g} Mbit/s free in both directions from {g} to {missing[0]}",
            )
        parent: dict[str, str] = {}
        for local in task.local_sites:
            for p, c in itertools.pairwise(walk_back(pred, g, local)):
                parent[c] = p
        overlay = overlay_from_physical_tree(state, task, parent)
        return tree_schedule(name=self.name, state=state, task=task,
                             broadcast=broadcast_edges_from(overlay), upload=upload_edges_from(overlay))

    @staticmethod
    def _widest(
        adj: dict[str, list[tuple[str, float, float]]], source: str
    ) -> tuple[dict[str, float], dict[str, str]]:
        """Maximin Dijkstra from `source`: (bottleneck of the settled path, predecessor) per node
        reached. The heap key is (-bottleneck, length, insertion order): deterministic."""
        width: dict[str, float] = {}
        best: dict[str, tuple[float, float]] = {source: (-float("inf"), 0.0)}
        pred: dict[str, str] = {}
        counter = itertools.count()
        heap: list[tuple[float, float, int, str]] = [(-float("inf"), 0.0, next(counter), source)]
        while heap:
            neg_w, dist, _, u = heapq.heappop(heap)
            if u in width:
                continue
            width[u] = -neg_w
            for v, free, w in adj[u]:
                if v in width:
                    continue
                key = (-min(-neg_w, free), dist + w)
                if key < best.get(v, (0.0, float("inf"))):
                    best[v] = key
                    pred[v] = u
                    heapq.heappush(heap, (key[0], key[1], next(counter), v))
        return width, pred
