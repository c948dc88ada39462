"""The run folder's figures beyond the summary plots, drawn from a run's database rows alone.

Each figure function takes a `ResultsDB`, a run id and the run folder, writes ``<name>.png`` and
``<name>.svg`` there (matplotlib, Agg backend) and returns a `Figure`: the files written, a caption
for the report, and what was drawn (so tests can check it against the rows). A figure whose data
is absent (a run recorded before a table existed, no link samples, a sequential run for the
online figure) is not drawn: its `Figure` says why in one line, and nothing is raised.

- `round_timeline`: broadcast, training and upload of every node of one task, per round (`node_rounds`);
- `link_utilisation`: utilisation over time of the busiest directed links, AI and background
  traffic stacked (`link_stats`);
- `latency_cdf`: the distribution of round latencies per scheduler (`rounds`);
- `bandwidth_latency`: reserved bandwidth against mean round latency, one point per task
  (`schedules`, `rounds`);
- `online_load`: blocking ratio, tasks running and reserved bandwidth over time, online mode only
  (`task_events`, `samples`).

This module reads the database (through `orchestrator.results.queries`) and writes image files; it
does not write the report (`orchestrator.results.report` does, and lists these figures in it) and never
changes the database. The summary plots and `draw_figures` (every figure of a run folder) are in
`orchestrator.results.summary_figures`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.results import durability, queries
from orchestrator.results.db import ResultsDB

LOG = logging.getLogger("netai.figures")

#: Colours of the three phases of a round (the Gantt) and of the two traffic classes.
PHASE_COLOURS = {"broadcast": "tab:blue", "training": "tab:green", "upload": "tab:orange", "round": "0.85"}
CLASS_COLOURS = {"ai": "tab:red", "background": "tab:gray"}
#: The scheduler whose task the timeline prefers (the paper's flexible scheduler).
FLEXIBLE = "mst"


@dataclass(frozen=True)
class Figure:
    """One figure of a run folder: drawn (`files`, PNG then SVG) or not (`skipped`, one line why)."""

    name: str
    caption: str
    files: tuple[Path, ...] = ()
    skipped: str = ""
    #: What was drawn, read from the rows (figure-specific keys; see each function).
    drawn: Mapping[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.files)


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (files only: a run writes its figures without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, out_dir: Path, name: str) -> tuple[Path, ...]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = (out_dir / f"{name}.png", out_dir / f"{name}.svg")
    try:
        save_whole(fig, paths[0], dpi=120)
        save_whole(fig, paths[1])
    finally:
        pyplot().close(fig)
    return paths


def save_whole(fig: Any, path: Path, **options: Any) -> None:
    """`fig.savefig` whole or not at all (`durability.written_whole`: a full disk leaves no half figure)."""
    with durability.written_whole(path) as part:
        fig.savefig(part, **options)


def scheduler_colours(schedulers: list[str]) -> dict[str, str]:
    """One colour per scheduler, the same in every figure of a run (sorted names, tab10)."""
    return {s: f"C{i % 10}" for i, s in enumerate(sorted(schedulers))}


# -- 1. the round timeline of one task --------------------------------------------------------------
def timeline_task(db: ResultsDB, run_id: int) -> dict[str, Any] | None:
    """The task the timeline shows: among tasks with `node_rounds` rows, a done one first, of the
    flexible scheduler (`FLEXIBLE`) first, with the most locals, the earliest to arrive. None if
    no task has node rows."""
    rows = queries.timeline_candidates(db.conn, run_id)
    if not rows:
        return None
    return min(rows, key=lambda t: (t["state"] != "done", t["scheduler"] != FLEXIBLE, -t["n_locals"],
                                    t["arrival_s"] if t["arrival_s"] is not None else float("inf"),
                                    t["scheduler"], t["task_id"]))


def timeline_bars(nodes: list[dict[str, Any]]) -> tuple[list[str], dict[str, list[tuple[str, float, float]]]]:
    """The bars of a task's timeline from its `node_rounds` rows: (sites top to bottom,
    {phase: [(site, start_s, end_s)]}), phases as in the table's comment: broadcast = [round start,
    received_s], training = [train_start_s, train_end_s], upload = [train_end_s (relays: received_s),
    sent_s]; for G, round = [round start, sent_s]. A round without G's row, or a bar with a missing
    or reversed end, is left out."""
    starts = {r["round"]: r["received_s"] for r in nodes if r["role"] == "global" and r["received_s"] is not None}
    bars: dict[str, list[tuple[str, float, float]]] = {p: [] for p in PHASE_COLOURS}

    def add(phase: str, site: str, a: float | None, b: float | None) -> None:
        if a is not None and b is not None and b >= a:
            bars[phase].append((site, a, b))

    for r in nodes:
        start = starts.get(r["round"])
        if start is None:
            continue
        if r["role"] == "global":
            add("round", r["site"], start, r["sent_s"])
            continue
        add("broadcast", r["site"], start, r["received_s"])
        if r["role"] == "local":
            add("training", r["site"], r["train_start_s"], r["train_end_s"])
            add("upload", r["site"], r["train_end_s"], r["sent_s"])
        else:
            add("upload", r["site"], r["received_s"], r["sent_s"])
    rank = {"global": 0, "local": 1, "relay": 2}
    sites = sorted({(rank.get(r["role"], 3), r["site"]) for r in nodes})
    return [s for _, s in sites], bars


def round_timeline(db: ResultsDB, run_id: int, out_dir: Path) -> Figure:
    """A Gantt chart of one task (`timeline_task`): per node and round, when the global model
    travelled to it, when it trained, when its update travelled up; G's bar spans each round.

    drawn: ``task`` (scheduler, task_id, n_locals, state), ``sites`` (top to bottom), ``rounds``,
    ``bars`` ({phase: number of bars})."""
    name = "round_timeline"
    task = timeline_task(db, run_id)
    if task is None:
        return Figure(name, "Round timeline of one task", skipped="no per-node round times (node_rounds is empty)")
    nodes = queries.node_rounds(db.conn, run_id, task["scheduler"], task["task_id"])
    sites, bars = timeline_bars(nodes)
    if not any(bars.values()):
        return Figure(name, "Round timeline of one task",
                      skipped=f"{task['scheduler']} task {task['task_id']}: no round with its global node's start")
    t0 = min(a for phase in bars.values() for _, a, _ in phase)
    plt = pyplot()
    from matplotlib.patches import Patch

    height_in = 1.6 + 0.38 * len(sites)
    fig, ax = plt.subplots(figsize=(9, height_in))
    y = {s: len(sites) - 1 - i for i, s in enumerate(sites)}
    for phase, colour in PHASE_COLOURS.items():
        height = 0.8 if phase == "round" else 0.6
        for site in sites:
            spans = [(a - t0, b - a) for s, a, b in bars[phase] if s == site]
            if spans:
                ax.broken_barh(spans, (y[site] - height / 2, height), facecolors=colour,
                               edgecolor="0.6" if phase == "round" else "none", linewidth=0.5)
    for start in sorted({a for _, a, _ in bars["round"]}):
        ax.axvline(start - t0, color="0.5", linestyle=":", linewidth=0.8)
    roles = {r["site"]: r["role"] for r in nodes}
    ax.set_yticks([y[s] for s in sites], [f"{s} ({'G' if roles[s] == 'global' else roles[s]})" for s in sites],
                  fontsize=8)
    ax.set_xlabel("seconds since the task's first round started")
    rounds = sorted({r["round"] for r in nodes})
    ax.set_title(f"Round timeline: {task['scheduler']} task {task['task_id']}, {task['n_locals']} locals, "
                 f"{len(rounds)} rounds ({task['state']})", fontsize=10)
    legend = [Patch(facecolor=c, edgecolor="0.6" if p == "round" else "none",
                    label="G: round, to its aggregation" if p == "round" else p) for p, c in PHASE_COLOURS.items()]
    fig.legend(handles=legend, loc="lower center", ncol=4, fontsize=8, frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout(rect=(0, 0.35 / height_in, 1, 1))
    caption = (f"Round timeline of {task['scheduler']} task {task['task_id']} ({task['n_locals']} locals, "
               f"{task['state']}): per node and round, broadcast (global model on its way to the node), "
               f"training, and upload (the node's update on its way up); G's bar spans each round up to its "
               f"aggregation.")
    drawn = {"task": dict(task), "sites": sites, "rounds": rounds, "bars": {p: len(v) for p, v in bars.items()}}
    return Figure(name, caption, _save(fig, out_dir, name), drawn=drawn)


# -- 2. link utilisation over time ------------------------------------------------------------------
def busiest_links(rows: list[dict[str, Any]], top: int) -> list[tuple[str, str, float]]:
    """The `top` directed links by mean utilisation (rate_mbps / capacity_mbps over their samples
    with a capacity), as (a, b, mean utilisation), busiest first (ties by name)."""
    sums: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if r["capacity_mbps"] > 0:
            sums.setdefault((r["a"], r["b"]), []).append(r["rate_mbps"] / r["capacity_mbps"])
    means = [(a, b, sum(u) / len(u)) for (a, b), u in sums.items()]
    return sorted(means, key=lambda x: (-x[2], x[0], x[1]))[:top]


def down_intervals(samples: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The intervals [first down sample, next up sample) of one link's samples in time order; one
    still down at the end lasts to its last sample."""
    out: list[tuple[float, float]] = []
    start: float | None = None
    for r in samples:
        if not r["up"] and start is None:
            start = r["t_s"]
        elif r["up"] and start is not None:
            out.append((start, r["t_s"]))
            start = None
    if start is not None:
        out.append((start, samples[-1]["t_s"]))
    return out


def link_utilisation(db: ResultsDB, run_id: int, out_dir: Path, *, top: int = 6) -> Figure:
    """Utilisation over time of the `top` busiest directed links, one panel each: AI (task) and
    background traffic stacked, each over the link's emulated capacity, and the port's total rate
    (all classes) as a line; intervals where the link was down are shaded.

    drawn: ``links`` ([(a, b, mean utilisation)], busiest first), ``samples`` (rows per link)."""
    name = "link_utilisation"
    caption = f"Utilisation of the {top} busiest directed links over time"
    rows = queries.link_stats(db.conn, run_id)
    if not rows:
        return Figure(name, caption, skipped="no link samples (link_stats is empty)")
    links = busiest_links(rows, top)
    if not links:
        return Figure(name, caption, skipped="no link sample has a capacity (capacity_mbps is 0 throughout)")
    plt = pyplot()
    cols = 2 if len(links) > 1 else 1
    nrows = (len(links) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 2.3 * nrows + 0.6), squeeze=False, sharex=True,
                             sharey=True)
    samples: dict[tuple[str, str], int] = {}
    for ax, (a, b, mean) in zip(axes.flat, links, strict=False):
        mine = [r for r in rows if r["a"] == a and r["b"] == b and r["capacity_mbps"] > 0]
        samples[(a, b)] = len(mine)
        t = [r["t_s"] for r in mine]
        ai = [r["ai_mbps"] / r["capacity_mbps"] for r in mine]
        bg = [r["background_mbps"] / r["capacity_mbps"] for r in mine]
        ax.stackplot(t, ai, bg, colors=[CLASS_COLOURS["ai"], CLASS_COLOURS["background"]], alpha=0.6,
                     labels=["AI tasks", "background"])
        ax.plot(t, [r["rate_mbps"] / r["capacity_mbps"] for r in mine], color="black", linewidth=0.7,
                label="port total")
        for start, end in down_intervals(mine):
            ax.axvspan(start, end, color="tab:purple", alpha=0.2, linewidth=0, label="link down")
        ax.set_title(f"{a} → {b} (mean {mean:.0%})", fontsize=9)
        ax.grid(alpha=0.3)
    top_util = max(max(r["rate_mbps"], r["ai_mbps"] + r["background_mbps"]) / r["capacity_mbps"]
                   for r in rows if (r["a"], r["b"]) in samples and r["capacity_mbps"] > 0)
    axes.flat[0].set_ylim(0, max(1.0, top_util * 1.05))  # shared: the panels compare at a glance
    for ax in axes.flat[len(links):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("utilisation", fontsize=8)
    for ax in axes[-1, :]:
        ax.set_xlabel("run clock (s)", fontsize=8)
    legend: dict[str, Any] = {}
    for ax in axes.flat[:len(links)]:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=len(legend), fontsize=8,
               frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    caption = (f"Utilisation over time of the {len(links)} busiest directed links (by mean utilisation): AI "
               f"task traffic and background traffic stacked, each over the link's emulated capacity, as the "
               f"flow entries matched it (offered to the link: above the line where the link's queue dropped), "
               f"the port's total rate (what the link sent) as a line, and the intervals the link was down shaded.")
    return Figure(name, caption, _save(fig, out_dir, name), drawn={"links": links, "samples": samples})


# -- 3. round latency CDF ---------------------------------------------------------------------------
def latency_cdf(db: ResultsDB, run_id: int, out_dir: Path) -> Figure:
    """The empirical CDF of per-round latency, one line per scheduler (every recorded round, every
    number of locals pooled; rounds with stragglers included).

    drawn: {scheduler: sorted latencies in seconds}."""
    name = "latency_cdf"
    rows = queries.round_latencies(db.conn, run_id)
    if not rows:
        return Figure(name, "Round latency CDF per scheduler", skipped="no rounds recorded")
    by: dict[str, list[float]] = {}
    for r in rows:
        by.setdefault(r["scheduler"], []).append(r["latency_s"])
    colours = scheduler_colours(list(by))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for sched, lat in by.items():
        n = len(lat)
        # from 0 at the smallest latency, then up by 1/n at each round's latency
        ax.step([lat[0] * 1e3] + [x * 1e3 for x in lat], [0.0] + [(i + 1) / n for i in range(n)], where="post",
                color=colours[sched], label=f"{sched} ({n} rounds)")
    ax.set_xlabel("round latency (ms)")
    ax.set_ylabel("fraction of rounds")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Round latency CDF (all rounds, all numbers of locals)", fontsize=10)
    fig.tight_layout()
    caption = ("Distribution of per-round latency per scheduler (every recorded round, every number of locals "
               "pooled, rounds with stragglers included).")
    return Figure(name, caption, _save(fig, out_dir, name), drawn=by)


# -- 4. reserved bandwidth against latency ------------------------------------------------------------
def bandwidth_latency_points(db: ResultsDB, run_id: int) -> dict[str, list[tuple[int, int, float, float]]]:
    """Per scheduler, one (task_id, n_locals, reserved_mbps, mean round latency s) per task that was
    scheduled and completed a round; the mean is over its rounds without a straggler (all of its
    rounds if every one had one)."""
    rows = queries.task_latencies(db.conn, run_id)
    out: dict[str, list[tuple[int, int, float, float]]] = {}
    for r in rows:
        lat = r["clean_s"] if r["clean_s"] is not None else r["all_s"]
        out.setdefault(r["scheduler"], []).append((r["task_id"], r["n_locals"], r["reserved_mbps"], lat))
    return out


def bandwidth_latency(db: ResultsDB, run_id: int, out_dir: Path) -> Figure:
    """The trade-off: a task's reserved bandwidth against its mean round latency, one point per task,
    one colour per scheduler, each scheduler's mean as a large cross.

    drawn: `bandwidth_latency_points`."""
    name = "bandwidth_latency"
    points = bandwidth_latency_points(db, run_id)
    if not points:
        return Figure(name, "Reserved bandwidth against round latency",
                      skipped="no scheduled task completed a round")
    colours = scheduler_colours(list(points))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for sched, pts in points.items():
        xs = [p[2] / 1e3 for p in pts]
        ys = [p[3] * 1e3 for p in pts]
        ax.scatter(xs, ys, s=18, alpha=0.7, color=colours[sched], label=f"{sched} ({len(pts)} tasks)")
        ax.scatter([sum(xs) / len(xs)], [sum(ys) / len(ys)], s=140, marker="X", color=colours[sched],
                   edgecolors="black", linewidths=0.8)
    ax.set_xlabel("reserved bandwidth of the task (Gbit/s)")
    ax.set_ylabel("mean round latency (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Reserved bandwidth against round latency (one point per task; X: mean)", fontsize=10)
    fig.tight_layout()
    caption = ("Trade-off between a task's reserved bandwidth and its mean round latency (rounds without a "
               "straggler), one point per task, each scheduler's mean as a large X.")
    return Figure(name, caption, _save(fig, out_dir, name), drawn=points)


# -- 5. online: blocking ratio and load over time ----------------------------------------------------
def blocking_over_time(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(t_s, blocked so far / arrived so far) at every arrival or blocking, from one scheduler's
    `task_events` rows in time order (arrival = a task's first 'pending')."""
    arrived: set[int] = set()
    blocked: set[int] = set()
    out = []
    for e in events:
        if e["state"] == "pending":
            arrived.add(e["task_id"])
        elif e["state"] == "blocked":
            arrived.add(e["task_id"])
            blocked.add(e["task_id"])
        else:
            continue
        out.append((e["t_s"], len(blocked) / len(arrived)))
    return out


def online_load(db: ResultsDB, run_id: int, out_dir: Path) -> Figure:
    """Online mode: per scheduler, over the seconds since its trace began, the blocking ratio so far
    (`task_events`), the tasks running and the reserved bandwidth (`samples`).

    drawn: {scheduler: {"blocking": [(t, ratio)], "running": [(t, n)], "reserved_mbps": [(t, mbps)]}}
    with t in seconds since the scheduler's first event or sample."""
    name = "online_load"
    caption = "Blocking ratio and load over time (online mode)"
    if db.run(run_id)["environment"].get("mode") != "online":
        return Figure(name, caption, skipped="not an online run (tasks did not arrive over time)")
    events = queries.task_events(db.conn, run_id)
    samples = queries.samples(db.conn, run_id)
    if not events and not samples:
        return Figure(name, caption, skipped="no task events and no samples recorded")
    scheds = sorted({r["scheduler"] for r in events} | {r["scheduler"] for r in samples})
    colours = scheduler_colours(scheds)
    drawn: dict[str, dict[str, list[tuple[float, float]]]] = {}
    plt = pyplot()
    fig, axes = plt.subplots(3, 1, figsize=(7, 7), sharex=True)
    for sched in scheds:
        ev = [e for e in events if e["scheduler"] == sched]
        sa = [s for s in samples if s["scheduler"] == sched]
        t0 = min([e["t_s"] for e in ev[:1]] + [s["t_s"] for s in sa[:1]])
        blocking = [(t - t0, ratio) for t, ratio in blocking_over_time(ev)]
        running = [(s["t_s"] - t0, float(s["running"])) for s in sa]
        reserved = [(s["t_s"] - t0, s["reserved_mbps"]) for s in sa]
        drawn[sched] = {"blocking": blocking, "running": running, "reserved_mbps": reserved}
        for ax, series, scale in ((axes[0], blocking, 1.0), (axes[1], running, 1.0), (axes[2], reserved, 1e-3)):
            if series:
                ax.step([t for t, _ in series], [v * scale for _, v in series], where="post",
                        color=colours[sched], label=sched)
    notes = []
    if not events:
        notes.append("no task events: blocking ratio not drawn")
    if not samples:
        notes.append("no samples: load not drawn")
    axes[0].set_ylabel("blocking ratio\nso far")
    axes[0].set_ylim(-0.02, 1.02)
    axes[1].set_ylabel("tasks running")
    axes[2].set_ylabel("reserved (Gbit/s)")
    axes[2].set_xlabel("seconds since the scheduler's trace began")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    axes[0].set_title("Online: blocking ratio and load over time" + (f" ({'; '.join(notes)})" if notes else ""),
                      fontsize=10)
    fig.tight_layout()
    caption = ("Online mode, per scheduler over its trace: the blocking ratio so far (blocked / arrived), the "
               "tasks running and their reserved bandwidth." + (f" ({'; '.join(notes)}.)" if notes else ""))
    return Figure(name, caption, _save(fig, out_dir, name), drawn=drawn)


FIGURES: tuple[Callable[[ResultsDB, int, Path], Figure], ...] = (
    latency_cdf, bandwidth_latency, round_timeline, link_utilisation, online_load,
)


def draw_all(db: ResultsDB, run_id: int, out_dir: Path) -> list[Figure]:
    """Every figure of `FIGURES`, in order. One that fails to draw is logged and reported as not
    drawn, so that the report (and the other figures) are still written."""
    out = []
    for draw in FIGURES:
        try:
            out.append(draw(db, run_id, out_dir))
        except Exception as e:
            LOG.exception("drawing %s failed", draw.__name__)
            pyplot().close("all")
            out.append(Figure(draw.__name__, draw.__name__, skipped=f"drawing failed: {type(e).__name__}: {e}"))
    return out
