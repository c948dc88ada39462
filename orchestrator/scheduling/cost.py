"""Analytic cost model of a schedule: reserved bandwidth and the per-round lower bound.

Definitions (DESIGN.md, "Definitions of the measured quantities"):

- Reserved bandwidth of a task: the sum over directed links of what the schedule reserves
  (`Schedule.reserved_mbps_total`).
- Lower bound of a round: the broadcast's transfer + the slowest local training + the upload's
  transfer + propagation along the deepest path. A directed link that must carry ``n`` copies
  of the model (one per overlay edge crossing it) needs at least ``n * bits / rate`` seconds.

Two bounds per procedure:

``pipelined`` (the lower bound; a pipelined tree reaches it as chunks shrink)::

    T_p = max over links l of n_p(l) * bits / rate(l)  +  max over locals of the propagation
          delay along its overlay chain from G

``store_and_forward`` (every overlay node receives the whole model before it forwards or
aggregates)::

    t(e) = max over links l of e's path of n_p(l) * bits / rate(l) + propagation(e)
    broadcast: arrival(child) = arrival(parent) + t(edge); T = max arrival
    upload:    done(node) = max over children c of done(c) + t(c -> node); T = done(G)

`rate` defaults to each link's capacity (model units); pass the emulated rates to compare with
measurements in the emulation.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from orchestrator.scheduling.schedule import DirectedLink, OverlayEdge, Procedure, Schedule
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan

RateFn = Callable[[str, str], float]


@dataclass(frozen=True)
class RoundBound:
    """Lower bounds of one round, in seconds."""

    broadcast_s: float
    train_s: float
    upload_s: float

    @property
    def total_s(self) -> float:
        return self.broadcast_s + self.train_s + self.upload_s


def capacity_rate(model: NetworkModel) -> RateFn:
    return lambda u, v: model.link(u, v).capacity_mbps


def link_copies(schedule: Schedule, procedure: Procedure) -> dict[DirectedLink, int]:
    """How many overlay edges of `procedure` cross each directed link."""
    copies: dict[DirectedLink, int] = {}
    for e in schedule.edges_of(procedure):
        for link in e.links():
            copies[link] = copies.get(link, 0) + 1
    return copies


def _edge_time_s(
    model: NetworkModel, e: OverlayEdge, copies: dict[DirectedLink, int], bits: float, rate: RateFn,
    propagation: bool,
) -> float:
    serial = max((copies[(u, v)] * bits / (rate(u, v) * 1e6) for u, v in e.links()), default=0.0)
    return serial + (model.path_delay_ms(e.path) / 1e3 if propagation else 0.0)


def procedure_bound_s(
    model: NetworkModel,
    schedule: Schedule,
    procedure: Procedure,
    model_bytes: int,
    *,
    rate: RateFn | None = None,
    pipelined: bool = True,
    propagation: bool = True,
) -> float:
    """Lower bound (s) of one procedure of a round; see the module docstring.

    `propagation=False` leaves out fiber delay (for an emulation that could not emulate it).
    """
    if schedule.blocked:
        raise ValueError(f"task {schedule.task_id} is blocked: it has no round to bound")
    rate = rate or capacity_rate(model)
    bits = model_bytes * 8.0
    copies = link_copies(schedule, procedure)
    edges = schedule.edges_of(procedure)
    if not edges:
        return 0.0
    g = schedule.global_site
    if pipelined:
        serial = max(n * bits / (rate(u, v) * 1e6) for (u, v), n in copies.items())
        # propagation along each overlay chain from G
        parent = {e.dst: e for e in edges} if procedure == "broadcast" else {e.src: e for e in edges}
        deepest = 0.0
        for node in parent:
            prop, cur = 0.0, node
            while cur != g:
                e = parent[cur]
                prop += model.path_delay_ms(e.path) / 1e3 if propagation else 0.0
                cur = e.src if procedure == "broadcast" else e.dst
            deepest = max(deepest, prop)
        return serial + deepest
    if procedure == "broadcast":
        arrival = {g: 0.0}
        pending = list(edges)
        while pending:
            progressed = False
            for e in list(pending):
                if e.src in arrival:
                    arrival[e.dst] = arrival[e.src] + _edge_time_s(model, e, copies, bits, rate, propagation)
                    pending.remove(e)
                    progressed = True
            if not progressed:
                raise ValueError(f"task {schedule.task_id}: broadcast edges do not form a tree from G")
        return max(arrival.values())
    into: dict[str, list[OverlayEdge]] = {}
    for e in edges:
        into.setdefault(e.dst, []).append(e)

    def done(node: str, depth: int = 0) -> float:
        if depth > len(edges):
            raise ValueError(f"task {schedule.task_id}: upload edges contain a cycle")
        return max(
            (done(e.src, depth + 1) + _edge_time_s(model, e, copies, bits, rate, propagation) for e in into.get(node, [])),
            default=0.0,
        )

    return done(g)


def round_lower_bound(
    model: NetworkModel,
    schedule: Schedule,
    model_bytes: int,
    *,
    train_s: float = 0.0,
    rate: RateFn | None = None,
    pipelined: bool = True,
    propagation: bool = True,
) -> RoundBound:
    """Lower bound of one round: broadcast + slowest local training + upload."""
    kw: dict[str, Any] = {"rate": rate, "pipelined": pipelined, "propagation": propagation}
    return RoundBound(
        broadcast_s=procedure_bound_s(model, schedule, "broadcast", model_bytes, **kw),
        train_s=train_s,
        upload_s=procedure_bound_s(model, schedule, "upload", model_bytes, **kw),
    )


def emulated_rate(plan: EmulationPlan) -> RateFn:
    """Link rates as shaped in the emulation (Mbit/s), for bounds comparable with measurements."""
    rates = {frozenset((ln.a, ln.b)): ln.emulated_mbps for ln in plan.links}
    return lambda u, v: rates[frozenset((u, v))]
