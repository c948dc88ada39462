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

import itertools
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from orchestrator.scheduling.base import Scheduler, tree_schedule
from orchestrator.scheduling.cost import round_lower_bound
from orchestrator.scheduling.schedule import DirectedLink, OverlayEdge, Procedure, Schedule
from orchestrator.scheduling.state import EPS, Ledger, NetworkState
from orchestrator.scheduling.tasks import Task

#: How far under the last point's latency the next bound of `pareto_front` is (ms): well above
#: HiGHS's feasibility tolerance, far below any link's delay.
LATENCY_STEP_MS = 1e-3

#: Refuse instances with more candidate paths than this (a network with large switch-only regions).
MAX_CANDIDATES = 20_000


class CandidateLimit(ValueError):
    """The network has too many switch-only paths between compute sites for the ILP."""


@dataclass(frozen=True)
class OptimumResult:
    """What one ILP solve gave.

    Attributes
    ----------
    schedule
        The schedule (blocked, with the reason, if none was found).
    status
        HiGHS's model status, e.g. ``"Optimal"``, ``"Infeasible"``, ``"Time limit reached"``.
    proven_optimal
        The schedule's bandwidth is the optimum within `mip_gap` (HiGHS closed the gap).
    objective_mbps
        Reserved bandwidth of the ILP's solution (Mbit/s), or None.
    bound_mbps
        HiGHS's lower bound on the optimum (Mbit/s), or None.
    solve_s
        Wall time of the solve, seconds.
    max_latency_ms
        The latency bound the solve had, or None.
    """

    schedule: Schedule
    status: str
    proven_optimal: bool
    objective_mbps: float | None
    bound_mbps: float | None
    solve_s: float
    max_latency_ms: float | None = None
    variables: int = 0
    constraints: int = 0


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


@dataclass(frozen=True)
class _Candidate:
    path: tuple[str, ...]  # parent (compute) .. child (compute), inner sites without compute
    delay_ms: float

    @property
    def hops(self) -> int:
        return len(self.path) - 1

    def links(self, procedure: Procedure) -> list[DirectedLink]:
        nodes = self.path if procedure == "broadcast" else tuple(reversed(self.path))
        return list(itertools.pairwise(nodes))


def link_copies_left(state: NetworkState, u: str, v: str, demand_mbps: float) -> int:
    """How many more copies of `demand_mbps` directed link u->v takes: the smaller of the total
    residual and the per-wavelength residuals (each wavelength holds whole copies)."""
    link = state.model.link(u, v)
    ledger = Ledger(state)
    by_total = math.floor((state.residual_mbps(u, v) + EPS) / demand_mbps)
    by_wl = sum(
        max(0, math.floor((ledger.wavelength_residual_mbps(u, v, w) + EPS) / demand_mbps))
        for w in range(link.wavelengths)
    )
    return max(0, min(by_total, by_wl))


def _candidates(state: NetworkState, task: Task, cap: dict[DirectedLink, int]) -> list[_Candidate]:
    model = state.model
    sites = model.sites
    usable = {(u, v) for (u, v), c in cap.items() if c > 0}

    def walks(start: str) -> Iterator[tuple[str, ...]]:
        stack: list[tuple[str, ...]] = [(start,)]
        while stack:
            path = stack.pop()
            for nxt in model.neighbors(path[-1]):
                if nxt in path:
                    continue
                # Either direction may carry it (broadcast s..t, upload t..s): keep a path if
                # every link has room one way for one procedure; the ILP counts per direction.
                a, b = path[-1], nxt
                if (a, b) not in usable and (b, a) not in usable:
                    continue
                new = (*path, nxt)
                if sites[nxt].has_compute:
                    yield new
                else:
                    stack.append(new)

    out: list[_Candidate] = []
    for s in model.compute_sites:
        for path in walks(s):
            if path[-1] == task.global_site:
                continue
            out.append(_Candidate(path, model.path_delay_ms(path)))
            if len(out) > MAX_CANDIDATES:
                raise CandidateLimit(
                    f"more than {MAX_CANDIDATES} switch-only paths between compute sites: too large for the ILP"
                )
    return out


_banner_shown = False


def _highs() -> Any:
    """A quiet `highspy.Highs`. The first one of a process prints HiGHS's banner on file
    descriptor 1 (C level, whatever `output_flag` says); keep it out of stdout (``--json``)."""
    import highspy

    global _banner_shown
    if _banner_shown:
        h = highspy.Highs()
    else:
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 1)
                h = highspy.Highs()
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _banner_shown = True
    h.setOptionValue("output_flag", False)
    h.setOptionValue("threads", 1)
    h.setOptionValue("random_seed", 0)
    return h


class _Model:
    """The HiGHS model of one task, built once; `solve` runs it with or without a latency bound."""

    def __init__(self, state: NetworkState, task: Task, *, time_limit_s: float, mip_gap: float) -> None:
        import highspy

        self.state, self.task = state, task
        model = state.model
        d = task.demand_mbps
        self.cap: dict[DirectedLink, int] = {}
        for link in model.iter_links():
            for u, v in ((link.a, link.b), (link.b, link.a)):
                self.cap[(u, v)] = link_copies_left(state, u, v, d)
        cands = _candidates(state, task, self.cap)
        self.cands = cands
        h = _highs()
        h.setOptionValue("time_limit", float(time_limit_s))
        h.setOptionValue("mip_rel_gap", float(mip_gap))
        self.h = h
        inf = highspy.kHighsInf
        self.inf = inf
        ncol = 0

        def col(cost: float, lb: float, ub: float) -> int:
            nonlocal ncol
            h.addVar(lb, ub)
            h.changeColCost(ncol, cost)
            ncol += 1
            return ncol - 1

        total_delay = sum(c.delay_ms for c in cands) * 2 + 1.0
        procs: tuple[Procedure, Procedure] = ("broadcast", "upload")
        self.y: dict[tuple[Procedure, int], int] = {}
        for p in procs:
            for i, c in enumerate(cands):
                # A candidate over a link with no room in p's direction cannot be used in p.
                ub = 0.0 if any(self.cap[ln] <= 0 for ln in c.links(p)) else 1.0
                self.y[(p, i)] = col(c.hops + c.delay_ms / total_delay, 0.0, ub)
        self.f: dict[tuple[Procedure, str, int], int] = {}
        for p in procs:
            for k in task.local_sites:
                for i in range(len(cands)):
                    self.f[(p, k, i)] = col(0.0, 0.0, 1.0)
        # Wavelength continuity: a copy through switches keeps one wavelength on all its links.
        # A one-link copy takes any wavelength with room, so only longer candidates get a
        # variable per wavelength (none in an all-compute network).
        ledger = Ledger(state)
        self.yw: dict[tuple[Procedure, int, int], int] = {}
        for p in procs:
            for i, c in enumerate(cands):
                if c.hops < 2:
                    continue
                links = c.links(p)
                for w in range(min(model.link(u, v).wavelengths for u, v in links)):
                    room = all(ledger.wavelength_residual_mbps(u, v, w) + EPS >= d for u, v in links)
                    self.yw[(p, i, w)] = col(0.0, 0.0, 1.0 if room else 0.0)
        integral = [*self.y.values(), *self.yw.values()]
        h.changeColsIntegrality(len(integral), integral, [highspy.HighsVarType.kInteger] * len(integral))

        def row(lb: float, ub: float, coeffs: dict[int, float]) -> int:
            idx = list(coeffs)
            h.addRow(lb, ub, len(idx), idx, [coeffs[j] for j in idx])
            return h.getNumRow() - 1

        into: dict[str, list[int]] = {}
        out_of: dict[str, list[int]] = {}
        for i, c in enumerate(cands):
            out_of.setdefault(c.path[0], []).append(i)
            into.setdefault(c.path[-1], []).append(i)
        g = task.global_site
        for p in procs:
            for node in model.compute_sites:
                if node != g and into.get(node):
                    row(-inf, 1.0, {self.y[(p, i)]: 1.0 for i in into[node]})
            for k in task.local_sites:
                for node in model.compute_sites:
                    coeffs: dict[int, float] = {}
                    for i in into.get(node, []):
                        coeffs[self.f[(p, k, i)]] = coeffs.get(self.f[(p, k, i)], 0.0) + 1.0
                    for i in out_of.get(node, []):
                        coeffs[self.f[(p, k, i)]] = coeffs.get(self.f[(p, k, i)], 0.0) - 1.0
                    rhs = 1.0 if node == k else (-1.0 if node == g else 0.0)
                    if not coeffs:
                        if rhs:
                            row(rhs, rhs, {})  # an isolated terminal: infeasible, said by HiGHS
                        continue
                    row(rhs, rhs, coeffs)
                for i in range(len(cands)):
                    row(-inf, 0.0, {self.f[(p, k, i)]: 1.0, self.y[(p, i)]: -1.0})
        on_link: dict[DirectedLink, dict[int, float]] = {}
        for p in procs:
            for i, c in enumerate(cands):
                for ln in c.links(p):
                    on_link.setdefault(ln, {})[self.y[(p, i)]] = 1.0
        for ln, coeffs in on_link.items():
            row(-inf, float(self.cap[ln]), coeffs)
        on_wavelength: dict[tuple[str, str, int], dict[int, float]] = {}
        for (p, i, w), j in self.yw.items():
            for u, v in cands[i].links(p):
                on_wavelength.setdefault((u, v, w), {})[j] = 1.0
        per_candidate: dict[tuple[Procedure, int], dict[int, float]] = {}
        for (p, i, _), j in self.yw.items():
            per_candidate.setdefault((p, i), {})[j] = 1.0
        for p in procs:
            for i, c in enumerate(cands):
                if c.hops >= 2:
                    coeffs = per_candidate.get((p, i), {})
                    coeffs[self.y[(p, i)]] = -1.0
                    row(0.0, 0.0, coeffs)
        for (u, v, w), coeffs in on_wavelength.items():
            slots = math.floor((ledger.wavelength_residual_mbps(u, v, w) + EPS) / d)
            row(-inf, float(max(0, slots)), coeffs)
        # Latency rows, one per (procedure, local), relaxed until a bound is set.
        self.latency_rows: list[int] = []
        for p in procs:
            for k in task.local_sites:
                self.latency_rows.append(
                    row(-inf, inf, {self.f[(p, k, i)]: c.delay_ms for i, c in enumerate(cands) if c.delay_ms > 0})
                )
        self.total_delay = total_delay

    def solve(self, name: str, max_latency_ms: float | None) -> OptimumResult:
        import highspy

        h = self.h
        ub = self.inf if max_latency_ms is None else float(max_latency_ms)
        for r in self.latency_rows:
            h.changeRowBounds(r, -self.inf, ub)
        started = time.perf_counter()
        h.run()
        took = time.perf_counter() - started
        status = h.getModelStatus()
        text = h.modelStatusToString(status)
        info = h.getInfo()
        d = self.task.demand_mbps
        has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
        bound = info.mip_dual_bound if math.isfinite(info.mip_dual_bound) else None
        # The objective is hops + a delay term under 1, so the hops are above bound - 1.
        bound_mbps = (math.floor(bound - 1 + 1e-9) + 1) * d if bound is not None else None
        kw: dict[str, Any] = {"max_latency_ms": max_latency_ms, "variables": h.getNumCol(),
                              "constraints": h.getNumRow()}
        if status == highspy.HighsModelStatus.kInfeasible:
            what = "" if max_latency_ms is None else f" within a latency bound of {max_latency_ms:g} ms"
            reason = (f"infeasible: no broadcast and upload trees{what} fit the residual capacity "
                      f"for {d:g} Mbit/s per copy")
            return OptimumResult(Schedule.blocked_for(self.task, name, reason), text, False, None, None, took, **kw)
        if not has_solution:
            reason = f"no solution found: HiGHS stopped with status {text!r}"
            return OptimumResult(Schedule.blocked_for(self.task, name, reason), text, False, None, bound_mbps,
                                 took, **kw)
        values = h.getSolution().col_value
        schedule = self._schedule(name, values)
        proven = status == highspy.HighsModelStatus.kOptimal
        objective = schedule.reserved_mbps_total if not schedule.blocked else None
        return OptimumResult(schedule, text, proven, objective, bound_mbps, took, **kw)

    def _tree(
        self, procedure: Procedure, values: list[float], *, join: bool = True
    ) -> list[tuple[str, str, tuple[str, ...]]]:
        """Overlay edges (parent, child, path) of `procedure`'s tree, parents first; `join`
        merges the two edges of a relay with one child into one."""
        task = self.task
        parent_of: dict[str, tuple[str, tuple[str, ...]]] = {}
        for i, c in enumerate(self.cands):
            if values[self.y[(procedure, i)]] > 0.5:
                parent_of[c.path[-1]] = (c.path[0], c.path)
        # Keep what some local's chain uses (an optimum has nothing else; a gap solution may).
        keep: set[str] = set()
        for k in task.local_sites:
            node = k
            while node != task.global_site and node not in keep:
                keep.add(node)
                node = parent_of[node][0]
        children: dict[str, list[str]] = {}
        for node in keep:
            children.setdefault(parent_of[node][0], []).append(node)
        terminals = set(task.terminals)
        # A relay that forwards to one child only is a pass-through: join its two paths (if the
        # joined path stays simple), so that only branch points aggregate.
        for node in sorted(keep - terminals) if join else []:
            kids = children.get(node, [])
            if len(kids) != 1:
                continue
            up, up_path = parent_of[node]
            kid = kids[0]
            joined = (*up_path, *parent_of[kid][1][1:])
            if len(set(joined)) != len(joined):
                continue
            parent_of[kid] = (up, joined)
            children[up] = [kid if x == node else x for x in children[up]]
            del children[node]
            keep.discard(node)
        out: list[tuple[str, str, tuple[str, ...]]] = []
        queue = [task.global_site]
        while queue:
            node = queue.pop(0)
            for kid in sorted(children.get(node, [])):
                out.append((node, kid, parent_of[kid][1]))
                queue.append(kid)
        return out

    def _schedule(self, name: str, values: list[float]) -> Schedule:
        """The solution's trees with wavelengths: first fit, else an exact assignment. A joined
        relay path needs one wavelength end to end, which the ILP did not ask; if none is left, the
        trees are given as solved, with the relay forwarding (its edges the ILP placed)."""
        schedule = Schedule.blocked_for(self.task, name, "")
        for join in (True, False):
            down = self._tree("broadcast", values, join=join)
            up = self._tree("upload", values, join=join)
            broadcast = [OverlayEdge("broadcast", p, c, path) for p, c, path in down]
            upload = [OverlayEdge("upload", c, p, tuple(reversed(path))) for p, c, path in reversed(up)]
            schedule = tree_schedule(name=name, state=self.state, task=self.task, broadcast=broadcast, upload=upload)
            if schedule.blocked:
                schedule = _exact_wavelengths(name, self.state, self.task, broadcast, upload, schedule.reason)
            if not schedule.blocked:
                return schedule
        return schedule


def _exact_wavelengths(
    name: str, state: NetworkState, task: Task, broadcast: list[OverlayEdge], upload: list[OverlayEdge],
    first_fit_reason: str,
) -> Schedule:
    """Wavelengths for fixed paths, by a small ILP, when first fit found none."""
    import highspy

    edges = [*broadcast, *upload]
    ledger = Ledger(state)
    d = task.demand_mbps
    h = _highs()
    h.setOptionValue("time_limit", 30.0)
    col: dict[tuple[int, int], int] = {}
    for j, e in enumerate(edges):
        for w in range(min(state.model.link(u, v).wavelengths for u, v in e.links())):
            h.addVar(0.0, 1.0)
            col[(j, w)] = len(col)
    if col:
        h.changeColsIntegrality(len(col), list(col.values()), [highspy.HighsVarType.kInteger] * len(col))
    for j in range(len(edges)):
        idx = [c for (jj, _), c in col.items() if jj == j]
        h.addRow(1.0, 1.0, len(idx), idx, [1.0] * len(idx))
    per: dict[tuple[str, str, int], list[int]] = {}
    for (j, w), c in col.items():
        for u, v in edges[j].links():
            per.setdefault((u, v, w), []).append(c)
    for (u, v, w), idx in per.items():
        room = ledger.wavelength_residual_mbps(u, v, w) + EPS
        h.addRow(-highspy.kHighsInf, room, len(idx), idx, [d] * len(idx))
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        return Schedule.blocked_for(
            task, name, f"the optimal paths have no wavelength assignment with continuity ({first_fit_reason})"
        )
    values = h.getSolution().col_value
    placed: list[OverlayEdge] = []
    for j, e in enumerate(edges):
        w = next(w for (jj, w), c in col.items() if jj == j and values[c] > 0.5)
        ledger.reserve(e.links(), w, d)
        placed.append(OverlayEdge(e.procedure, e.src, e.dst, e.path, w))
    upload_parent = {e.src: e.dst for e in upload}
    return Schedule.for_task(
        task, name,
        broadcast_parent={e.dst: e.src for e in broadcast},
        upload_parent=upload_parent,
        edges=tuple(placed),
        aggregation_sites=frozenset(upload_parent.values()),
        reservations=ledger.reservations(),
    )


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
    return _Model(state, task, time_limit_s=time_limit_s, mip_gap=mip_gap).solve(name, max_latency_ms)


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
    ilp = _Model(state, task, time_limit_s=time_limit_s, mip_gap=mip_gap)
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
        model = _Model(state, task, time_limit_s=self.time_limit_s, mip_gap=self.mip_gap)
        self.last = model.solve(self.name, self.max_latency_ms)
        return self.last.schedule
