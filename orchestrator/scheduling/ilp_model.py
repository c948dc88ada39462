"""The HiGHS model of one task's ILP and the reading of its solution into a schedule.

The formulation is `orchestrator.scheduling.ilp`'s (its module docstring); this module builds it
(candidate overlay edges, columns, rows), solves it, and turns the chosen edges into broadcast and
upload trees with wavelengths (first fit, else a small exact assignment ILP). Pure: no I/O but
HiGHS's, whose banner is kept off stdout.
"""

from __future__ import annotations

import itertools
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from orchestrator.scheduling.base import tree_schedule
from orchestrator.scheduling.schedule import PROCEDURES, DirectedLink, OverlayEdge, Procedure, Schedule
from orchestrator.scheduling.state import EPS, Ledger, NetworkState
from orchestrator.scheduling.tasks import Task

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


class TaskModel:
    """The HiGHS model of one task, built once; `solve` runs it with or without a latency bound.

    Columns and rows are added in one fixed order (the solver's path, and so which of several
    optimal trees it returns, depends on it): the tree edges y, the commodity flows f, the
    per-wavelength choices yw; then per procedure the one-parent and flow rows, the links'
    capacity, the wavelengths' continuity and capacity, and the latency rows.
    """

    def __init__(self, state: NetworkState, task: Task, *, time_limit_s: float, mip_gap: float) -> None:
        import highspy

        self.state, self.task = state, task
        self.cap: dict[DirectedLink, int] = {}
        for link in state.model.iter_links():
            for u, v in ((link.a, link.b), (link.b, link.a)):
                self.cap[(u, v)] = link_copies_left(state, u, v, task.demand_mbps)
        self.cands = _candidates(state, task, self.cap)
        self.h = _highs()
        self.h.setOptionValue("time_limit", float(time_limit_s))
        self.h.setOptionValue("mip_rel_gap", float(mip_gap))
        self.inf = highspy.kHighsInf
        self.ledger = Ledger(state)
        self.total_delay = sum(c.delay_ms for c in self.cands) * 2 + 1.0
        self.y: dict[tuple[Procedure, int], int] = {}
        self.f: dict[tuple[Procedure, str, int], int] = {}
        self.yw: dict[tuple[Procedure, int, int], int] = {}
        self._add_columns()
        self._add_tree_rows()
        self._add_capacity_rows()
        self._add_wavelength_rows()
        self.latency_rows = self._add_latency_rows()

    def _col(self, cost: float, lb: float, ub: float) -> int:
        j: int = self.h.getNumCol()
        self.h.addVar(lb, ub)
        self.h.changeColCost(j, cost)
        return j

    def _row(self, lb: float, ub: float, coeffs: dict[int, float]) -> int:
        idx = list(coeffs)
        self.h.addRow(lb, ub, len(idx), idx, [coeffs[j] for j in idx])
        row: int = self.h.getNumRow() - 1
        return row

    def _add_columns(self) -> None:
        """y (integer), f (continuous) and yw (integer) columns; y's cost is hops + a delay term < 1."""
        import highspy

        cands, d = self.cands, self.task.demand_mbps
        for p in PROCEDURES:
            for i, c in enumerate(cands):
                # A candidate over a link with no room in p's direction cannot be used in p.
                ub = 0.0 if any(self.cap[ln] <= 0 for ln in c.links(p)) else 1.0
                self.y[(p, i)] = self._col(c.hops + c.delay_ms / self.total_delay, 0.0, ub)
        for p in PROCEDURES:
            for k in self.task.local_sites:
                for i in range(len(cands)):
                    self.f[(p, k, i)] = self._col(0.0, 0.0, 1.0)
        # Wavelength continuity: a copy through switches keeps one wavelength on all its links.
        # A one-link copy takes any wavelength with room, so only longer candidates get a
        # variable per wavelength (none in an all-compute network).
        for p in PROCEDURES:
            for i, c in enumerate(cands):
                if c.hops < 2:
                    continue
                links = c.links(p)
                for w in range(min(self.state.model.link(u, v).wavelengths for u, v in links)):
                    room = all(self.ledger.wavelength_residual_mbps(u, v, w) + EPS >= d for u, v in links)
                    self.yw[(p, i, w)] = self._col(0.0, 0.0, 1.0 if room else 0.0)
        integral = [*self.y.values(), *self.yw.values()]
        self.h.changeColsIntegrality(len(integral), integral, [highspy.HighsVarType.kInteger] * len(integral))

    def _add_tree_rows(self) -> None:
        """Per procedure: at most one parent per site, each commodity's flow conservation, f <= y."""
        into: dict[str, list[int]] = {}
        out_of: dict[str, list[int]] = {}
        for i, c in enumerate(self.cands):
            out_of.setdefault(c.path[0], []).append(i)
            into.setdefault(c.path[-1], []).append(i)
        g, compute_sites = self.task.global_site, self.state.model.compute_sites
        for p in PROCEDURES:
            for node in compute_sites:
                if node != g and into.get(node):
                    self._row(-self.inf, 1.0, {self.y[(p, i)]: 1.0 for i in into[node]})
            for k in self.task.local_sites:
                for node in compute_sites:
                    coeffs: dict[int, float] = {}
                    for i in into.get(node, []):
                        coeffs[self.f[(p, k, i)]] = coeffs.get(self.f[(p, k, i)], 0.0) + 1.0
                    for i in out_of.get(node, []):
                        coeffs[self.f[(p, k, i)]] = coeffs.get(self.f[(p, k, i)], 0.0) - 1.0
                    rhs = 1.0 if node == k else (-1.0 if node == g else 0.0)
                    if not coeffs:
                        if rhs:
                            self._row(rhs, rhs, {})  # an isolated terminal: infeasible, said by HiGHS
                        continue
                    self._row(rhs, rhs, coeffs)
                for i in range(len(self.cands)):
                    self._row(-self.inf, 0.0, {self.f[(p, k, i)]: 1.0, self.y[(p, i)]: -1.0})

    def _add_capacity_rows(self) -> None:
        """The copies of both procedures on each directed link: at most `cap` of it."""
        on_link: dict[DirectedLink, dict[int, float]] = {}
        for p in PROCEDURES:
            for i, c in enumerate(self.cands):
                for ln in c.links(p):
                    on_link.setdefault(ln, {})[self.y[(p, i)]] = 1.0
        for ln, coeffs in on_link.items():
            self._row(-self.inf, float(self.cap[ln]), coeffs)

    def _add_wavelength_rows(self) -> None:
        """A used candidate of two or more links takes one wavelength; each (link, wavelength)
        holds no more copies than its residual takes."""
        d = self.task.demand_mbps
        on_wavelength: dict[tuple[str, str, int], dict[int, float]] = {}
        for (p, i, w), j in self.yw.items():
            for u, v in self.cands[i].links(p):
                on_wavelength.setdefault((u, v, w), {})[j] = 1.0
        per_candidate: dict[tuple[Procedure, int], dict[int, float]] = {}
        for (p, i, _), j in self.yw.items():
            per_candidate.setdefault((p, i), {})[j] = 1.0
        for p in PROCEDURES:
            for i, c in enumerate(self.cands):
                if c.hops >= 2:
                    coeffs = per_candidate.get((p, i), {})
                    coeffs[self.y[(p, i)]] = -1.0
                    self._row(0.0, 0.0, coeffs)
        for (u, v, w), coeffs in on_wavelength.items():
            slots = math.floor((self.ledger.wavelength_residual_mbps(u, v, w) + EPS) / d)
            self._row(-self.inf, float(max(0, slots)), coeffs)

    def _add_latency_rows(self) -> list[int]:
        """One row per (procedure, local): its chain's delay, relaxed until `solve` sets a bound."""
        rows = []
        for p in PROCEDURES:
            for k in self.task.local_sites:
                delays = {self.f[(p, k, i)]: c.delay_ms for i, c in enumerate(self.cands) if c.delay_ms > 0}
                rows.append(self._row(-self.inf, self.inf, delays))
        return rows

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
