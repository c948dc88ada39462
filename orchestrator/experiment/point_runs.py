"""A K per point of a sweep: each number of locals runs in an emulation of its own, at its own K.

A host's K is set by its largest point (the most locals training at once, the deepest trees), so a
run at one K runs its point of 1 local as slowly as its point of 13. With ``emulation:
{time_dilation: auto, per_point: true}`` each point's K is chosen by trials of that point alone
(`calibration.calibration_config` of the config holding that point's locals only), and this host's
K for the same workload shape is reused (`k_store`: its key holds the number of locals); with
``time_dilation: {1: 2, 8: 16}`` the config gives them.

The points run one after another, in the config's order of locals, each calibrated (if it is to
be; its trials start at the largest K of the points before it with fewer locals, `_floor`, since
a point with more locals trains more at once over deeper trees) and then run as one session
(`orchestrator.experiment.session`) into the one run and results database. Each session's run
clock goes on from where the last one stopped, so the records' times never overlap (the
dashboard's replay, the time in rounds). The run's environment records, as each
point goes (so that a resume keeps them): ``time_dilation_per_point`` {locals: K},
``time_dilation_calibration_per_point`` {locals: its calibration}, ``wall_per_point`` {locals: its
wall time and its parts: trials, bring-up (none when it ran on its last trial's emulation,
``on_trial_emulation``: `orchestrator.experiment.kept`), tasks; its emulated time}, ``time_dilation`` (the
largest K), and the link samples and CPU seconds summed over the sessions. Whatever reads a point's
K takes it from `orchestrator.results.dilation.k_for`.

This module orders the points and records what they cost; it brings nothing up and chooses no K
itself: the runner gives it a point's calibration and its session.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.experiment.calibration import Calibration
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.resume import Resume
from orchestrator.experiment.runs import task_sets


@dataclass(frozen=True)
class Point:
    """One point of a run with a K per point: its number of locals and the run's config holding that
    point alone, at its K (given) or ``auto`` (to be calibrated), with no K per point of its own."""

    n_locals: int
    cfg: ExperimentConfig


def points_of(cfg: ExperimentConfig) -> list[Point]:
    """The points of `cfg` (a K per point), in the order of its locals (each number once)."""
    emu = cfg.emulation
    out = []
    for n in dict.fromkeys(cfg.locals):
        k = emu.point_k(n)
        own = replace(emu, per_point=False, time_dilation_points=(), time_dilation=1.0 if k is None else k,
                      time_dilation_auto=k is None and emu.time_dilation_auto)
        out.append(Point(n, replace(cfg, locals=(n,), emulation=own)))
    return out


def point_kept(cfg: ExperimentConfig, model: Any, model_bytes: int, again: Resume) -> bool:
    """Whether a resumed run kept every task of the point `cfg` (holding its locals alone) under every
    scheduler: then it is not brought up again."""
    tasks = [t for ts in task_sets(cfg, model, model_bytes).values() for t in ts]
    return all(again.has(s, t.id) for t in tasks for s in cfg.schedulers)


@dataclass
class _Totals:
    """What the points record as they go (the environment's per-point entries and the summed ones)."""

    ks: dict[str, float]
    calibrations: dict[str, Any]
    walls: dict[str, Any]
    link_samples: int
    cpu: dict[str, float]

    @classmethod
    def of(cls, env: Mapping[str, Any]) -> _Totals:
        """From a resumed run's environment (an empty one for a new run)."""
        return cls(ks=dict(env.get("time_dilation_per_point") or {}),
                   calibrations=dict(env.get("time_dilation_calibration_per_point") or {}),
                   walls=dict(env.get("wall_per_point") or {}), link_samples=int(env.get("link_samples") or 0),
                   cpu={k: float(v) for k, v in env.items() if k.startswith("cpu_s_")})

    def dilation(self) -> dict[str, Any]:
        return {"time_dilation_per_point": dict(self.ks), "time_dilation": max(self.ks.values(), default=1.0),
                "time_dilation_calibration_per_point": dict(self.calibrations)}


def _floor(ks: Mapping[str, float], n_locals: int) -> tuple[float, int]:
    """Where a point's trials start: the largest K of the run's points with fewer locals, and that
    point's locals ((1.0, 0): no such point)."""
    below = [(float(k), int(n)) for n, k in ks.items() if int(n) < n_locals]
    return max(below, default=(1.0, 0))


def run_points(cfg: ExperimentConfig, *, calibrate: Callable[[ExperimentConfig, float, int], Calibration],
               session: Callable[[ExperimentConfig, float, float], Any], record: Callable[..., None],
               recorded: Mapping[str, Any], kept: Callable[[ExperimentConfig], bool] | None = None,
               ) -> tuple[dict[str, int], str]:
    """Run every point of `cfg` in turn (see the module docstring).

    Parameters
    ----------
    calibrate
        A point's calibration (its config, ``time_dilation: auto``; the K its trials start from and the
        locals of the point that K is from): its trials, or this host's K.
    session
        Runs a point's config at K with the run clock starting at the given emulated seconds; returns
        its `orchestrator.experiment.session.SessionEnd`.
    record
        Adds entries to the run's environment.
    recorded
        The run's environment so far: empty for a new run; a resumed run's, whose points' Ks,
        calibrations and wall times it keeps (the config then holds the Ks, `resume.recorded_dilation`).
    kept
        On a resume: whether the run kept every task of a point (then it is not run again).

    Returns
    -------
    The tasks' outcomes by state over every point, and a lost machine's note ('' when none: a lost
    machine ends the run after its point).
    """
    totals, outcomes = _Totals.of(recorded), {"done": 0, "failed": 0, "blocked": 0}
    clock_s = float(recorded.get("clock_end_s") or 0.0)
    for point in points_of(cfg):
        if kept is not None and kept(point.cfg):
            continue
        t0, key = time.monotonic(), str(point.n_locals)
        k = point.cfg.emulation.time_dilation
        if point.cfg.emulation.time_dilation_auto:
            cal = calibrate(point.cfg, *_floor(totals.ks, point.n_locals))
            k, totals.calibrations[key] = cal.k, cal.to_dict()
        totals.ks[key] = k
        record(**totals.dilation())
        calibration_s = time.monotonic() - t0
        end = session(replace(point.cfg, emulation=replace(point.cfg.emulation, time_dilation=k,
                                                           time_dilation_auto=False)), k, clock_s)
        totals.walls[key] = {"k": k, "calibration_s": round(calibration_s, 3), "bringup_s": round(end.bringup_s, 3),
                             "tasks_s": round((end.clock_end_s - clock_s) * k, 3),
                             "emulated_s": round(end.clock_end_s - clock_s, 3), "view_s": round(end.view_s, 3),
                             "wall_s": round(time.monotonic() - t0, 3), "on_trial_emulation": end.reused}
        totals.link_samples += end.link_samples
        totals.cpu = {c: round(totals.cpu.get(c, 0.0) + end.cpu.get(c, 0.0), 3) for c in {*totals.cpu, *end.cpu}}
        clock_s = end.clock_end_s
        record(**totals.dilation(), wall_per_point=dict(totals.walls), link_samples=totals.link_samples,
               wall_s=round(sum(w["tasks_s"] for w in totals.walls.values()), 3), **totals.cpu)
        for state, count in end.outcomes.items():
            outcomes[state] = outcomes.get(state, 0) + count
        if end.lost:
            return outcomes, end.lost
    return outcomes, ""
