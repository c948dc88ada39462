"""The summary plots of a run folder, and `draw_figures`: every figure of a run folder, drawn or not.

- ``latency_vs_locals`` and ``bandwidth_vs_locals``: the per-point summaries (`RunSummary.points`)
  against the number of locals, one line per scheduler with error bars (`plot`);
- ``selection_accuracy``: accuracy against cumulative latency and update bytes, when some run of the
  database selected locals (`plot_selection`);
- ``online_bandwidth``: reserved and carried bandwidth and tasks running over time, online mode
  (`plot_online`);

and those of `orchestrator.results.figures`. Readers of the database (through
`orchestrator.results.queries`) and of the summary; nothing here writes the report or the database.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np

from orchestrator.results import forked, queries
from orchestrator.results.db import ResultsDB
from orchestrator.results.figures import Figure, draw_all, pyplot, save_whole
from orchestrator.results.stats import selection_curves
from orchestrator.results.summary import PointSummary, RunSummary, run_summary

FIGURES = ("latency_vs_locals", "bandwidth_vs_locals")
SUMMARY_CAPTIONS = (
    ("latency_vs_locals", "Mean round latency against the number of local models, per scheduler "
     "(error bars: population std over tasks)."),
    ("bandwidth_vs_locals", "Reserved bandwidth against the number of local models, per scheduler "
     "(error bars: population std over tasks)."),
)
SELECTION_CAPTION = ("Local-model selection: mean accuracy after each round against the cumulative round latency "
                     "(left) and the cumulative bytes of the updates sent up the trees (right), one line per run, "
                     "policy and scheduler (means over tasks at each round).")
ONLINE_CAPTION = "Online mode: reserved and carried bandwidth and tasks running over time, one panel per scheduler."


def plot(points: Sequence[PointSummary], out_dir: Path) -> dict[str, dict[str, list[tuple[int, float, float]]]]:
    """Draw latency and reserved bandwidth vs number of locals, one line per scheduler with
    error bars (population std over tasks), as PNG and SVG.

    Returns what was drawn, read back from the figure: {figure: {scheduler: [(x, y, yerr)]}}.
    """
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    drawn: dict[str, dict[str, list[tuple[int, float, float]]]] = {}
    specs = (
        ("latency_vs_locals", "latency_s_mean", "latency_s_std", 1e3, "mean round latency (ms)"),
        ("bandwidth_vs_locals", "reserved_mbps_mean", "reserved_mbps_std", 1e-3, "reserved bandwidth (Gbit/s)"),
    )
    schedulers = sorted({p.scheduler for p in points})
    for fig_name, mean_key, std_key, scale, ylabel in specs:
        fig, ax = plt.subplots(figsize=(6, 4))
        drawn[fig_name] = {}
        for sched in schedulers:
            pts = [p for p in points if p.scheduler == sched and getattr(p, mean_key) is not None]
            if not pts:
                continue
            es = [(getattr(p, std_key) or 0.0) * scale for p in pts]
            container = ax.errorbar([p.n_locals for p in pts], [getattr(p, mean_key) * scale for p in pts],
                                    yerr=es, marker="o", capsize=3, label=sched)
            line = container.lines[0]
            xdata = np.asarray(line.get_xdata(), dtype=float).tolist()
            ydata = np.asarray(line.get_ydata(), dtype=float).tolist()
            drawn[fig_name][sched] = [
                (int(x), y / scale, e / scale) for x, y, e in zip(xdata, ydata, es, strict=True)
            ]
        ax.set_xlabel("number of local models")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        for ext in ("png", "svg"):
            save_whole(fig, out_dir / f"{fig_name}.{ext}")
        plt.close(fig)
    return drawn


def plot_selection(db: ResultsDB, out_dir: Path) -> Figure:
    """The ``selection_accuracy`` figure (see `SELECTION_CAPTION`)."""
    curves = selection_curves(db)
    if not curves:
        return Figure("selection_accuracy", SELECTION_CAPTION, skipped="no round with an accuracy")
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6), sharey=True)
    for label, pts in curves.items():
        left.plot([p[0] for p in pts], [p[2] for p in pts], marker="o", label=label)
        right.plot([p[1] for p in pts], [p[2] for p in pts], marker="o", label=label)
    left.set_xlabel("cumulative round latency (s)")
    right.set_xlabel("cumulative update bytes (MB)")
    left.set_ylabel("accuracy")
    right.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    png = out_dir / "selection_accuracy.png"
    save_whole(fig, png, dpi=120)
    save_whole(fig, png.with_suffix(".svg"))
    plt.close(fig)
    return Figure("selection_accuracy", SELECTION_CAPTION, (png, png.with_suffix(".svg")), drawn=curves)


def plot_online(db: ResultsDB, run_id: int, out_dir: Path) -> Path | None:
    """Reserved and carried bandwidth and the tasks running over time, one panel per scheduler."""
    samples = queries.samples(db.conn, run_id)
    if not samples:
        return None
    plt = pyplot()
    scheds = sorted({s["scheduler"] for s in samples})
    fig, axes = plt.subplots(len(scheds), 1, figsize=(7, 2.6 * len(scheds)), squeeze=False)
    for ax, sched in zip(axes[:, 0], scheds, strict=True):
        rows = [s for s in samples if s["scheduler"] == sched]
        t0 = rows[0]["t_s"]
        t = [r["t_s"] - t0 for r in rows]
        ax.plot(t, [r["reserved_mbps"] / 1e3 for r in rows], label="reserved")
        ax.plot(t, [(r["carried_mbps"] or 0.0) / 1e3 for r in rows], label="carried")
        ax.set_ylabel("Gbit/s")
        ax.set_title(sched)
        ax2 = ax.twinx()
        ax2.step(t, [r["running"] for r in rows], where="post", color="grey", alpha=0.5, label="running")
        ax2.set_ylabel("tasks running")
        ax.legend(loc="upper left", fontsize=8)
    axes[-1, 0].set_xlabel("seconds since the scheduler's first arrival")
    fig.tight_layout()
    path = out_dir / "online_bandwidth.png"
    save_whole(fig, path, dpi=120)
    save_whole(fig, path.with_suffix(".svg"))
    plt.close(fig)
    return path


def draw_figures(db: ResultsDB, run_id: int, out_dir: Path, *, summary: RunSummary | None = None) -> list[Figure]:
    """Every figure of the run folder, drawn or not (with why): the two summary plots (`plot`, of
    `summary`, computed from the rows when not given), those of `orchestrator.results.figures`,
    ``selection_accuracy`` when some run selected locals, and ``online_bandwidth`` before ``online_load``.
    The summary plots are drawn in a forked child while this process draws the others
    (`orchestrator.results.forked`: here instead if the child gives no result)."""
    if summary is None:
        summary = run_summary(db, run_id)
    points = summary.points
    summary_plots = None
    if any(p.latency_s_mean is not None for p in points):
        pyplot()  # imported once, before the fork: the child draws with it
        summary_plots = forked.start(partial(plot, points, out_dir))  # beside the figures below
    try:
        rest = draw_all(db, run_id, out_dir)
    except BaseException:
        if summary_plots is not None:
            summary_plots.close()
        raise
    if summary_plots is not None:
        drawn = {name: {sched: [tuple(xye) for xye in pts] for sched, pts in by_sched.items()}
                 for name, by_sched in summary_plots.result().items()}  # JSON's lists back to plot's tuples
        figures = [Figure(name, caption, (out_dir / f"{name}.png", out_dir / f"{name}.svg"), drawn=drawn[name])
                   for name, caption in SUMMARY_CAPTIONS]
    else:
        figures = [Figure(name, caption, skipped="no task completed a round") for name, caption in SUMMARY_CAPTIONS]
    figures += rest
    if any(r["policy"] != "all" for r in queries.round_selections(db.conn)):
        figures.append(plot_selection(db, out_dir))
    if summary.environment.get("mode") == "online":
        png = plot_online(db, run_id, out_dir)
        online = Figure("online_bandwidth", ONLINE_CAPTION, (png, png.with_suffix(".svg"))) if png is not None \
            else Figure("online_bandwidth", ONLINE_CAPTION, skipped="no samples recorded")
        at = next((i for i, f in enumerate(figures) if f.name == "online_load"), len(figures))
        figures.insert(at, online)
    return figures
