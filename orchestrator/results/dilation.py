"""A run's time dilation as its environment records it: the K of each point, and the lines the report
and the printed summary give about K, how it was chosen and what it cost in wall time.

A run at one K records ``time_dilation`` (and, chosen by trials, ``time_dilation_calibration``). A run
with a K per point (`orchestrator.experiment.point_runs`) records ``time_dilation_per_point``
({locals: K}, keys as strings: the environment is JSON), ``time_dilation_calibration_per_point``
({locals: calibration}, when chosen by trials) and ``wall_per_point`` ({locals: the point's wall time
and its parts}); its ``time_dilation`` is the largest of its Ks. Whatever needs the K a figure was
measured at takes it from `k_for`, so that a figure means the same under one K or a K per point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def per_point(env: Mapping[str, Any]) -> dict[int, float]:
    """{locals: K} of a run with a K per point, in the order of locals; {} for a run at one K."""
    raw = env.get("time_dilation_per_point") or {}
    return {int(n): float(k) for n, k in sorted(raw.items(), key=lambda kv: int(kv[0]))}


def k_for(env: Mapping[str, Any], n_locals: int | None) -> float:
    """The K the point of `n_locals` locals ran at: its own in a run with a K per point, else the
    run's (1 when none is recorded)."""
    own = per_point(env).get(n_locals) if n_locals is not None else None
    return own if own is not None else float(env.get("time_dilation") or 1.0)


def locals_text(env: Mapping[str, Any], n_locals: int) -> str:
    """A point's number of locals as a table gives it: with its K (``8 (K=16)``) in a run with a K
    per point, else the number alone."""
    return f"{n_locals}{k_suffix(env, n_locals)}"


def k_suffix(env: Mapping[str, Any], n_locals: int) -> str:
    """`` (K=16)`` after a point in a run with a K per point (its K, `k_for`); '' in a run at one K."""
    return f" (K={k_for(env, n_locals):g})" if per_point(env) else ""


def _how(env: Mapping[str, Any], cal: Mapping[str, Any] | None) -> str:
    """How a K was set: by a calibration `cal` (reused, chosen, or its cap), or in the config or
    from this host's calibration."""
    if not cal:
        return (f"this host's K, from its calibration {env['time_dilation_from']} (time_dilation: host)"
                if env.get("time_dilation_from") else "set in the config")
    start = (f" from K={cal['floor']:g} (the K of the run's point at {cal['floor_locals']} locals)"
             if cal.get("floor_locals") else "")
    if cal.get("reused_from"):
        if start:
            return f"the K of the run's point at {cal['floor_locals']} locals, above the K this host chose for " \
                   f"the same workload on {cal['reused_from']}, no trials"
        return f"reused: this host chose it for the same workload on {cal['reused_from']}, no trials"
    if cal["faithful"]:
        return f"chosen by calibration, the smallest faithful K of those tried{start} up to {cal['cap']:g}"
    return f"NO K{start} up to the calibration's cap {cal['cap']:g} was faithful: the run used the cap"


def _cost(wall: float | None, emulated: float | None, calibration_s: float | None) -> str:
    """``; wall time W s (calibration C s) for E s emulated: R x`` ('' without a wall time)."""
    if not wall:
        return ""
    return (f"; wall time {wall:.1f} s" + (f" (calibration {calibration_s:.1f} s)" if calibration_s is not None else "")
            + (f" for {emulated:.2f} s emulated: {wall / emulated:.0f} x" if emulated else ""))


def _trial_lines(cal: Mapping[str, Any] | None, prefix: str = "") -> list[str]:
    lines = []
    for t in (cal or {}).get("trials", []):
        word = "faithful" if t["faithful"] else "NOT faithful: " + "; ".join(t["reasons"])
        emulated, saturated = t.get("emulated_s"), t.get("host_saturated")
        lines.append(f"{prefix}calibration K={t['k']:g}: {word} (trial {t['wall_s']:.1f} s wall, "
                     f"{'-' if emulated is None else f'{emulated:.2f}'} s emulated, host saturated in "
                     f"{'-' if saturated is None else f'{saturated * 100:.0f}'} % of samples)")
    return lines


def point_wall_line(n_locals: int, k: float, how: str, wall: Mapping[str, Any] | None) -> str:
    """One point's K, how it was set, and its wall time with its parts (trials, bring-up unless it ran
    on its last trial's emulation, the tasks
    and of them the schedulers' background measurements, the rest: starting the servers, settling,
    tearing down) against its emulated time."""
    head = f"{n_locals} locals: K={k:g} ({how})"
    if not wall or not wall.get("wall_s"):
        return head
    total, emulated = float(wall["wall_s"]), wall.get("emulated_s")
    parts = {"trials": wall.get("calibration_s") or 0.0, "bring-up": wall.get("bringup_s") or 0.0,
             "tasks": wall.get("tasks_s") or 0.0}
    if wall.get("on_trial_emulation"):  # its last trial's emulation went on (orchestrator.experiment.kept)
        parts.pop("bring-up")
        head += ", on its last trial's emulation"
    rest = max(0.0, total - sum(parts.values()))
    view = f" (of which the background view {wall['view_s']:.1f} s)" if wall.get("view_s") else ""
    return (f"{head}; wall time {total:.1f} s: " + ", ".join(f"{name} {s:.1f} s" for name, s in parts.items())
            + view + f", the rest {rest:.1f} s"
            + (f"; {emulated:.2f} s emulated: {total / emulated:.0f} x" if emulated else ""))


def _per_point_lines(env: Mapping[str, Any], *, trials: bool) -> list[str]:
    ks = per_point(env)
    cals = env.get("time_dilation_calibration_per_point") or {}
    walls = env.get("wall_per_point") or {}
    spent = [float(c.get("wall_s") or 0.0) for c in cals.values()]
    head = ("time dilation per point: " + ", ".join(f"K={k:g} at {n} locals" for n, k in ks.items())
            + _cost(env.get("run_wall_s"), env.get("clock_end_s"), sum(spent) if cals else None))
    lines = [head]
    for n, k in ks.items():
        cal = cals.get(str(n))
        lines.append(point_wall_line(n, k, _how(env, cal), walls.get(str(n))))
        if trials:
            lines += _trial_lines(cal, prefix=f"{n} locals, ")
    return lines


def dilation_lines(env: Mapping[str, Any], *, trials: bool = True) -> list[str]:
    """The run's time dilation K, how it was set, and its wall-time cost (the run's wall time, the
    calibration's included, over the emulated time it recorded); then, with `trials`, one line per K
    a calibration tried. With a K per point: the Ks first, then each point's K, how it was set and
    its wall time with its parts (`point_wall_line`), each followed by its trials. Empty for a run in
    real time (K 1, not calibrated)."""
    if per_point(env):
        return _per_point_lines(env, trials=trials)
    k, cal = env.get("time_dilation", 1.0), env.get("time_dilation_calibration")
    if k == 1 and not cal:
        return []
    cost = _cost(env.get("run_wall_s"), env.get("clock_end_s"), cal["wall_s"] if cal else None)
    return [f"time dilation K={k:g} ({_how(env, cal)}){cost}"] + (_trial_lines(cal) if trials else [])


def dilation_section(env: Mapping[str, Any]) -> list[str]:
    """The report's "Time dilation" section (`dilation_lines`); none for a run in real time."""
    lines = dilation_lines(env)
    return ["", "## Time dilation", ""] + [f"- {x}" for x in lines] if lines else []
