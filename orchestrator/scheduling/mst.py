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
direction are left out. With ``weight="hops"`` every link weighs 1 (lam=kappa=0, rho=1).

The MST is grown by Prim from G over the metric closure of the terminals. Because weights may
differ by direction, the arc a->b costs the directed distance in the direction data flows
(broadcast a->b, upload b->a); with symmetric weights this is exactly the MST. Aggregation
happens at G and at every local with upload children (the "middle nodes"). Wavelengths are
assigned first-fit per tree edge, broadcast edges first.
"""

from __future__ import annotations

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
from orchestrator.scheduling.state import NetworkState
from orchestrator.scheduling.tasks import Task

MstWeight = Literal["aux", "hops"]


def prim_over_closure(
    adj: Adjacency, root: str, terminals: Sequence[str]
) -> list[tuple[str, str, tuple[str, ...]]] | str:
    """Prim's MST from `root` over the metric closure of `terminals` on directed `adj`.

    Returns the tree edges (parent, child, path parent..child) in the order they were added
    (parents first), or a message naming an unreachable terminal. Ties go to the terminal
    listed first.
    """
    order = {t: i for i, t in enumerate(terminals)}
    outside = [t for t in terminals if t != root]
    best: dict[str, tuple[float, str]] = {}
    paths: dict[tuple[str, str], tuple[str, ...]] = {}

    def relax(src: str) -> None:
        dist, pred = dijkstra(adj, src, outside)
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
        edges.append((parent, nxt, paths[(parent, nxt)]))
        outside.remove(nxt)
        if outside:
            relax(nxt)
    return edges


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
        if weight not in ("aux", "hops", "delay"):
            raise ValueError(f"unknown weight {weight!r}: use 'aux' or 'hops'")
        if not 0 <= latency_weight <= 1 or load_weight < 0 or not 0 < reuse_discount <= 1:
            raise ValueError("need 0 <= latency_weight <= 1, load_weight >= 0, 0 < reuse_discount <= 1")
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
        g, terminals = task.global_site, list(task.terminals)
        adj_b = feasible_adjacency(state, task.demand_mbps, self.aux_weight(state, set()))
        down = prim_over_closure(adj_b, g, terminals)
        if isinstance(down, str):
            return Schedule.blocked_for(task, self.name, f"broadcast: {down}")
        broadcast = [OverlayEdge("broadcast", p, c, path) for p, c, path in down]
        reused = {(v, u) for u, v in used_links(broadcast)}
        adj_u = feasible_adjacency(state, task.demand_mbps, self.aux_weight(state, reused))
        # Upload data flows child -> parent: grow from G on the reversed graph, then reverse.
        up = prim_over_closure(reverse_adjacency(adj_u), g, terminals)
        if isinstance(up, str):
            return Schedule.blocked_for(task, self.name, f"upload: {up}")
        upload = [OverlayEdge("upload", c, p, tuple(reversed(path))) for p, c, path in reversed(up)]
        return tree_schedule(name=self.name, state=state, task=task, broadcast=broadcast, upload=upload)
