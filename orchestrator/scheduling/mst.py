"""`mst`: the paper's flexible scheduler, minimum spanning trees on auxiliary graphs.

Reading of the paper (arXiv:2407.04845, Sec. 2): "We first build auxiliary graphs for broadcast
and upload procedures, respectively. We initialize each link of the broadcast/upload graphs
according to bandwidth consumption and latency (if AI tasks pass through the link), and then
find MSTs between the global model and local models. The links of MSTs are considered as
routing paths, and the aggregation operations happen in the middle and final nodes of upload
procedure." Its example broadcast G->L1, G->L2->L3 has only G and local models as tree nodes,
so the MST spans the *terminals* (G and the locals) over the metric closure of the auxiliary
graph, and every tree edge is routed on the shortest auxiliary path between its two ends.

Auxiliary link weight, for procedure p and directed link u->v (the direction data flows in p)::

    w_p(u->v) = [lam * delay_ms(u,v) / mean_delay_ms + (1 - lam)]      latency term
              * [1 + kappa * used_mbps(u->v) / capacity_mbps(u,v)]      bandwidth consumption
              * (rho if AI traffic already crosses u->v else 1)         reuse of AI paths

with defaults lam = 0.5, kappa = 1.0, rho = 0.5. "AI traffic crosses u->v" means a reservation
of an admitted task on u->v, or, for the upload graph, the task's own broadcast tree on v->u
(the reverse fiber of a lightpath it already uses), so the upload tree tends to retrace the
broadcast tree and aggregate where it branched. Links without `demand_mbps` residual in that
direction are left out. With ``weight="hops"`` every link weighs 1 (lam=kappa=0, rho=1); the
other options then have nothing to weigh and must stay at their defaults.

The MST is grown by Prim from G over the metric closure of the terminals. Because weights may
differ by direction, the arc a->b costs the directed distance in the direction data flows
(broadcast a->b, upload b->a); with symmetric weights this is exactly the MST. Aggregation
happens at G and at every local with upload children (the "middle nodes"). Wavelengths are
assigned first-fit per tree edge, broadcast edges first.

The task's own copies count: each tree edge takes `demand_mbps` on every link of its path, on
the first wavelength free along all of it, as it joins the tree (broadcast then upload, in the
order `tree_schedule` later assigns wavelengths in, so that both agree). A link the tree has
filled leaves the graph, and a terminal whose best path it has filled is reached instead by the
cheapest lightpath left from the tree (searched per wavelength, for wavelength continuity). So
with one wavelength G-X shared by the routes to A and B, the tree becomes G->A->B (relaying at
A) instead of being blocked on G-X. A task is blocked when, at some step, no lightpath is left
from the tree to any remaining terminal.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Literal

from orchestrator.scheduling.base import (
    Adjacency,
    Scheduler,
    dijkstra,
    feasible_adjacency,
    reverse_adjacency,
    tree_schedule,
    used_links,
    walk_back,
)
from orchestrator.scheduling.schedule import DirectedLink, OverlayEdge, Schedule
from orchestrator.scheduling.state import EPS, Ledger, NetworkState
from orchestrator.scheduling.tasks import Task

MstWeight = Literal["aux", "hops"]
MST_WEIGHTS: tuple[MstWeight, ...] = ("aux", "hops")
Found = tuple[float, str, tuple[str, ...]]  # (distance, tree node, path tree node..terminal)


class SearchGraph:
    """The graph Prim searches, fixed: every path of it fits, taking one changes nothing."""

    def __init__(self, adjacency: Adjacency) -> None:
        self.adjacency = adjacency

    def fits(self, path: tuple[str, ...]) -> bool:
        """Whether the tree can still add an edge along `path`."""
        return True

    def take(self, path: tuple[str, ...]) -> None:
        """Record that the tree now has an edge along `path`."""

    def cheapest_lightpath(self, tree: Sequence[str], terminal: str) -> Found | None:
        """The cheapest path that fits from a node of `tree` to `terminal`, or None."""
        return None


class OwnCopiesGraph(SearchGraph):
    """The links one task's tree can still use, as its own edges take capacity on a `Ledger`.

    `reverse=True` searches the reversed graph (the upload grows from G against the data flow):
    a path a..b found there carries data b..a.
    """

    def __init__(
        self,
        state: NetworkState,
        ledger: Ledger,
        demand_mbps: float,
        weight: Callable[[str, str], float],
        *,
        reverse: bool = False,
    ) -> None:
        self.state, self.ledger, self.demand_mbps = state, ledger, demand_mbps
        self.weight, self.reverse = weight, reverse
        super().__init__(self._graph(None))

    def _graph(self, wavelength: int | None) -> Adjacency:
        """Links with `demand_mbps` left in all (None) or on one `wavelength`, as searched."""
        if wavelength is None:
            adj = feasible_adjacency(self.state, self.demand_mbps, self.weight, ledger=self.ledger)
        else:
            adj = {s: [] for s in self.state.model.sites}
            for link in self.state.model.iter_links():
                for u, v in ((link.a, link.b), (link.b, link.a)):
                    if self.ledger.fits([(u, v)], wavelength, self.demand_mbps):
                        adj[u].append((v, self.weight(u, v)))
        return reverse_adjacency(adj) if self.reverse else adj

    def _links(self, path: tuple[str, ...]) -> list[DirectedLink]:
        return list(itertools.pairwise(reversed(path) if self.reverse else path))

    def fits(self, path: tuple[str, ...]) -> bool:
        return self.ledger.first_fit(self._links(path), self.demand_mbps) is not None

    def take(self, path: tuple[str, ...]) -> None:
        links = self._links(path)
        w = self.ledger.first_fit(links, self.demand_mbps)
        if w is None:
            raise ValueError(f"no wavelength left along {'-'.join(path)}: check `fits` first")
        self.ledger.reserve(links, w, self.demand_mbps)
        # Only a link this edge has just filled can leave the graph: rebuild only then.
        if any(self.ledger.residual_mbps(u, v) + EPS < self.demand_mbps for u, v in links):
            self.adjacency = self._graph(None)

    def cheapest_lightpath(self, tree: Sequence[str], terminal: str) -> Found | None:
        """Per wavelength, the cheapest path from the tree with it free on every link; the
        cheapest of those (ties go to the lower wavelength, then the earlier tree node)."""
        best: Found | None = None
        for w in range(max(link.wavelengths for link in self.state.model.iter_links())):
            # From the terminal on the reversed search graph: one search reaches every tree node.
            dist, pred = dijkstra(reverse_adjacency(self._graph(w)), terminal, tree)
            for node in tree:
                if node in dist and (best is None or dist[node] < best[0] - 1e-12):
                    best = (dist[node], node, tuple(reversed(walk_back(pred, terminal, node))))
        return best


def prim_over_closure(
    graph: Adjacency | SearchGraph, root: str, terminals: Sequence[str]
) -> list[tuple[str, str, tuple[str, ...]]] | str:
    """Prim's MST from `root` over the metric closure of `terminals` on a directed graph.

    `graph` is a fixed adjacency, or a `SearchGraph` that the tree's own edges change as they
    are added (`OwnCopiesGraph`): a picked path that no longer fits is replaced by the cheapest
    one left from the tree, and the terminal re-ranked.

    Returns the tree edges (parent, child, path parent..child) in the order they were added
    (parents first), or a message naming an unreachable terminal. Ties go to the terminal
    listed first.
    """
    search = graph if isinstance(graph, SearchGraph) else SearchGraph(graph)
    order = {t: i for i, t in enumerate(terminals)}
    outside = [t for t in terminals if t != root]
    tree = [root]
    best: dict[str, tuple[float, str]] = {}
    paths: dict[tuple[str, str], tuple[str, ...]] = {}

    def relax(src: str) -> None:
        dist, pred = dijkstra(search.adjacency, src, outside)
        for t in outside:
            if t in dist and (t not in best or dist[t] < best[t][0] - 1e-12):
                best[t] = (dist[t], src)
                paths[(src, t)] = walk_back(pred, src, t)

    relax(root)
    edges = []
    while outside:
        reachable = [t for t in outside if t in best]
        if not reachable:
            return f"no path with enough residual capacity from the tree to {outside[0]}"
        nxt = min(reachable, key=lambda t: (best[t][0], order[t]))
        parent = best[nxt][1]
        path = paths[(parent, nxt)]
        if not search.fits(path):
            # The tree's own edges filled this path since it was found. A path that fits now
            # costs at least as much (the graph only shrank), so re-rank the terminal with it.
            found = search.cheapest_lightpath(tree, nxt)
            if found is None:
                del best[nxt]  # a node that joins later may still reach it
            else:
                best[nxt] = found[:2]
                paths[found[1], nxt] = found[2]
            continue
        edges.append((parent, nxt, path))
        search.take(path)
        tree.append(nxt)
        outside.remove(nxt)
        if outside:
            relax(nxt)
    return edges


def _check_number(name: str, value: object, allowed: str, ok: Callable[[float], bool]) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not ok(value):
        raise ValueError(f"mst option {name} must be a number with {allowed}, got {value!r}")


class MST(Scheduler):
    """MST over auxiliary broadcast/upload graphs (see the module docstring for the weights)."""

    name = "mst"

    def __init__(
        self,
        *,
        weight: MstWeight = "aux",
        latency_weight: float = 0.5,
        load_weight: float = 1.0,
        reuse_discount: float = 0.5,
    ) -> None:
        """Check and keep the options (what they weigh: the module docstring).

        Raises
        ------
        ValueError
            If `weight` is not one of `MST_WEIGHTS`, an option is not a number in its range, or
            ``weight="hops"`` comes with other options (it would ignore them).
        """
        if weight not in MST_WEIGHTS:
            # mst has no "delay" weight of its own: "aux" already mixes delay and load.
            raise ValueError(
                f"unknown weight {weight!r} for mst: use one of {', '.join(map(repr, MST_WEIGHTS))} "
                "(latency_weight sets how much delay counts in 'aux')"
            )
        _check_number("latency_weight", latency_weight, "0 <= latency_weight <= 1", lambda x: 0 <= x <= 1)
        _check_number("load_weight", load_weight, "load_weight >= 0", lambda x: x >= 0)
        _check_number("reuse_discount", reuse_discount, "0 < reuse_discount <= 1", lambda x: 0 < x <= 1)
        given = (latency_weight, load_weight, reuse_discount)
        if weight == "hops" and given != (0.5, 1.0, 0.5):
            raise ValueError(
                "weight 'hops' weighs every link 1 and ignores latency_weight, load_weight and "
                "reuse_discount: leave them out, or use weight 'aux'"
            )
        self.weight = weight
        self.lam, self.kappa, self.rho = latency_weight, load_weight, reuse_discount
        if weight == "hops":
            self.lam, self.kappa, self.rho = 0.0, 0.0, 1.0

    def aux_weight(self, state: NetworkState, reused: set[DirectedLink]) -> Callable[[str, str], float]:
        """The auxiliary weight function w_p for one procedure (see the module docstring)."""
        delays = [ln.delay_ms for ln in state.model.iter_links()]
        mean_delay = (sum(delays) / len(delays)) if delays and sum(delays) > 0 else 1.0
        lam, kappa, rho = self.lam, self.kappa, self.rho

        def w(u: str, v: str) -> float:
            link = state.model.link(u, v)
            latency = lam * link.delay_ms / mean_delay + (1 - lam)
            load = 1 + kappa * state.used_mbps(u, v) / link.capacity_mbps
            reuse = rho if (state.ai_mbps(u, v) > 0 or (u, v) in reused) else 1.0
            return max(latency * load * reuse, 1e-9)

        return w

    def _schedule(self, state: NetworkState, task: Task) -> Schedule:
        g, terminals, demand = task.global_site, list(task.terminals), task.demand_mbps
        # One ledger for both trees: the upload sees what the broadcast has taken.
        ledger = Ledger(state)
        down = prim_over_closure(OwnCopiesGraph(state, ledger, demand, self.aux_weight(state, set())), g, terminals)
        if isinstance(down, str):
            return Schedule.blocked_for(task, self.name, f"broadcast: {down}")
        broadcast = [OverlayEdge("broadcast", p, c, path) for p, c, path in down]
        reused = {(v, u) for u, v in used_links(broadcast)}
        # Upload data flows child -> parent: grow from G on the reversed graph, then reverse.
        graph_u = OwnCopiesGraph(state, ledger, demand, self.aux_weight(state, reused), reverse=True)
        up = prim_over_closure(graph_u, g, terminals)
        if isinstance(up, str):
            return Schedule.blocked_for(task, self.name, f"upload: {up}")
        # In the order the tree took them, so that tree_schedule's first fit picks the same
        # wavelengths as the ledger above (and therefore finds them free).
        upload = [OverlayEdge("upload", c, p, tuple(reversed(path))) for p, c, path in up]
        return tree_schedule(name=self.name, state=state, task=task, broadcast=broadcast, upload=upload)
