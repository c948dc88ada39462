"""Analytic cost model of a schedule: reserved bandwidth, the per-round lower bound, references.

Definitions (docs/metrics.md, "Definitions of the measured quantities"):

- Reserved bandwidth of a task: the sum over directed links of what the schedule reserves
  (`Schedule.reserved_mbps_total`).
- A *copy* on a directed link l: one overlay edge of procedure p whose path crosses l. The link
  must carry the whole model (``S`` bits) once per copy; ``n_p(l)`` copies cross it
  (`link_copies`). A link sends one bit at a time at ``rate(l)``; a bit then needs the link's
  propagation delay to reach the far end.

Three figures per procedure (`round_figures` gives them all, for both procedures):

``pipelined`` (the lower bound, `pipelined_bound_s`): T_p, the largest over the links l and the
copies' windows on l of rho + |J(rho, kappa)| * S / rate(l) + kappa; its definition and why it
bounds every execution are in `orchestrator.scheduling.pipelined`.

``reference`` (`reference_s`): S / the largest rate among the directed links leaving G
(broadcast) or entering G (upload): the time G's fastest access link needs for one copy of the
model. It depends on the network and G only, not on the schedule, so it compares schedulers
on the same task; it never exceeds T_p, since every schedule puts a whole copy on a link at G.

``store_and_forward`` (every overlay node receives the whole model before it forwards or
aggregates; the figure of a non-pipelined execution, never below T_p)::

    t(e) = max over links l of e's path of n_p(l) * bits / rate(l) + propagation(e)
    broadcast: arrival(child) = arrival(parent) + t(edge); T = max arrival
    upload:    done(node) = max over children c of done(c) + t(c -> node); T = done(G)

`rate` defaults to each link's capacity (model units); pass the emulated rates to compare with
measurements in the emulation.

A round's lower bound (`RoundBound.lower_s`) is the shortest local training plus the largest of
the two procedures' bounds and ``joint`` (`joint_bound_s`): the last local to hold the whole model
must still train, and no update can leave before some local has trained.

``joint`` (`joint_bound_s`, every local trains, its update uncompressed) ties the procedures
together through each local's training (`orchestrator.scheduling.pipelined`).
`RoundBound.total_s` adds broadcast, training and upload, the three phases one after the other;
it is NOT a bound, because the agents overlap them across branches (a near local uploads while a
far one still receives; measured: spff rounds at 0.96 of that sum on NSFNET).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from orchestrator.scheduling.pipelined import (
    RateFn,
    capacity_rate,
    check_not_blocked,
    joint_bound_s,
    pipelined_bound_s,
)
from orchestrator.scheduling.schedule import DirectedLink, OverlayEdge, Procedure, Schedule
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan


@dataclass(frozen=True)
class RoundBound:
    """Lower bounds of one round, in seconds."""

    broadcast_s: float
    train_s: float
    upload_s: float
    #: `joint_bound_s` (0 where it does not apply: a round in which not every local trained, or
    #: compressed updates).
    joint_s: float = 0.0

    @property
    def total_s(self) -> float:
        """The phases one after the other (not a bound when branches overlap; see the module docstring)."""
        return self.broadcast_s + self.train_s + self.upload_s

    @property
    def lower_s(self) -> float:
        """A round's lower bound when `train_s` is the shortest local training: train + the largest
        of the procedures' bounds and `joint_s`."""
        return self.train_s + max(self.broadcast_s, self.upload_s, self.joint_s)


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


def overlay_edge_s(
    model: NetworkModel, e: OverlayEdge, copies: dict[DirectedLink, int], model_bytes: int, *,
    rate: RateFn | None = None, propagation: bool = True,
) -> float:
    """Store-and-forward time (s) of one overlay edge: the model's bits through the slowest share
    of its path's links (``copies`` of its procedure on each, `link_copies`) plus its propagation
    (the ``t(e)`` of the module docstring)."""
    return _edge_time_s(model, e, copies, model_bytes * 8.0, rate or capacity_rate(model), propagation)


def reference_s(
    model: NetworkModel,
    global_site: str,
    procedure: Procedure,
    model_bytes: int,
    *,
    rate: RateFn | None = None,
) -> float:
    """Physical reference (s) of a task: one copy of the model through G's fastest access link.

    That is model bits / the largest rate among the directed links leaving `global_site`
    (broadcast) or entering it (upload). It depends on the network and G only, so it is the same
    for every scheduler, and no schedule of the task does better (see the module docstring).
    """
    rate = rate or capacity_rate(model)
    g = global_site
    rates_mbps = [rate(g, n) if procedure == "broadcast" else rate(n, g) for n in model.neighbors(g)]
    if not rates_mbps:
        raise ValueError(f"site {g!r} has no link: no reference for its tasks")
    return model_bytes * 8.0 / (max(rates_mbps) * 1e6)


@dataclass(frozen=True)
class ProcedureFigures:
    """The three figures of one procedure, in seconds (see the module docstring)."""

    pipelined_s: float
    """Lower bound over every execution of the schedule."""
    store_and_forward_s: float
    """Every overlay node holds the whole model before it forwards or aggregates."""
    reference_s: float
    """One copy through G's fastest access link: the same for every schedule of the task."""


@dataclass(frozen=True)
class RoundFigures:
    """Both procedures' figures of one round, and the training time between them (seconds)."""

    broadcast: ProcedureFigures
    upload: ProcedureFigures
    train_s: float = 0.0
    #: `joint_bound_s` (0: not computed, e.g. for compressed updates).
    joint_s: float = 0.0

    def _round(self, figure: str) -> RoundBound:
        return RoundBound(
            broadcast_s=getattr(self.broadcast, figure),
            train_s=self.train_s,
            upload_s=getattr(self.upload, figure),
        )

    @property
    def lower_bound(self) -> RoundBound:
        """The round's lower bound when every local trains (what `round_lower_bound` gives); a round
        in which some did not takes ``replace(lower_bound, joint_s=0.0)``."""
        return replace(self._round("pipelined_s"), joint_s=self.joint_s)

    @property
    def store_and_forward(self) -> RoundBound:
        return self._round("store_and_forward_s")

    @property
    def reference(self) -> RoundBound:
        return self._round("reference_s")


def procedure_figures(
    model: NetworkModel,
    schedule: Schedule,
    procedure: Procedure,
    model_bytes: int,
    *,
    rate: RateFn | None = None,
    propagation: bool = True,
) -> ProcedureFigures:
    """Pipelined lower bound, store-and-forward figure and reference of one procedure."""
    kw: dict[str, Any] = {"rate": rate, "propagation": propagation}
    return ProcedureFigures(
        pipelined_s=pipelined_bound_s(model, schedule, procedure, model_bytes, **kw),
        store_and_forward_s=store_and_forward_s(model, schedule, procedure, model_bytes, **kw),
        reference_s=reference_s(model, schedule.global_site, procedure, model_bytes, rate=rate),
    )


def round_figures(
    model: NetworkModel,
    schedule: Schedule,
    model_bytes: int,
    *,
    train_s: float = 0.0,
    rate: RateFn | None = None,
    propagation: bool = True,
    whole_updates: bool = True,
) -> RoundFigures:
    """`procedure_figures` of the broadcast and the upload of one round of `schedule`, and
    `joint_bound_s`.

    `whole_updates=False` (compressed updates, of a size the cost model does not know): the
    upload's lower bound counts propagation only and there is no joint bound, so that the lower
    bounds stay bounds; the upload's store-and-forward figure and reference still count the model.

    Raises
    ------
    ValueError
        If the schedule is blocked or a procedure's edges are not a tree from G.
    """
    kw: dict[str, Any] = {"rate": rate, "propagation": propagation}
    upload = procedure_figures(model, schedule, "upload", model_bytes, **kw)
    if not whole_updates:
        upload = replace(upload, pipelined_s=pipelined_bound_s(model, schedule, "upload", 0, **kw))
    return RoundFigures(
        broadcast=procedure_figures(model, schedule, "broadcast", model_bytes, **kw),
        upload=upload,
        train_s=train_s,
        joint_s=joint_bound_s(model, schedule, model_bytes, **kw) if whole_updates else 0.0,
    )


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
    """Figure (s) of one procedure of a round; see the module docstring.

    `pipelined=True` gives the lower bound (`pipelined_bound_s`), `pipelined=False` the
    store-and-forward figure (`store_and_forward_s`). `propagation=False` leaves out fiber delay
    (for an emulation that could not emulate it).
    """
    if pipelined:
        return pipelined_bound_s(model, schedule, procedure, model_bytes, rate=rate, propagation=propagation)
    return store_and_forward_s(model, schedule, procedure, model_bytes, rate=rate, propagation=propagation)


def store_and_forward_s(
    model: NetworkModel,
    schedule: Schedule,
    procedure: Procedure,
    model_bytes: int,
    *,
    rate: RateFn | None = None,
    propagation: bool = True,
) -> float:
    """Store-and-forward figure (s) of one procedure: every overlay node holds the whole model
    before it forwards or aggregates (see the module docstring)."""
    check_not_blocked(schedule)
    rate = rate or capacity_rate(model)
    bits = model_bytes * 8.0
    copies = link_copies(schedule, procedure)
    edges = schedule.edges_of(procedure)
    if not edges:
        return 0.0
    g = schedule.global_site
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
    """One round's procedures and `joint_bound_s` (`pipelined`), or its store-and-forward figures;
    `RoundBound.lower_s` combines them with the training time `train_s`."""
    kw: dict[str, Any] = {"rate": rate, "pipelined": pipelined, "propagation": propagation}
    return RoundBound(
        broadcast_s=procedure_bound_s(model, schedule, "broadcast", model_bytes, **kw),
        train_s=train_s,
        upload_s=procedure_bound_s(model, schedule, "upload", model_bytes, **kw),
        joint_s=joint_bound_s(model, schedule, model_bytes, rate=rate, propagation=propagation) if pipelined else 0.0,
    )


#: A full TCP segment's payload at MTU 1500 (1500 less the IP and TCP headers with timestamps), and
#: the bytes its Ethernet, IP and TCP headers add on the wire (what htb counts).
TCP_MSS = 1448
SEGMENT_HEADER_BYTES = 66
#: The share of a shaped link's rate TCP payload gets at MTU 1500: 1448 bytes of payload per
#: 1514-byte Ethernet frame.
TCP_PAYLOAD_SHARE = TCP_MSS / (TCP_MSS + SEGMENT_HEADER_BYTES)
#: Wire bytes of ACK per byte of TCP payload: a 66-byte ACK frame comes back for every two full
#: segments of 1448 bytes (Linux's delayed ACK), as on the emulated links.
ACK_WIRE_PER_PAYLOAD = 66 / (2 * 1448)


def emulated_rate(plan: EmulationPlan) -> RateFn:
    """Link rates as shaped in the emulation (Mbit/s), for bounds comparable with measurements."""
    rates = {frozenset((ln.a, ln.b)): ln.emulated_mbps for ln in plan.links}
    return lambda u, v: rates[frozenset((u, v))]
