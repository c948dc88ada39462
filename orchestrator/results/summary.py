"""A run's results summarised once, from its database rows alone: per task, per point, the claims.

Per task (`TaskSummary`): its mean round latency over the rounds it completed without a straggler
(rounds with one are counted separately), its reserved bandwidth, its carried bytes, its mean ratios
of measured round latency to the round's lower bound and to the physical reference, and its final
accuracy. Per point (`PointSummary`: scheduler, number of locals): the mean and the population
standard deviation of those over the point's tasks that ran.

`run_summary` computes them once into a `RunSummary`; the report, the CSVs, the summary plots and the
summary printed at the end of a run all render that one object, so the numbers they show are the
same. Nothing in the runner's memory enters here: anything plotted can be recomputed from the rows
(`tests/unit/test_experiment_pieces.py` does).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.results import queries
from orchestrator.results.db import ResultsDB
from orchestrator.results.fidelity import Verdict, run_verdicts, saturated_share


@dataclass(frozen=True)
class TaskSummary:
    """One task of a run under one scheduler, as its rows record it (a row of ``tasks.csv``)."""

    scheduler: str
    task_id: int
    n_locals: int
    state: str
    reserved_mbps: float | None
    carried_bytes: int | None
    rounds: int
    mean_latency_s: float | None
    mean_ratio_to_bound: float | None
    final_accuracy: float | None
    model_bytes: int = 0
    straggler_rounds: int = 0
    mean_ratio_to_reference: float | None = None
    mean_broadcast_to_bound: float | None = None
    agents_ready_s: float | None = None
    connect_s: float | None = None
    chunk_bytes: int | None = None
    reservation_enforced: bool | None = None
    #: On the run's clock (seconds since the emulation and the site servers were up).
    arrival_s: float | None = None
    admitted_s: float | None = None
    first_broadcast_s: float | None = None
    finished_s: float | None = None
    #: Admission to G's first broadcast byte (schedule, flows, roles, connections).
    start_overhead_s: float | None = None
    #: Arrival to the end of the task (done or failed).
    completion_s: float | None = None
    #: Sum of the task's round latencies (its time in rounds).
    rounds_s: float | None = None
    reason: str = ""
    #: The kernel's TCP data bytes the task's agents sent (retransmissions included) and retransmitted;
    #: None: not measured (always, in a simulation: it has no TCP).
    sent_bytes: int | None = None
    retrans_bytes: int | None = None

    @property
    def retrans_share(self) -> float | None:
        """Retransmitted over sent TCP data bytes; None when not measured."""
        return retrans_share([self])


@dataclass(frozen=True)
class PointSummary:
    """One point (scheduler, number of locals) over its tasks (a row of ``summary.csv``)."""

    scheduler: str
    n_locals: int
    tasks: int
    tasks_ran: int
    blocked: int
    latency_s_mean: float | None
    latency_s_std: float | None
    reserved_mbps_mean: float | None
    reserved_mbps_std: float | None
    carried_mb_mean: float | None
    ratio_to_bound_mean: float | None
    accuracy_mean: float | None
    straggler_rounds: int = 0
    ratio_to_reference_mean: float | None = None
    #: Retransmitted over sent TCP data bytes, summed over the tasks that ran and measured both
    #: (`retrans_share`); None when none did (a simulation: TCP is not modelled).
    retrans_share: float | None = None


def retrans_share(tasks: Sequence[TaskSummary]) -> float | None:
    """Retransmitted over sent TCP data bytes, summed over the tasks that measured both; None if none did."""
    measured = [t for t in tasks if t.sent_bytes is not None and t.retrans_bytes is not None]
    sent = sum(t.sent_bytes or 0 for t in measured)
    return None if not measured or sent <= 0 else sum(t.retrans_bytes or 0 for t in measured) / sent


def retrans_text(share: float | None, *, modelled: bool = True) -> str:
    """A TCP retransmitted share as a percentage; ``not modelled`` for an engine without TCP, ``-``
    when not measured."""
    if not modelled:
        return "not modelled"
    return "-" if share is None else f"{share:.3%}"


@dataclass(frozen=True)
class RunSummary:
    """A run, its tasks and its points, computed once (`run_summary`) and rendered by every reader."""

    run_id: int
    name: str
    status: str
    note: str
    engine: str
    environment: Mapping[str, Any]
    tasks: tuple[TaskSummary, ...]
    points: tuple[PointSummary, ...]
    #: Per point, whether its rounds measured the emulated network and sites (`orchestrator.results.fidelity`).
    verdicts: tuple[Verdict, ...] = ()
    #: The share of the host's CPU samples with its cores saturated (None: not sampled).
    host_saturated: float | None = None

    @property
    def unfaithful(self) -> list[Verdict]:
        """The points whose figures the instrument dominates."""
        return [v for v in self.verdicts if not v.faithful]

    @property
    def counts(self) -> dict[str, int]:
        """How many of the run's tasks ended done, failed and blocked."""
        return {s: sum(t.state == s for t in self.tasks) for s in ("done", "failed", "blocked")}

    @property
    def locals_seen(self) -> list[int]:
        """The numbers of locals the run's points have, ascending."""
        return sorted({p.n_locals for p in self.points})

    @property
    def headline_locals(self) -> int | None:
        """The number of locals the paper's claims are read at: 8 when measured, else the largest."""
        seen = self.locals_seen
        return None if not seen else (8 if 8 in seen else seen[-1])

    def claims(self) -> dict[str, Any] | None:
        """`claims` at `headline_locals`; None without points."""
        n = self.headline_locals
        return None if n is None else claims(self.points, n_locals=n)


def mean_or_none(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _std(xs: Sequence[float]) -> float | None:
    return statistics.pstdev(xs) if xs else None


def _task_summary(t: Mapping[str, Any], every: list[dict[str, Any]]) -> TaskSummary:
    """One task from its `queries.tasks_with_schedules` row and its rounds in round order."""
    rs = [r for r in every if not r["stragglers"]]
    accs = [r["accuracy"] for r in every if r["accuracy"] is not None]
    setup = json.loads(t["setup_json"] or "{}")
    return TaskSummary(
        scheduler=t["scheduler"], task_id=t["task_id"], n_locals=t["n_locals"], state=t["state"],
        reserved_mbps=t["reserved_mbps"] if t["state"] != "blocked" else None,
        carried_bytes=t["carried_bytes"], rounds=len(every),
        mean_latency_s=mean_or_none([r["latency_s"] for r in rs]),
        mean_ratio_to_bound=mean_or_none([r["latency_s"] / r["lower_bound_s"] for r in rs if r["lower_bound_s"]]),
        final_accuracy=accs[-1] if accs else None,
        model_bytes=t["model_bytes"], straggler_rounds=len(every) - len(rs),
        mean_ratio_to_reference=mean_or_none([r["latency_s"] / r["reference_s"] for r in rs if r["reference_s"]]),
        mean_broadcast_to_bound=mean_or_none([r["broadcast_all_s"] / r["broadcast_bound_s"] for r in rs
                                              if r["broadcast_bound_s"]]),
        agents_ready_s=setup.get("agents_ready_s"), connect_s=setup.get("connect_s"),
        chunk_bytes=setup.get("chunk_bytes"), reservation_enforced=setup.get("reservation_enforced"),
        arrival_s=t["arrival_s"], admitted_s=t["admitted_s"], first_broadcast_s=t["first_broadcast_s"],
        finished_s=t["finished_s"], start_overhead_s=t["start_overhead_s"],
        completion_s=None if t["finished_s"] is None or t["arrival_s"] is None else t["finished_s"] - t["arrival_s"],
        rounds_s=sum(r["latency_s"] for r in every) if every else None,
        reason=t["reason"] or "",
        sent_bytes=t["sent_bytes"], retrans_bytes=t["retrans_bytes"],
    )


def task_summaries(db: ResultsDB, run_id: int) -> list[TaskSummary]:
    """Every task of the run, by scheduler, number of locals and task id."""
    by_task: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in queries.rounds(db.conn, run_id):
        by_task.setdefault((r["scheduler"], r["task_id"]), []).append(r)
    return [_task_summary(t, by_task.get((t["scheduler"], t["task_id"]), []))
            for t in queries.tasks_with_schedules(db.conn, run_id)]


def point_summaries(tasks: Sequence[TaskSummary]) -> list[PointSummary]:
    """Per (scheduler, number of locals), sorted: means and population std over the tasks that ran
    (completed a round without a straggler)."""
    by: dict[tuple[str, int], list[TaskSummary]] = {}
    for tr in tasks:
        by.setdefault((tr.scheduler, tr.n_locals), []).append(tr)
    points = []
    for (scheduler, n), trs in sorted(by.items()):
        ran = [t for t in trs if t.mean_latency_s is not None]
        lat = [t.mean_latency_s for t in ran if t.mean_latency_s is not None]
        res = [t.reserved_mbps for t in ran if t.reserved_mbps is not None]
        points.append(PointSummary(
            scheduler=scheduler, n_locals=n, tasks=len(trs), tasks_ran=len(ran),
            blocked=sum(t.state == "blocked" for t in trs),
            latency_s_mean=mean_or_none(lat), latency_s_std=_std(lat),
            reserved_mbps_mean=mean_or_none(res), reserved_mbps_std=_std(res),
            carried_mb_mean=mean_or_none([t.carried_bytes / 1e6 for t in ran if t.carried_bytes is not None]),
            ratio_to_bound_mean=mean_or_none([t.mean_ratio_to_bound for t in ran
                                              if t.mean_ratio_to_bound is not None]),
            accuracy_mean=mean_or_none([t.final_accuracy for t in ran if t.final_accuracy is not None]),
            straggler_rounds=sum(t.straggler_rounds for t in trs),
            ratio_to_reference_mean=mean_or_none([t.mean_ratio_to_reference for t in ran
                                                  if t.mean_ratio_to_reference is not None]),
            retrans_share=retrans_share(ran),
        ))
    return points


def run_summary(db: ResultsDB, run_id: int) -> RunSummary:
    """The run's summary, computed once from its rows.

    Raises
    ------
    KeyError
        No run `run_id` in the database.
    """
    run = db.run(run_id)
    tasks = task_summaries(db, run_id)
    points = tuple(point_summaries(tasks))
    engine, env = run.get("engine") or "emulation", run["environment"]
    modelled = engine == "simulation" or env.get("compute_timing") == "modeled"
    verdicts = run_verdicts(db, run_id, [(p.scheduler, p.n_locals) for p in points if p.tasks_ran],
                            compute_modelled=modelled)
    return RunSummary(
        run_id=run_id, name=run["name"], status=run["status"], note=run.get("note") or "",
        engine=engine, environment=env, tasks=tuple(tasks), points=points, verdicts=verdicts,
        host_saturated=saturated_share(queries.host_busy(db.conn, run_id)))


def claims(points: Sequence[PointSummary], *, n_locals: int = 8, flexible: str = "mst",
           fixed: str = "spff") -> dict[str, Any]:
    """The paper's two claims at `n_locals`: ratios flexible/fixed of reserved bandwidth and of
    mean round latency, with the spread (std/mean) of each side. Missing data gives None."""
    by = {(p.scheduler, p.n_locals): p for p in points}
    a, b = by.get((flexible, n_locals)), by.get((fixed, n_locals))
    out: dict[str, Any] = {"n_locals": n_locals, "flexible": flexible, "fixed": fixed}
    for key, mean, std in (("bandwidth", "reserved_mbps_mean", "reserved_mbps_std"),
                           ("latency", "latency_s_mean", "latency_s_std")):
        ma = getattr(a, mean) if a else None
        mb = getattr(b, mean) if b else None
        out[f"{key}_ratio"] = (ma / mb) if ma is not None and mb else None
        out[f"{key}_cv_{flexible}"] = (getattr(a, std) / ma) if a and ma else None
        out[f"{key}_cv_{fixed}"] = (getattr(b, std) / mb) if b and mb else None
    return out
