"""Fewest-hops paths between the sites of an `EmulationPlan`: the background's routes and the
best-effort trees of `controller.flows`.

Breadth-first searches of the project's own, which give the paths networkx's ``shortest_path``
gives on the plan's graph (its switches' sites, then its links), ties broken alike
(`tests/unit/test_controller_flows.py` compares them pair by pair on the bundled topologies). The
controller, started with every emulation, then imports neither networkx nor the network model,
which it never uses (docs/testing.md, "The set-up", has what that saves).
"""

from __future__ import annotations

from collections.abc import Mapping

from topologies.plan import EmulationPlan


class NoPath(ValueError):
    """No path between two sites: one of them is not in the plan, or no links join them."""


def site_neighbours(plan: EmulationPlan) -> dict[str, dict[str, None]]:
    """Each site's neighbours, in the order a graph built from the plan's switches, then its links,
    lists them (the order its breadth-first searches break ties by)."""
    adj: dict[str, dict[str, None]] = {sw.site: {} for sw in plan.switches}
    for ln in plan.links:
        adj.setdefault(ln.a, {})[ln.b] = None
        adj.setdefault(ln.b, {})[ln.a] = None
    return adj


def shortest_path(plan: EmulationPlan, a: str, b: str) -> list[str]:
    """A fewest-hops path from site `a` to site `b` (deterministic for a given plan): a breadth-first
    search from both ends at once, each step widening the smaller frontier, as networkx's
    ``bidirectional_shortest_path`` does.

    Raises
    ------
    NoPath
        If the plan has no such site, or no links join them.
    """
    adj = site_neighbours(plan)
    for end in (a, b):
        if end not in adj:
            raise NoPath(f"no site {end!r} in the plan")
    pred: dict[str, str | None] = {a: None}
    succ: dict[str, str | None] = {b: None}
    met = a if a == b else _meet(adj, pred, succ, [a], [b])
    if met is None:
        raise NoPath("no link joins them")
    path: list[str] = []
    at: str | None = met
    while at is not None:
        path.append(at)
        at = pred[at]
    path.reverse()
    at = succ[path[-1]]
    while at is not None:
        path.append(at)
        at = succ[at]
    return path


def _meet(adj: Mapping[str, Mapping[str, None]], pred: dict[str, str | None], succ: dict[str, str | None],
          forward: list[str], reverse: list[str]) -> str | None:
    """Widen the smaller of the two frontiers a level at a time (`pred` and `succ` record where each
    site was reached from) until a site is reached from both ends; None if they never meet."""
    while forward and reverse:
        if len(forward) <= len(reverse):
            level, forward = forward, []
            for v in level:
                for w in adj[v]:
                    if w not in pred:
                        forward.append(w)
                        pred[w] = v
                    if w in succ:
                        return w
        else:
            level, reverse = reverse, []
            for v in level:
                for w in adj[v]:
                    if w not in succ:
                        succ[w] = v
                        reverse.append(w)
                    if w in pred:
                        return w
    return None


def next_hops_towards(plan: EmulationPlan, site: str, *,
                      neighbours: Mapping[str, Mapping[str, None]] | None = None) -> dict[str, str | None]:
    """For every site that reaches `site`, its next hop on a fewest-hops path there (None for `site`
    itself): the breadth-first tree rooted at `site`, each site's parent the first to reach it.
    `neighbours`: `site_neighbours` of `plan`, for a caller that asks of many sites (None: built here)."""
    adj = site_neighbours(plan) if neighbours is None else neighbours
    parent: dict[str, str | None] = {site: None}
    level = [site]
    while level:
        below: list[str] = []
        for v in level:
            for w in adj[v]:
                if w not in parent:
                    parent[w] = v
                    below.append(w)
        level = below
    return parent
