"""The scheduler contract, link weights and the graph helpers every scheduler shares."""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from typing import Literal

from orchestrator.scheduling.schedule import DirectedLink, OverlayEdge, Schedule
from orchestrator.scheduling.state import EPS, Ledger, NetworkState, assign_wavelengths
from orchestrator.scheduling.tasks import Task, validate_task

WeightName = Literal["delay", "hops"]
Adjacency = dict[str, list[tuple[str, float]]]


class Scheduler(ABC):
    """Places one task's broadcast and upload trees on the network.

    Contract: `schedule(state, task)` is pure (it never changes `state`) and returns a
    `Schedule`. A task that cannot be admitted (no path or wavelength with enough residual
    capacity) gives a schedule with ``blocked=True`` and a reason; it does not raise.
    A task that is invalid for the network (unknown site, local without compute, G among
    the locals) raises `orchestrator.errors.ConfigError`.

    Subclasses implement `_schedule` and name their schedules `self.name` (a config's label
    replaces the class's `name` on the instance). Options are keyword-only ``__init__``
    parameters with annotations and defaults, checked by `orchestrator.scheduling.plugins`
    before anything starts. The invariants a schedule keeps and a worked plugin:
    docs/schedulers.md.
    """

    name: str = ""

    def schedule(self, state: NetworkState, task: Task) -> Schedule:
        """`task` placed on `state` (see the class's contract): the task checked against the
        network, then `_schedule`."""
        validate_task(state.model, task)
        return self._schedule(state, task)

    @abstractmethod
    def _schedule(self, state: NetworkState, task: Task) -> Schedule:
        """What a subclass implements: the task's trees on `state` (a valid task), as a `Schedule`,
        usually through `tree_schedule`; a blocked one when it cannot be admitted."""


def link_weight_fn(state: NetworkState, weight: WeightName) -> Callable[[str, str], float]:
    """Static link weight: ``delay`` (propagation delay in ms, floored at 1 us) or ``hops`` (1)."""
    if weight == "hops":
        return lambda u, v: 1.0
    if weight == "delay":
        return lambda u, v: max(state.model.link(u, v).delay_ms, 1e-3)
    raise ValueError(f"unknown weight {weight!r}: use 'delay' or 'hops'")


def feasible_adjacency(
    state: NetworkState,
    demand_mbps: float,
    weight: Callable[[str, str], float],
    *,
    ledger: Ledger | None = None,
    both_directions: bool = False,
) -> Adjacency:
    """Directed adjacency u -> [(v, w)] over links with at least `demand_mbps` residual in
    direction u->v (and v->u too when `both_directions`)."""
    residual = ledger.residual_mbps if ledger is not None else state.residual_mbps
    adj: Adjacency = {s: [] for s in state.model.sites}
    for link in state.model.iter_links():
        a, b = link.a, link.b
        ok_ab = residual(a, b) + EPS >= demand_mbps
        ok_ba = residual(b, a) + EPS >= demand_mbps
        if both_directions and not (ok_ab and ok_ba):
            continue
        if ok_ab:
            adj[a].append((b, weight(a, b)))
        if ok_ba:
            adj[b].append((a, weight(b, a)))
    return adj


def reverse_adjacency(adj: Adjacency) -> Adjacency:
    rev: Adjacency = {u: [] for u in adj}
    for u, nbrs in adj.items():
        for v, w in nbrs:
            rev[v].append((u, w))
    return rev


def dijkstra(
    adj: Adjacency, source: str, targets: Iterable[str] | None = None
) -> tuple[dict[str, float], dict[str, str]]:
    """Single-source shortest paths; stops once every target is settled.

    Ties are broken by the order of the adjacency lists, so results are deterministic.
    Returns (distance, predecessor) maps over the settled nodes.
    """
    remaining = set(targets) if targets is not None else None
    dist: dict[str, float] = {source: 0.0}
    pred: dict[str, str] = {}
    done: set[str] = set()
    heap: list[tuple[float, int, str]] = [(0.0, 0, source)]
    counter = 1
    while heap:
        d, _, u = heapq.heappop(heap)
        if u in done:
            continue
        done.add(u)
        if remaining is not None:
            remaining.discard(u)
            if not remaining:
                break
        for v, w in adj[u]:
            nd = d + w
            if v not in done and nd < dist.get(v, float("inf")) - 1e-12:
                dist[v] = nd
                pred[v] = u
                heapq.heappush(heap, (nd, counter, v))
                counter += 1
    settled = {n: dist[n] for n in done}
    return settled, {n: p for n, p in pred.items() if n in done}


def walk_back(pred: dict[str, str], source: str, target: str) -> tuple[str, ...]:
    """The path source..target from a predecessor map rooted at `source`."""
    path = [target]
    while path[-1] != source:
        path.append(pred[path[-1]])
    return tuple(reversed(path))


def tree_schedule(
    *,
    name: str,
    state: NetworkState,
    task: Task,
    broadcast: list[OverlayEdge],
    upload: list[OverlayEdge],
) -> Schedule:
    """Assign wavelengths (first fit) to the edges and build the `Schedule`, or a blocked one.

    `broadcast` edges run parent -> child, `upload` edges child -> parent; both lists must be
    in an order where a parent precedes its children (used for first-fit order).
    """
    ledger = Ledger(state)
    placed, reason = assign_wavelengths(ledger, [*broadcast, *upload], task.demand_mbps)
    if reason:
        return Schedule.blocked_for(task, name, reason)
    upload_parent = {e.src: e.dst for e in upload}
    aggregation = {p for p in upload_parent.values()}
    return Schedule.for_task(
        task,
        name,
        broadcast_parent={e.dst: e.src for e in broadcast},
        upload_parent=upload_parent,
        edges=tuple(placed),
        aggregation_sites=frozenset(aggregation),
        reservations=ledger.reservations(),
    )


def overlay_from_physical_tree(
    state: NetworkState, task: Task, parent: dict[str, str], *, exclude: frozenset[str] = frozenset()
) -> list[tuple[str, str, tuple[str, ...]]]:
    """Overlay edges of a physical tree rooted at G (``parent``: node -> parent node).

    Overlay nodes are G, the locals, and every other tree node that has compute, is a branch
    point (two or more children) and is not in `exclude`: those aggregate. Any other tree node
    only switches traffic.
    Returns (overlay parent, overlay child, physical path parent..child), parents first.
    """
    children: dict[str, list[str]] = {}
    for c, p in parent.items():
        children.setdefault(p, []).append(c)
    terminals = set(task.terminals)
    sites = state.model.sites
    overlay = set(terminals)
    for node, kids in children.items():
        if node not in terminals and len(kids) >= 2 and sites[node].has_compute and node not in exclude:
            overlay.add(node)
    out: list[tuple[str, str, tuple[str, ...]]] = []
    # Walk from G, remembering the last overlay ancestor and the path from it.
    stack: list[tuple[str, str, tuple[str, ...]]] = [(task.global_site, task.global_site, (task.global_site,))]
    while stack:
        node, anchor, path = stack.pop()
        for child in reversed(children.get(node, [])):
            cpath = (*path, child)
            if child in overlay:
                out.append((anchor, child, cpath))
                stack.append((child, child, (child,)))
            else:
                stack.append((child, anchor, cpath))
    return out


def upload_edges_from(overlay: list[tuple[str, str, tuple[str, ...]]]) -> list[OverlayEdge]:
    """Upload edges (child -> parent, reversed paths) for overlay edges given parent-first."""
    return [OverlayEdge("upload", c, p, tuple(reversed(path))) for p, c, path in reversed(overlay)]


def broadcast_edges_from(overlay: list[tuple[str, str, tuple[str, ...]]]) -> list[OverlayEdge]:
    return [OverlayEdge("broadcast", p, c, path) for p, c, path in overlay]


def used_links(edges: Iterable[OverlayEdge]) -> set[DirectedLink]:
    return {link for e in edges for link in e.links()}

