"""`netai validate`'s output: the agreement tables (text) and the figure of simulated against
emulated mean round latency per task. Readers of `orchestrator.results.agreement`'s figures: the
numbers printed, written to ``validation.json`` and drawn come from one computation."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from orchestrator.results.agreement import ClaimAgreement, PointAgreement
from orchestrator.results.fidelity import Verdict
from orchestrator.results.figures import pyplot, save_whole, scheduler_colours
from orchestrator.results.summary import TaskSummary, retrans_text

#: The targets the validation is read against (docs/simulation.md, "Flow-level simulation").
LATENCY_TOLERANCE = 0.10
CARRIED_TOLERANCE = 0.02


def _ms(x: float) -> str:
    return f"{x * 1e3:.1f}"


def point_lines(points: Sequence[PointAgreement]) -> list[str]:
    """One line per (scheduler, locals): means, sim/emu with its 95 % interval, carried bytes and,
    beside them, the emulation's TCP retransmitted share (the simulation has no TCP)."""
    out = [f"{'point':<22}{'emulated ms':>12}{'simulated ms':>13}{'sim/emu':>9}{'95 % interval':>18}"
           f"{'tasks':>7}{'carried sim/emu':>17}{'emu TCP retrans':>17}  within 10 %"]
    for p in points:
        carried = "-" if p.carried_ratio is None else f"{p.carried_ratio:.4f}"
        out.append(f"{p.scheduler + ', ' + str(p.n_locals) + ' locals':<22}{_ms(p.emulated_s):>12}"
                   f"{_ms(p.simulated_s):>13}{p.latency.ratio:>9.3f}"
                   f"{f'[{p.latency.low:.3f}, {p.latency.high:.3f}]':>18}{p.latency.tasks:>7}{carried:>17}"
                   f"{retrans_text(p.emulated_retrans_share):>17}  "
                   f"{'yes' if p.latency.within(LATENCY_TOLERANCE) else 'NO'}")
    return out


PARTS = (("broadcast_s", "broadcast"), ("train_s", "training"), ("upload_s", "upload"),
         ("training_span_s", "every training"))


def parts_lines(emulated: dict[tuple[str, int], dict[str, float]], simulated: dict[tuple[str, int], dict[str, float]]
                ) -> list[str]:
    """Where each point's round goes, emulated / simulated ms (`queries.point_parts`): the parts of
    the critical path (broadcast to the local that trained last, its training, the upload after it)
    and the mean span of every local's training."""
    out = [f"{'round parts, emulated / simulated ms':<22}" + "".join(f"{name:>20}" for _, name in PARTS)]
    for key in sorted(set(emulated) & set(simulated), key=lambda k: (k[1], k[0])):
        cells = []
        for col, _ in PARTS:
            e, s = emulated[key].get(col), simulated[key].get(col)
            cells.append("-" if e is None or s is None else f"{_ms(e)} / {_ms(s)}")
        out.append(f"{key[0] + ', ' + str(key[1]) + ' locals':<22}" + "".join(f"{c:>20}" for c in cells))
    return out


def fidelity_lines(run_dir: Path, run_id: int, points: list[tuple[str, int]], *, compute_modelled: bool) -> list[str]:
    """The emulated reference's own fidelity verdict per point of `points` (`reference_lines`)."""
    from orchestrator.results.db import ResultsDB
    from orchestrator.results.fidelity import run_verdicts

    with ResultsDB(run_dir / "results.db") as db:
        return reference_lines(run_verdicts(db, run_id, points, compute_modelled=compute_modelled))


def reference_lines(verdicts: Sequence[Verdict]) -> list[str]:
    """The emulated reference's own fidelity verdict per point (`results.fidelity`): a ratio to a
    point that measured the host (slow hops, overrun trainings, links not fed) is a ratio to the
    host as much as to the emulated network, which the simulation does not model."""
    bad = [v for v in verdicts if not v.faithful]
    out = [f"emulated reference: {len(bad)} of {len(verdicts)} points NOT faithful (its report's \"Fidelity\")"]
    for v in bad:
        why = "; ".join(r.split(":")[0] for r in v.reasons)
        out.append(f"  {v.scheduler}, {v.n_locals} locals: {why}")
    return out


def unfaithful_headline(verdicts: Sequence[Verdict]) -> str | None:
    """The line `netai validate` puts first when its emulated reference is not faithful (None when it is)."""
    bad = [v for v in verdicts if not v.faithful]
    if not bad:
        return None
    at = ", ".join(f"{v.scheduler} at {v.n_locals} locals" for v in bad)
    return (f"the emulated reference is NOT faithful at {len(bad)} of {len(verdicts)} points ({at}): its figures "
            "there are the host's as much as the emulated network's, so this run does not validate the "
            "simulation (recorded as reference_faithful: false; exit status 1)")


def claim_lines(claims: Sequence[ClaimAgreement]) -> list[str]:
    """One line per claim ratio: each engine's paired ratio and interval, and whether they overlap."""
    out = [f"{'claim (mean round latency)':<30}{'emulated':>26}{'simulated':>26}  overlap"]
    for c in claims:
        def fmt(r: Any) -> str:
            return "-" if r is None else f"{r.mean:.3f} [{r.low:.3f}, {r.high:.3f}]"
        overlap = "-" if c.overlap is None else ("yes" if c.overlap else "NO")
        out.append(f"{f'{c.numerator}/{c.denominator} at {c.n_locals} locals':<30}{fmt(c.emulated):>26}"
                   f"{fmt(c.simulated):>26}  {overlap}")
    return out


def carried_line(points: Sequence[PointAgreement]) -> str:
    ratios = [p.carried_ratio for p in points if p.carried_ratio is not None]
    if not ratios:
        return "carried bytes: not recorded in both runs"
    worst = max(abs(r - 1) for r in ratios)
    return (f"carried bytes (sim/emu per point): {min(ratios):.4f} to {max(ratios):.4f}, worst {worst:.2%} "
            f"({'within' if worst <= CARRIED_TOLERANCE else 'NOT within'} {CARRIED_TOLERANCE:.0%})")


def schedule_identity(emulated: Mapping[tuple[str, int], str], simulated: Mapping[tuple[str, int], str]
                      ) -> tuple[int, list[tuple[str, int]]]:
    """How many (scheduler, task) decisions there are in either engine (`queries.decisions`), and
    those that differ (another schedule, blocked in one engine only, or in one engine only)."""
    keys = sorted(set(emulated) | set(simulated))
    return len(keys), [k for k in keys if emulated.get(k) != simulated.get(k)]


def schedules_line(total: int, differing: Sequence[tuple[str, int]]) -> str:
    """Whether both engines' schedulers made the same decisions: where they did not, the tasks'
    figures (carried bytes first) differ for that reason, not the engines'."""
    if not differing:
        return f"decisions (scheduler, task): the same in both engines for all {total}"
    listed = ", ".join(f"{s} task {t}" for s, t in differing)
    return (f"decisions (scheduler, task): the same in both engines for {total - len(differing)} of {total}; "
            f"differing: {listed}")


def background_view_line(source: str, measured_totals: Sequence[float], modelled_total: float | None) -> str:
    """What the schedulers were told of the background in each engine, and how the modelled view
    (the simulation's own, without a replay) compares with the emulation's measurements."""
    if not measured_totals:
        return f"scheduler background: {source}"
    mean = sum(measured_totals) / len(measured_totals)
    text = (f"scheduler background: {source}; measured, summed over links: mean {mean:.1f} Mbit/s over "
            f"{len(measured_totals)} tasks [{min(measured_totals):.1f}, {max(measured_totals):.1f}]")
    if modelled_total:
        text += f", the simulation's modelled view {modelled_total:.1f} (measured/modelled {mean / modelled_total:.3f})"
    return text


def retrans_line(points: Sequence[PointAgreement]) -> str:
    """Where "emu TCP retrans" comes from, and the simulation's share (which it does not model)."""
    shares = [p.emulated_retrans_share for p in points if p.emulated_retrans_share is not None]
    emu = ("not measured" if not shares else
           f"{min(shares):.3%} to {max(shares):.3%} of the data bytes sent, per point")
    return (f"TCP retransmissions (emulation, the agents' kernel tcp_info): {emu}; simulation: "
            f"{retrans_text(None, modelled=False)} (a fluid model has no TCP)")


def as_json(points: Sequence[PointAgreement], claims: Sequence[ClaimAgreement], extra: dict[str, Any]
            ) -> dict[str, Any]:
    return {**extra, "points": [asdict(p) for p in points],
            "claims": [{**asdict(c), "overlap": c.overlap} for c in claims]}


def draw_tasks(pairs: Sequence[tuple[TaskSummary, TaskSummary]], out_dir: Path, title: str) -> tuple[Path, ...]:
    """Simulated against emulated mean round latency, one marker per task (colour: scheduler,
    marker: locals), with the diagonal and the 10 % band; ``sim_vs_emu.png`` and ``.svg``."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 5.5))
    colours = scheduler_colours(sorted({e.scheduler for e, _ in pairs}))
    markers = dict(zip(sorted({e.n_locals for e, _ in pairs}), "os^Dv<>ph", strict=False))
    top = 0.0
    for e, s in pairs:
        x, y = float(e.mean_latency_s or 0.0) * 1e3, float(s.mean_latency_s or 0.0) * 1e3
        top = max(top, x, y)
        ax.scatter([x], [y], color=colours[e.scheduler], marker=markers.get(e.n_locals, "o"), s=36)
    top *= 1.08
    ax.plot([0, top], [0, top], color="black", lw=1)
    ax.fill_between([0, top], [0, top * (1 - LATENCY_TOLERANCE)], [0, top * (1 + LATENCY_TOLERANCE)],
                    color="grey", alpha=0.15, label="within 10 %")
    for sched, colour in colours.items():
        ax.scatter([], [], color=colour, marker="o", label=sched)
    for n, marker in markers.items():
        ax.scatter([], [], color="grey", marker=marker, label=f"{n} locals")
    ax.set(xlim=(0, top), ylim=(0, top), xlabel="emulated mean round latency per task (ms)",
           ylabel="simulated mean round latency per task (ms)", title=title)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = (out_dir / "sim_vs_emu.png", out_dir / "sim_vs_emu.svg")
    save_whole(fig, paths[0], dpi=120)
    save_whole(fig, paths[1])
    plt.close(fig)
    return paths
