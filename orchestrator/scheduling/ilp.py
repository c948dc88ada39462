"""`Optimum`: the minimum-bandwidth broadcast and upload trees of one task, exactly (an ILP, HiGHS).

The heuristics (`spff`, `mst`, `steiner`, `spt`) are judged against this. It answers on small
instances (docs/optimum.md) and is not one of the default `SCHEDULERS` (an ILP per task would slow
every default comparison); ``get_scheduler("optimum", ...)`` builds it.

What a schedule can express fixes the model. A copy of the model is an overlay edge: a path from
one compute site to another. Only compute sites (G, the locals, relays with compute) replicate the
broadcast or aggregate the upload; a site without compute only switches, so two copies through it
stay two copies on every link they share. The reserved bandwidth of a schedule is the task's demand
times the number of (copy, directed link) pairs (`Schedule.reserved_mbps_total`, what every
heuristic reports).

Formulation (one for each procedure p, broadcast and upload, tied by the links' capacity)::

    candidates c  = simple paths s..t between compute sites s != t whose inner sites have no
                    compute (in an all-compute network: the links), t != G
    y[p,c] in {0,1}   the tree has the overlay edge c (oriented parent s -> child t; the upload's
                      copy runs t..s, over the reversed links)
    f[p,k,c] >= 0     flow of commodity k (one unit from G to local k) on c, f[p,k,c] <= y[p,c]
    flow conservation of each commodity at every compute site
    sum of y[p,c] into each site <= 1          (one parent: the support is a tree)
    for each directed link (u,v): copies of both procedures on it <= cap(u,v)
    minimise  demand * sum y[p,c] * hops(c)   (+ a term < 1 hop: the paths' total delay)

`cap(u,v)` is how many more copies of `demand` the link takes as the other schedulers see it:
the smaller of residual Mbit/s / demand (background load included) and the copies its
wavelengths' residuals take one by one. Wavelength continuity: a candidate of two or more links
(through switches) has a binary per wavelength, one of them taken when it is used, and no more of
them on a (link, wavelength) than that wavelength's residual takes; a one-link copy takes any
wavelength with room, which the per-link count covers. A copy of any schedule shows up in this
model (a path through compute sites splits there into candidates, with the same hops and the
same wavelength), so the ILP's optimum is never above what a heuristic reserves. The solution's
edges get wavelengths first fit, like the heuristics' edges, else by a small exact assignment
ILP (the solution has one). A relay with one child is joined into one edge when a wavelength
is free along the joined path, else kept as a relay.

Latency (`max_latency_ms`): every local's overlay chain from G (broadcast) and to G (upload) has
at most that much propagation delay (`chain_latency_ms`). With one parent per site, the unit flow
of commodity k runs along k's chain, so ``sum f[p,k,c] * delay(c) <= bound`` is exact and linear.
This is the propagation part of `orchestrator.scheduling.cost`'s pipelined bound (the part a
schedule's route decides; the serialisation part depends on the copies per link); `pareto_front`
sweeps the bound and reports the cost model's pipelined round bound of each point too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from orchestrator.scheduling.base import Scheduler
from orchestrator.scheduling.cost import round_lower_bound
from orchestrator.scheduling.ilp_model import OptimumResult, TaskModel
from orchestrator.scheduling.schedule import Schedule
from orchestrator.scheduling.state import EPS, NetworkState
from orchestrator.scheduling.tasks import Task

#: How far under the last point's latency the next bound of `pareto_front` is (ms): well above
#: HiGHS's feasibility tolerance, far below any link's delay.
LATENCY_STEP_MS = 1e-3


@dataclass(frozen=True)
class FrontPoint:
    """One point of a task's Pareto front of reserved bandwidth against latency."""

    latency_ms: float
    """`chain_latency_ms` of the point's schedule (at most the bound it was solved with)."""
    reserved_mbps: float
    proven_optimal: bool
    lower_bound_ms: float
    """`cost.round_lower_bound(...).lower_s` of the schedule (no training), in ms."""
    schedule: Schedule = field(repr=False, compare=False)


def chain_latency_ms(state_or_model: Any, schedule: Schedule) -> float:
    """Largest propagation delay (ms) along a local's overlay chain, over both procedures:
    G ..> local through the broadcast tree, local ..> G through the upload tree."""
    model = getattr(state_or_model, "model", state_or_model)
    if schedule.blocked:
        raise ValueError(f"task {schedule.task_id} is blocked: it has no latency")
    worst = 0.0
    for procedure in ("broadcast", "upload"):
        parent = schedule.broadcast_parent if procedure == "broadcast" else schedule.upload_parent
        delay = {}
        for e in schedule.edges:
            if e.procedure == procedure:
                child = e.dst if procedure == "broadcast" else e.src
                delay[child] = model.path_delay_ms(e.path)
        for local in schedule.local_sites:
            total, node, steps = 0.0, local, 0
            while node != schedule.global_site:
                total += delay[node]
                node = parent[node]
                steps += 1
                if steps > len(parent):
                    raise ValueError(f"task {schedule.task_id}: {procedure} tree has a cycle")
            worst = max(worst, total)
    return worst


def _check_options(time_limit_s: float, mip_gap: float) -> None:
    for what, value in (("time_limit_s", time_limit_s), ("mip_gap", mip_gap)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    if time_limit_s <= 0:
        raise ValueError(f"time_limit_s must be positive, got {time_limit_s!r}")


def solve_optimum(
    state: NetworkState,
    task: Task,
    *,
    time_limit_s: float = 60.0,
    mip_gap: float = 0.0,
    max_latency_ms: float | None = None,
    name: str = "optimum",
) -> OptimumResult:
    """Solve the ILP of the module docstring for `task` on `state` (which it does not change).

    Raises
    ------
    orchestrator.errors.ConfigError
        If the task is invalid for the network.
    ValueError
        If an option is out of range, or the network has too many candidate paths.
    """
    from orchestrator.scheduling.tasks import validate_task

    _check_options(time_limit_s, mip_gap)
    if max_latency_ms is not None and not (math.isfinite(max_latency_ms) and max_latency_ms >= 0):
        raise ValueError(f"max_latency_ms must be a finite number >= 0, got {max_latency_ms!r}")
    validate_task(state.model, task)
    return TaskModel(state, task, time_limit_s=time_limit_s, mip_gap=mip_gap).solve(name, max_latency_ms)


def pareto_front(
    state: NetworkState,
    task: Task,
    *,
    time_limit_s: float = 60.0,
    mip_gap: float = 0.0,
    max_points: int = 50,
) -> list[FrontPoint]:
    """The task's Pareto front of reserved bandwidth against `chain_latency_ms`, by sweeping the
    latency bound: solve without one, then again and again just under the last point's latency,
    until the bound cannot be met (each bound `LATENCY_STEP_MS` under the last latency). Points come from the least bandwidth to the least latency; a
    point whose bandwidth is no lower than a faster point's is left out. Each point's
    `proven_optimal` says whether its solve closed the gap (if not, the front may be above the
    true one there).
    """
    from orchestrator.scheduling.tasks import validate_task

    _check_options(time_limit_s, mip_gap)
    validate_task(state.model, task)
    ilp = TaskModel(state, task, time_limit_s=time_limit_s, mip_gap=mip_gap)
    points: list[FrontPoint] = []
    bound: float | None = None
    for _ in range(max_points):
        result = ilp.solve("optimum", bound)
        s = result.schedule
        if s.blocked:
            break
        latency = chain_latency_ms(state, s)
        lower = round_lower_bound(state.model, s, task.model_bytes).lower_s * 1e3
        point = FrontPoint(latency, s.reserved_mbps_total, result.proven_optimal, lower, s)
        while points and points[-1].reserved_mbps >= point.reserved_mbps - EPS:
            points.pop()
        points.append(point)
        if bound is not None and latency > bound + LATENCY_STEP_MS:
            break  # the solver did not honour the bound (tolerances): stop rather than loop
        bound = latency - LATENCY_STEP_MS
        if bound < 0:
            break
    return points


def front_bandwidth_at(front: list[FrontPoint], latency_ms: float) -> float | None:
    """The least reserved bandwidth on `front` with latency at most `latency_ms`, or None."""
    fits = [p.reserved_mbps for p in front if p.latency_ms <= latency_ms + 1e-9]
    return min(fits) if fits else None


class Optimum(Scheduler):
    """The exact minimum-bandwidth trees (ILP by HiGHS; see the module docstring).

    Options: `time_limit_s` (HiGHS's wall-time limit per solve; building the model comes on top,
    well under a second on NSFNET, over a minute at 1000 sites and 100 locals), `mip_gap` (relative gap at which
    HiGHS stops; 0 proves the optimum), `max_latency_ms` (bound on every local's chain latency,
    None for none). `last` holds the `OptimumResult` of the latest `schedule` call, which says
    whether optimality was proven.
    """

    name = "optimum"

    def __init__(self, *, time_limit_s: float = 60.0, mip_gap: float = 0.0,
                 max_latency_ms: float | None = None) -> None:
        _check_options(time_limit_s, mip_gap)
        if max_latency_ms is not None and (
            isinstance(max_latency_ms, bool) or not isinstance(max_latency_ms, (int, float))
            or not math.isfinite(max_latency_ms) or max_latency_ms < 0
        ):
            raise ValueError(f"max_latency_ms must be a finite number >= 0, got {max_latency_ms!r}")
        self.time_limit_s = float(time_limit_s)
        self.mip_gap = float(mip_gap)
        self.max_latency_ms = max_latency_ms
        self.last: OptimumResult | None = None

    def _schedule(self, state: NetworkState, task: Task) -> Schedule:
        model = TaskModel(state, task, time_limit_s=self.time_limit_s, mip_gap=self.mip_gap)
        self.last = model.solve(self.name, self.max_latency_ms)
        return self.last.schedule
