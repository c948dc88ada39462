"""A sweep's report: its runs side by side, and where the model's size changes, the regimes figure.

A sweep (``sweep`` in a config, `orchestrator.experiment.config`) runs one config per entry, each in
its own run folder under the sweep's. This module reads their databases (through
`orchestrator.results.summary` and `orchestrator.results.stats`) and writes the sweep folder's
``report.md`` (and ``report.html``): per run, the model's size, the time dilation, each scheduler's
latency ratio against spff on the same tasks (95 % bootstrap interval) at the runs' largest number of
locals, and each point's fidelity verdict.

When the runs' models differ in size, the ``regimes`` figure plots those ratios against the model's
size (bytes, log scale) and marks where flexible scheduling starts to pay (`pays_from`): the smallest
size from which the flexible scheduler's whole interval is below 1 at that size and every larger one.
Points whose verdict is not faithful are drawn hollow. Nothing here runs anything or changes a database.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.results.db import ResultsDB
from orchestrator.results.dilation import k_for
from orchestrator.results.durability import written_whole
from orchestrator.results.figures import Figure, pyplot, save_whole, scheduler_colours
from orchestrator.results.report_html import markdown_to_html
from orchestrator.results.stats import PairedRatio, paired_ratio
from orchestrator.results.summary import RunSummary, run_summary

FLEXIBLE = "mst"
FIXED = "spff"
CAPTION = ("Mean round latency of each scheduler over spff's on the same tasks (mean of per-task ratios, 95 % "
           "bootstrap interval) against the model's size; below 1 the scheduler is faster. The dashed line marks "
           "where mst starts to pay (its interval below 1 from there on); hollow markers: not faithful.")


@dataclass(frozen=True)
class RegimePoint:
    """One run of a sweep: its model, its dilation, its ratios against spff and its verdicts."""

    run_dir: Path
    name: str
    status: str
    model_bytes: int
    n_locals: int | None
    #: The K its point at `n_locals` ran at (`dilation.k_for`: the run's, or that point's own).
    time_dilation: float
    wall_s: float | None
    #: scheduler -> its latency ratio against spff at `n_locals` (None: not measured).
    ratios: dict[str, PairedRatio | None]
    #: scheduler -> "faithful" or "NOT faithful" at `n_locals`, with the reasons.
    verdicts: dict[str, tuple[str, tuple[str, ...]]]

    def faithful(self, scheduler: str) -> bool:
        return all(self.verdicts.get(s, ("", ()))[0] == "faithful" for s in (scheduler, FIXED))


def regime_point(run_dir: Path, summary: RunSummary) -> RegimePoint:
    """One run of a sweep from its summary: ratios and verdicts at its largest number of locals."""
    n = summary.locals_seen[-1] if summary.locals_seen else None
    others = sorted({t.scheduler for t in summary.tasks} - {FIXED})
    ratios = {s: None if n is None else paired_ratio(summary.tasks, n_locals=n, numerator=s, denominator=FIXED)
              for s in others}
    env = summary.environment
    return RegimePoint(
        run_dir=run_dir, name=summary.name, status=summary.status,
        model_bytes=max((t.model_bytes for t in summary.tasks), default=0), n_locals=n,
        time_dilation=k_for(env, n), wall_s=env.get("run_wall_s"), ratios=ratios,
        verdicts={v.scheduler: (v.word, v.reasons) for v in summary.verdicts if v.n_locals == n})


def read_points(run_dirs: Sequence[Path]) -> list[RegimePoint]:
    """The sweep's runs that left a database, in the order given."""
    out = []
    for d in run_dirs:
        if (d / "results.db").is_file():
            with ResultsDB(d / "results.db") as db:
                out.append(regime_point(d, run_summary(db, 1)))
    return out


def pays_from(points: Sequence[tuple[int, PairedRatio | None]]) -> int | None:
    """The smallest model size from which the ratio's whole interval is below 1 at every size measured
    (None: at no size, or the largest size not below 1); sizes without a ratio are skipped."""
    measured = sorted((size, r) for size, r in points if r is not None)
    start = None
    for size, r in measured:
        if r.high < 1:
            start = size if start is None else start
        else:
            start = None
    return start


def plot_regimes(points: Sequence[RegimePoint], out_dir: Path) -> Figure:
    """The ``regimes`` figure (see the module docstring); not drawn with fewer than two model sizes."""
    if len({p.model_bytes for p in points}) < 2:
        return Figure("regimes", CAPTION, skipped="the runs do not differ in model size")
    plt = pyplot()
    schedulers = sorted({s for p in points for s in p.ratios})
    colours = scheduler_colours([*schedulers, FIXED])
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    drawn: dict[str, list[tuple[int, float, float, float]]] = {}
    for s in schedulers:
        pts = sorted((p.model_bytes, r, p.faithful(s)) for p in points if (r := p.ratios.get(s)) is not None)
        drawn[s] = [(b, r.mean, r.low, r.high) for b, r, _ok in pts]
        ax.plot([b for b, _r, _ok in pts], [r.mean for _b, r, _ok in pts], color=colours[s], label=f"{s} / spff")
        for b, r, ok in pts:
            ax.errorbar([b], [r.mean], yerr=[[r.mean - r.low], [r.high - r.mean]], fmt="o", color=colours[s],
                        mfc=colours[s] if ok else "white", capsize=3)
    ax.axhline(1.0, color="0.5", lw=0.8)
    highs = [h for pts in drawn.values() for _b, _m, _lo, h in pts]
    ax.set_ylim(0, max(1.15, *highs) * 1.05)  # the line at 1 (spff) always in view
    start = pays_from([(p.model_bytes, p.ratios.get(FLEXIBLE)) for p in points])
    if start is not None:
        ax.axvline(start, color=colours.get(FLEXIBLE, "k"), ls="--", lw=1)
        ax.annotate(f"mst pays from {start / 1e6:.3g} MB", (start, ax.get_ylim()[1]), xytext=(4, -12),
                    textcoords="offset points", fontsize=8)
    files = save_size_axes(plt, fig, ax, out_dir, "regimes", legend_size=8)
    return Figure("regimes", CAPTION, files, drawn={"ratios": drawn, "pays_from": start})


def save_size_axes(plt: Any, fig: Any, ax: Any, out_dir: Path, name: str, *, legend_size: int) -> tuple[Path, Path]:
    """Finish a figure of ratios against spff over the model's size (log axis) and write it as
    ``name``.png and .svg in `out_dir`; the files."""
    ax.set_xscale("log")
    ax.set_xlabel("model size (bytes)")
    ax.set_ylabel("round latency / spff's")
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    files = (out_dir / f"{name}.png", out_dir / f"{name}.svg")
    save_whole(fig, files[0], dpi=120)
    save_whole(fig, files[1])
    plt.close(fig)
    return files


def sweep_lines(points: Sequence[RegimePoint]) -> list[str]:
    """The sweep's table (markdown), one row per run and scheduler, and where mst starts to pay."""
    lines = ["| run | model bytes | locals | K | wall s | scheduler / spff | ratio | 95 % CI | tasks | verdict "
             "(scheduler, spff) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in points:
        for s, r in sorted(p.ratios.items()):
            ci = "-" if r is None else f"[{r.low:.3f}, {r.high:.3f}]"
            words = f"{p.verdicts.get(s, ('-', ()))[0]}, {p.verdicts.get(FIXED, ('-', ()))[0]}"
            lines.append(f"| {p.name} | {p.model_bytes} | {p.n_locals} | {p.time_dilation:g} "
                         f"| {'-' if p.wall_s is None else f'{p.wall_s:.0f}'} | {s} | "
                         f"{'-' if r is None else f'{r.mean:.3f}'} | {ci} | {0 if r is None else r.tasks} | {words} |")
    start = pays_from([(p.model_bytes, p.ratios.get(FLEXIBLE)) for p in points])
    pay = (f"mst starts to pay from {start} bytes (its interval below 1 from there on)." if start
           else "mst does not pay at any size measured (its interval is not below 1 up to the largest).")
    unfaithful = [p.name for p in points if FLEXIBLE in p.ratios and not p.faithful(FLEXIBLE)]
    if unfaithful:
        pay += (f" Not faithful (mst or spff): {', '.join(unfaithful)}; these ratios are the instrument's too "
                "(see each run's Fidelity section).")
    return [*lines, "", pay]


def write_sweep_report(sweep_dir: Path, run_dirs: Sequence[Path], *, name: str) -> Path:
    """The sweep folder's ``report.md`` and ``report.html`` (see the module docstring)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    points = read_points(run_dirs)
    figure = plot_regimes(points, sweep_dir)
    lines = [f"# Sweep: {name}", "", f"{len(points)} runs, each with its own report:", ""]
    lines += [f"- [{p.name}]({p.run_dir.name}/report.md): {p.status}, model {p.model_bytes} bytes" for p in points]
    lines += ["", "## Latency against spff, by run", "", *sweep_lines(points)]
    unfaithful = [f"- {p.name} {s}: {'; '.join(reasons)}" for p in points for s, (word, reasons) in p.verdicts.items()
                  if word != "faithful"]
    if unfaithful:
        lines += ["", "**Not faithful** (these points measured the host too):", "", *unfaithful]
    lines += ["", "## Figures", ""]
    lines += (["### `regimes`", "", "![regimes](regimes.svg)", "", figure.caption] if figure.ok
              else [f"- `regimes` not drawn: {figure.skipped}"])
    path = sweep_dir / "report.md"
    text = "\n".join(lines) + "\n"
    with written_whole(path) as part:
        part.write_text(text)
    with written_whole(sweep_dir / "report.html") as part:
        part.write_text(markdown_to_html(text, base_dir=sweep_dir))
    return path
