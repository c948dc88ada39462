"""`spff`: the paper's fixed scheduler, shortest path + first fit.

Every local model L_i gets its own end-to-end lightpath pair with G: the shortest path
G -> L_i (by propagation delay, or hops) for the broadcast and the same path reversed for the
upload. Each path takes the first wavelength (lowest index) that has the task's demand free on
every link of the path (wavelength continuity). Only G aggregates. The path is *fixed*: it is
computed on the whole graph, regardless of load; if no wavelength fits, the task is blocked.

References
----------
R. Wang et al., "Flexible Scheduling of Network and Computing Resources for Distributed AI
Tasks", arXiv:2407.04845 (the fixed baseline, after their ref. [15]).
"""

from __future__ import annotations

import itertools

from orchestrator.scheduling.base import Scheduler, WeightName, dijkstra, link_weight_fn, walk_back
from orchestrator.scheduling.schedule import OverlayEdge, Schedule
from orchestrator.scheduling.state import Ledger, NetworkState
from orchestrator.scheduling.tasks import Task


class SPFF(Scheduler):
    """Shortest path + first-fit wavelength, end-to-end unicast per local model."""

    name = "spff"

    def __init__(self, *, weight: WeightName = "delay") -> None:
        self.weight: WeightName = weight

    def _schedule(self, state: NetworkState, task: Task) -> Schedule:
        wfn = link_weight_fn(state, self.weight)
        adj: dict[str, list[tuple[str, float]]] = {s: [] for s in state.model.sites}
        for link in state.model.iter_links():
            adj[link.a].append((link.b, wfn(link.a, link.b)))
            adj[link.b].append((link.a, wfn(link.b, link.a)))
        g = task.global_site
        _, pred = dijkstra(adj, g, task.local_sites)
        ledger = Ledger(state)
        edges: list[OverlayEdge] = []
        for local in task.local_sites:
            down = walk_back(pred, g, local)
            for procedure, path in (("broadcast", down), ("upload", tuple(reversed(down)))):
                links = list(itertools.pairwise(path))
                w = ledger.first_fit(links, task.demand_mbps)
                if w is None:
                    return Schedule.blocked_for(
                        task,
                        self.name,
                        f"no wavelength with {task.demand_mbps:g} Mbit/s free on every link of "
                        f"{procedure} path {'-'.join(path)}",
                    )
                ledger.reserve(links, w, task.demand_mbps)
                src, dst = (g, local) if procedure == "broadcast" else (local, g)
                edges.append(OverlayEdge("broadcast" if procedure == "broadcast" else "upload", src, dst, path, w))
        return Schedule.for_task(
            task,
            self.name,
            broadcast_parent={local: g for local in task.local_sites},
            upload_parent={local: g for local in task.local_sites},
            edges=tuple(edges),
            aggregation_sites=frozenset({g}),
            reservations=ledger.reservations(),
        )
