"""Figures the report derives from a run's tasks and rows beyond the per-point summary.

Schedulers are compared on the same tasks (`paired_ratio`): the mean over tasks of the per-task
ratio of one scheduler's figure to the other's, with a 95 % percentile-bootstrap confidence
interval and the number of tasks and rounds behind it. Also: the share of the run spent in rounds
(`useful_time`), the most tasks at once (`max_overlap`), the online mode's per-scheduler figures,
the faults' per-label figures, and the local-model selection curves. Pure functions of the
`TaskSummary` list or of rows read through `orchestrator.results.queries`; nothing here draws or writes.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.results import queries
from orchestrator.results.bootstrap import (
    bootstrap_ci as bootstrap_ci,  # its home before; callers import it here
)
from orchestrator.results.db import ResultsDB
from orchestrator.results.schema import NOT_APPLIED
from orchestrator.results.summary import TaskSummary, mean_or_none


@dataclass(frozen=True)
class PairedRatio:
    """Mean over tasks of a per-task ratio, with its 95 % bootstrap confidence interval."""

    mean: float
    low: float
    high: float
    tasks: int
    rounds: int

    @property
    def half_width_rel(self) -> float:
        """Half the interval's width over the mean (the figure a reviewer reads as precision)."""
        return (self.high - self.low) / 2 / self.mean if self.mean else float("inf")


def paired_ratio(tasks: Sequence[TaskSummary], *, n_locals: int, numerator: str, denominator: str,
                 figure: str = "mean_latency_s") -> PairedRatio | None:
    """Per task run by both schedulers: figure(numerator) / figure(denominator); their mean and CI."""
    by = {(t.scheduler, t.task_id): t for t in tasks if t.n_locals == n_locals}
    ratios, rounds = [], 0
    for (sched, task_id), a in by.items():
        b = by.get((denominator, task_id))
        if sched != numerator or b is None:
            continue
        x, y = getattr(a, figure), getattr(b, figure)
        if x is not None and y:
            ratios.append(x / y)
            rounds += a.rounds - a.straggler_rounds + b.rounds - b.straggler_rounds
    if not ratios:
        return None
    lo, hi = bootstrap_ci(ratios)
    return PairedRatio(mean=statistics.fmean(ratios), low=lo, high=hi, tasks=len(ratios), rounds=rounds)


def useful_time(tasks: Sequence[TaskSummary], clock_end_s: float | None) -> float | None:
    """Time in rounds over the run's wall time after bring-up: the length of the union of the tasks'
    round intervals (first broadcast to the end of the last round; overlapping tasks count once)
    over the run clock's span. None without rounds or an end time."""
    spans = sorted((t.first_broadcast_s, t.first_broadcast_s + t.rounds_s) for t in tasks
                   if t.first_broadcast_s is not None and t.rounds_s)
    if not spans or not clock_end_s:
        return None
    total, cur_a, cur_b = 0.0, spans[0][0], spans[0][1]
    for a, b in spans[1:]:
        if a > cur_b:
            total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    total += cur_b - cur_a
    return total / clock_end_s


def max_overlap(tasks: Sequence[TaskSummary]) -> int:
    """The largest number of tasks running at one time (admitted, not yet finished)."""
    edges = sorted([(t.admitted_s, 1) for t in tasks if t.admitted_s is not None and t.finished_s is not None]
                   + [(t.finished_s, -1) for t in tasks if t.admitted_s is not None and t.finished_s is not None])
    best = cur = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


def online_figures(db: ResultsDB, run_id: int, tasks: Sequence[TaskSummary]) -> list[dict[str, Any]]:
    """Per scheduler: tasks, blocked, failed, blocking ratio, mean round latency, median completion
    time, most tasks at once, peak memory in use, mean reserved and carried bandwidth, and the CPU
    seconds each site's server used over the scheduler's trace."""
    out = []
    every_sample = queries.samples(db.conn, run_id)
    for sched in sorted({t.scheduler for t in tasks}):
        ts = [t for t in tasks if t.scheduler == sched]
        lat = [t.mean_latency_s for t in ts if t.mean_latency_s is not None]
        comp = [t.completion_s for t in ts if t.completion_s is not None and t.state == "done"]
        samples = [s for s in every_sample if s["scheduler"] == sched]
        mem = [s["memory_used_bytes"] for s in samples if s["memory_used_bytes"] is not None]
        carried = [s["carried_mbps"] for s in samples if s["carried_mbps"] is not None]
        out.append({
            "scheduler": sched, "tasks": len(ts), "done": sum(t.state == "done" for t in ts),
            "blocked": sum(t.state == "blocked" for t in ts), "failed": sum(t.state == "failed" for t in ts),
            "blocking_ratio": sum(t.state == "blocked" for t in ts) / len(ts),
            "latency_s_mean": mean_or_none(lat), "completion_s_median": statistics.median(comp) if comp else None,
            "max_overlap": max_overlap(ts), "memory_peak_bytes": max(mem) if mem else None,
            "reserved_mbps_mean": mean_or_none([s["reserved_mbps"] for s in samples]),
            "carried_mbps_mean": mean_or_none(carried),
            "site_cpu_s": {site: round(cpu, 2) for site, cpu in queries.site_cpu_s(db.conn, run_id, sched).items()},
        })
    return out


def not_applied(fault: Mapping[str, Any]) -> bool:
    """A `faults` row of an event the trace ended before (recorded, never applied)."""
    return not fault["ok"] and str(fault["detail"]).startswith(NOT_APPLIED)


def fault_figures(db: ResultsDB, run_id: int) -> list[dict[str, Any]]:
    """Per label (scheduler, or scheduler/policy): events applied (and of those failed), events the
    trace ended before (not applied), tasks done and failed, moves,
    rounds retried (a move resumes at the round in flight), mean interruption, mean round latency,
    and the predicted saving the moves bought (old minus new round bound, summed)."""
    out = []
    for label in queries.schedulers(db.conn, run_id):
        states = queries.task_states(db.conn, run_id, label)
        moves = queries.moves(db.conn, run_id, label)
        faults = queries.faults(db.conn, run_id, label)
        applied = [f for f in faults if not not_applied(f)]
        lat = queries.round_latencies(db.conn, run_id, label)
        gaps = [m["interruption_s"] for m in moves if m["interruption_s"] is not None]
        saved = [m["old_bound_s"] - m["new_bound_s"] for m in moves
                 if m["old_bound_s"] is not None and m["new_bound_s"] is not None]
        out.append({
            "scheduler": label, "events": len(applied), "events_failed": sum(1 for f in applied if not f["ok"]),
            "events_not_applied": len(faults) - len(applied),
            "done": states.count("done"), "failed": states.count("failed"),
            "moves": len(moves), "rounds_retried": len(moves),
            "interruption_s_mean": mean_or_none(gaps), "latency_s_mean": mean_or_none([r["latency_s"] for r in lat]),
            "saved_bound_s": sum(saved) if saved else None,
        })
    return out


def selection_curves(db: ResultsDB) -> dict[str, list[tuple[float, float, float]]]:
    """Per ``run N: policy, scheduler``: (cumulative latency s, cumulative upload MB, accuracy) after
    each round index, each the mean over the tasks that completed that round."""
    by_task: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in queries.round_selections(db.conn):
        label = f"run {r['run_id']}: {r['policy']}, {r['scheduler']}"
        by_task.setdefault((label, r["task_id"]), []).append(r)
    acc: dict[str, dict[int, list[tuple[float, float, float]]]] = {}
    for (label, _task), rounds in by_task.items():
        lat = mb = 0.0
        for i, r in enumerate(rounds):
            lat += r["latency_s"]
            mb += r["upload_bytes"] / 1e6
            if r["accuracy"] is not None:
                acc.setdefault(label, {}).setdefault(i, []).append((lat, mb, r["accuracy"]))

    def mean(pts: list[tuple[float, float, float]]) -> tuple[float, float, float]:
        return (statistics.fmean(p[0] for p in pts), statistics.fmean(p[1] for p in pts),
                statistics.fmean(p[2] for p in pts))

    return {label: [mean(pts) for _i, pts in sorted(steps.items())] for label, steps in sorted(acc.items())}
