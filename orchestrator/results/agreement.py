"""How far a simulated run is from an emulated run of the same config (`netai validate`).

Both runs hold the same tasks (same seeds, same task list) under the same schedulers, so every
comparison is paired task by task:

- per point (scheduler, locals): the ratio of the simulated to the emulated mean round latency
  (the mean over the point's tasks of each task's mean round latency), with a 95 % paired
  percentile-bootstrap interval (tasks resampled together in both runs; `ratio_of_means`);
- per claim (a scheduler against the fixed one, at each number of locals, as the report's claim
  table reads them): the paired ratio in each engine (`stats.paired_ratio`) and whether the two
  intervals overlap;
- carried bytes: per point, the simulated total over the emulated one, beside each engine's TCP
  retransmitted share (retransmitted over sent data bytes; the emulation's from the agents' kernel
  figures, the simulation's always None: a fluid model has no TCP, so it is not modelled, not 0).

Pure functions of `TaskSummary` lists; nothing here reads a database, draws or prints.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.results.stats import PairedRatio, paired_ratio
from orchestrator.results.summary import TaskSummary, retrans_share


@dataclass(frozen=True)
class Interval:
    """A ratio with its 95 % interval, and the number of tasks behind it."""

    ratio: float
    low: float
    high: float
    tasks: int

    def within(self, tolerance: float) -> bool:
        """Whether the ratio itself is within `tolerance` of 1."""
        return abs(self.ratio - 1.0) <= tolerance


@dataclass(frozen=True)
class PointAgreement:
    scheduler: str
    n_locals: int
    emulated_s: float
    simulated_s: float
    latency: Interval
    #: Simulated over emulated carried bytes, summed over the point's tasks (None: not recorded).
    carried_ratio: float | None
    #: Each engine's TCP retransmitted share over the point's paired tasks (`summary.retrans_share`;
    #: None: not measured, or not modelled: the simulation's always is).
    emulated_retrans_share: float | None = None
    simulated_retrans_share: float | None = None


@dataclass(frozen=True)
class ClaimAgreement:
    """A claim ratio (numerator / denominator mean round latency at `n_locals`) in both engines."""

    numerator: str
    denominator: str
    n_locals: int
    emulated: PairedRatio | None
    simulated: PairedRatio | None

    @property
    def overlap(self) -> bool | None:
        if self.emulated is None or self.simulated is None:
            return None
        return self.emulated.low <= self.simulated.high and self.simulated.low <= self.emulated.high


def ratio_of_means(sim: Sequence[float], emu: Sequence[float], *, resamples: int = 10_000,
                   seed: int = 0) -> Interval:
    """mean(sim) / mean(emu) over paired values (sim[i] and emu[i] are one task), with a 95 %
    percentile-bootstrap interval that resamples the pairs (seeded: reproducible).

    Raises
    ------
    ValueError
        If the lists are empty, of different lengths, or the emulated mean is not positive.
    """
    s, e = np.asarray(sim, dtype=float), np.asarray(emu, dtype=float)
    if len(s) == 0 or len(s) != len(e):
        raise ValueError(f"need paired values, got {len(s)} simulated and {len(e)} emulated")
    if e.mean() <= 0:
        raise ValueError("the emulated mean is not positive")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(s), size=(resamples, len(s)))
    boot = s[idx].mean(axis=1) / e[idx].mean(axis=1)
    lo, hi = np.percentile(boot, [2.5, 97.5])
    return Interval(float(s.mean() / e.mean()), float(lo), float(hi), len(s))


def _done(tasks: Sequence[TaskSummary]) -> dict[tuple[str, int], TaskSummary]:
    return {(t.scheduler, t.task_id): t for t in tasks if t.state == "done" and t.mean_latency_s is not None}


def paired_tasks(emulated: Sequence[TaskSummary], simulated: Sequence[TaskSummary]
                 ) -> list[tuple[TaskSummary, TaskSummary]]:
    """(emulated, simulated) summaries of every task both runs completed, in a stable order."""
    e, s = _done(emulated), _done(simulated)
    return [(e[k], s[k]) for k in sorted(set(e) & set(s))]


def point_agreement(emulated: Sequence[TaskSummary], simulated: Sequence[TaskSummary]) -> list[PointAgreement]:
    """Per (scheduler, locals): sim/emu mean round latency with its interval, and carried bytes."""
    by: dict[tuple[str, int], list[tuple[TaskSummary, TaskSummary]]] = {}
    for pair in paired_tasks(emulated, simulated):
        by.setdefault((pair[0].scheduler, pair[0].n_locals), []).append(pair)
    out = []
    for (sched, n), pairs in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        emu = [float(e.mean_latency_s or 0.0) for e, _ in pairs]
        sim = [float(s.mean_latency_s or 0.0) for _, s in pairs]
        carried_e = [e.carried_bytes for e, _ in pairs]
        carried_s = [s.carried_bytes for _, s in pairs]
        carried = None
        if all(c is not None for c in carried_e + carried_s) and sum(c or 0 for c in carried_e) > 0:
            carried = sum(c or 0 for c in carried_s) / sum(c or 0 for c in carried_e)
        out.append(PointAgreement(sched, n, float(np.mean(emu)), float(np.mean(sim)), ratio_of_means(sim, emu),
                                  carried, retrans_share([e for e, _ in pairs]), retrans_share([s for _, s in pairs])))
    return out


def claim_agreement(emulated: Sequence[TaskSummary], simulated: Sequence[TaskSummary], *,
                    fixed: str = "spff") -> list[ClaimAgreement]:
    """Every other scheduler against `fixed`, at every number of locals both runs have."""
    scheds = sorted({t.scheduler for t in emulated} - {fixed})
    locals_ = sorted({t.n_locals for t in emulated} & {t.n_locals for t in simulated})
    out = []
    for n in locals_:
        for sched in scheds:
            out.append(ClaimAgreement(sched, fixed, n,
                                      paired_ratio(emulated, n_locals=n, numerator=sched, denominator=fixed),
                                      paired_ratio(simulated, n_locals=n, numerator=sched, denominator=fixed)))
    return out


def latency_errors(points: Sequence[PointAgreement]) -> tuple[float, float]:
    """The worst |sim/emu - 1| of mean round latency over `points`, and the geometric-mean error
    exp(mean |ln sim/emu|) - 1 (a point 10 % slow and one 10 % fast do not cancel out).

    Raises
    ------
    ValueError
        Without points.
    """
    if not points:
        raise ValueError("no point to take the latency error of")
    ratios = [p.latency.ratio for p in points]
    return max(abs(r - 1.0) for r in ratios), math.expm1(sum(abs(math.log(r)) for r in ratios) / len(ratios))
