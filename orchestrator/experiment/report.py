"""Turn a run's database rows into the results a researcher reads: CSVs, figures, a report.

Summaries are computed from the database only (never from in-memory state of the runner), so
anything plotted can be recomputed from the rows (`tests/unit/test_experiment_pieces.py` does).

Per task: its mean round latency over the rounds it completed without a straggler (rounds with
one are counted separately), its reserved bandwidth, its carried bytes, its mean ratios of
measured round latency to the round's lower bound and to the physical reference, and its final
accuracy. Per point (scheduler, number of locals): the mean and the population standard
deviation of those over the point's tasks that ran.

Schedulers are compared on the same tasks (`paired_ratio`): the mean over tasks of the per-task
ratio of one scheduler's figure to the other's, with a 95 % percentile-bootstrap confidence
interval and the number of tasks and rounds behind it.

`write_report` draws every figure of the run folder (the two summary plots here, the online
bandwidth plot, and those of `orchestrator.experiment.figures`), lists them in ``report.md``
(with one line why for each one not drawn) and writes ``report.html`` beside it: the same
content, self-contained (figures embedded as data URIs, CSS inline, no script, no external
reference), converted from the markdown by the small converter at the end of this module.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import re
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from orchestrator.experiment.faults import NOT_APPLIED
from orchestrator.experiment.figures import Figure, draw_all
from orchestrator.experiment.results_db import ResultsDB

FIGURES = ("latency_vs_locals", "bandwidth_vs_locals")


@dataclass(frozen=True)
class TaskResult:
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


@dataclass(frozen=True)
class PointSummary:
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


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _std(xs: list[float]) -> float | None:
    return statistics.pstdev(xs) if xs else None


def task_results(db: ResultsDB, run_id: int) -> list[TaskResult]:
    tasks = db.query(
        "SELECT t.scheduler, t.task_id, t.n_locals, t.state, t.reason, t.carried_bytes, t.model_bytes, t.setup_json, "
        "t.arrival_s, t.admitted_s, t.first_broadcast_s, t.finished_s, t.start_overhead_s, s.reserved_mbps "
        "FROM tasks t LEFT JOIN schedules s USING (run_id, scheduler, task_id) WHERE t.run_id = ? "
        "ORDER BY t.scheduler, t.n_locals, t.task_id",
        (run_id,),
    )
    rounds: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in db.query("SELECT * FROM rounds WHERE run_id = ? ORDER BY round", (run_id,)):
        rounds.setdefault((r["scheduler"], r["task_id"]), []).append(r)
    out = []
    for t in tasks:
        every = rounds.get((t["scheduler"], t["task_id"]), [])
        rs = [r for r in every if not r["stragglers"]]
        ratios = [r["latency_s"] / r["lower_bound_s"] for r in rs if r["lower_bound_s"]]
        to_ref = [r["latency_s"] / r["reference_s"] for r in rs if r["reference_s"]]
        bc = [r["broadcast_all_s"] / r["broadcast_bound_s"] for r in rs if r["broadcast_bound_s"]]
        accs = [r["accuracy"] for r in every if r["accuracy"] is not None]
        setup = json.loads(t["setup_json"] or "{}")
        out.append(
            TaskResult(
                scheduler=t["scheduler"],
                task_id=t["task_id"],
                n_locals=t["n_locals"],
                state=t["state"],
                reserved_mbps=t["reserved_mbps"] if t["state"] != "blocked" else None,
                carried_bytes=t["carried_bytes"],
                rounds=len(every),
                mean_latency_s=_mean([r["latency_s"] for r in rs]),
                mean_ratio_to_bound=_mean(ratios),
                final_accuracy=accs[-1] if accs else None,
                model_bytes=t["model_bytes"],
                straggler_rounds=len(every) - len(rs),
                mean_ratio_to_reference=_mean(to_ref),
                mean_broadcast_to_bound=_mean(bc),
                agents_ready_s=setup.get("agents_ready_s"),
                connect_s=setup.get("connect_s"),
                chunk_bytes=setup.get("chunk_bytes"),
                reservation_enforced=setup.get("reservation_enforced"),
                arrival_s=t["arrival_s"], admitted_s=t["admitted_s"], first_broadcast_s=t["first_broadcast_s"],
                finished_s=t["finished_s"], start_overhead_s=t["start_overhead_s"],
                completion_s=None if t["finished_s"] is None or t["arrival_s"] is None
                else t["finished_s"] - t["arrival_s"],
                rounds_s=sum(r["latency_s"] for r in every) if every else None,
                reason=t["reason"] or "",
            )
        )
    return out


def useful_time(tasks: list[TaskResult], clock_end_s: float | None) -> float | None:
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


def max_overlap(tasks: list[TaskResult]) -> int:
    """The largest number of tasks running at one time (admitted, not yet finished)."""
    edges = sorted([(t.admitted_s, 1) for t in tasks if t.admitted_s is not None and t.finished_s is not None]
                   + [(t.finished_s, -1) for t in tasks if t.admitted_s is not None and t.finished_s is not None])
    best = cur = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


def summarize(db: ResultsDB, run_id: int) -> list[PointSummary]:
    by: dict[tuple[str, int], list[TaskResult]] = {}
    for tr in task_results(db, run_id):
        by.setdefault((tr.scheduler, tr.n_locals), []).append(tr)
    points = []
    for (scheduler, n), trs in sorted(by.items()):
        ran = [t for t in trs if t.mean_latency_s is not None]
        lat = [t.mean_latency_s for t in ran if t.mean_latency_s is not None]
        res = [t.reserved_mbps for t in ran if t.reserved_mbps is not None]
        carried = [t.carried_bytes / 1e6 for t in ran if t.carried_bytes is not None]
        ratio = [t.mean_ratio_to_bound for t in ran if t.mean_ratio_to_bound is not None]
        acc = [t.final_accuracy for t in ran if t.final_accuracy is not None]
        points.append(
            PointSummary(
                scheduler=scheduler, n_locals=n, tasks=len(trs), tasks_ran=len(ran),
                blocked=sum(t.state == "blocked" for t in trs),
                latency_s_mean=_mean(lat), latency_s_std=_std(lat),
                reserved_mbps_mean=_mean(res), reserved_mbps_std=_std(res),
                carried_mb_mean=_mean(carried), ratio_to_bound_mean=_mean(ratio), accuracy_mean=_mean(acc),
                straggler_rounds=sum(t.straggler_rounds for t in trs),
                ratio_to_reference_mean=_mean([t.mean_ratio_to_reference for t in ran
                                               if t.mean_ratio_to_reference is not None]),
            )
        )
    return points


def write_csvs(db: ResultsDB, run_id: int, out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, rows in (
        ("rounds", db.query("SELECT * FROM rounds WHERE run_id = ? ORDER BY scheduler, task_id, round", (run_id,))),
        ("tasks", [asdict(t) for t in task_results(db, run_id)]),
        ("summary", [asdict(p) for p in summarize(db, run_id)]),
    ):
        path = out_dir / f"{name}.csv"
        with path.open("w", newline="") as f:
            if rows:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
        paths.append(path)
    return paths


def plot(points: list[PointSummary], out_dir: Path) -> dict[str, dict[str, list[tuple[int, float, float]]]]:
    """Draw latency and reserved bandwidth vs number of locals, one line per scheduler with
    error bars (population std over tasks), as PNG and SVG.

    Returns what was drawn, read back from the figure: {figure: {scheduler: [(x, y, yerr)]}}.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
            xs = [p.n_locals for p in pts]
            ys = [getattr(p, mean_key) * scale for p in pts]
            es = [(getattr(p, std_key) or 0.0) * scale for p in pts]
            container = ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=sched)
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
            fig.savefig(out_dir / f"{fig_name}.{ext}")
        plt.close(fig)
    return drawn


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


def bootstrap_ci(values: list[float], *, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile-bootstrap interval of the mean of `values` (seeded: reproducible)."""
    arr = np.asarray(values, dtype=float)
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, len(arr), size=(resamples, len(arr)))].mean(axis=1)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def paired_ratio(tasks: list[TaskResult], *, n_locals: int, numerator: str, denominator: str,
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


def claims(points: list[PointSummary], *, n_locals: int = 8, flexible: str = "mst", fixed: str = "spff") -> dict[str, Any]:
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


def draw_figures(db: ResultsDB, run_id: int, out_dir: Path) -> list[Figure]:
    """Every figure of the run folder, drawn or not (with why): the two summary plots (`plot`),
    those of `orchestrator.experiment.figures`, and `online_bandwidth` before `online_load`."""
    points = summarize(db, run_id)
    specs = (("latency_vs_locals", "Mean round latency against the number of local models, per scheduler "
              "(error bars: population std over tasks)."),
             ("bandwidth_vs_locals", "Reserved bandwidth against the number of local models, per scheduler "
              "(error bars: population std over tasks)."))
    if any(p.latency_s_mean is not None for p in points):
        drawn = plot(points, out_dir)
        summary = [Figure(name, caption, (out_dir / f"{name}.png", out_dir / f"{name}.svg"), drawn=drawn[name])
                   for name, caption in specs]
    else:
        summary = [Figure(name, caption, skipped="no task completed a round") for name, caption in specs]
    figures = summary + draw_all(db, run_id, out_dir)
    if any(r["policy"] != "all" for r in selection_rows(db)):
        figures.append(plot_selection(db, out_dir))
    online_caption = "Online mode: reserved and carried bandwidth and tasks running over time, one panel per scheduler."
    if db.run(run_id)["environment"].get("mode") == "online":
        png = plot_online(db, run_id, out_dir)
        online = Figure("online_bandwidth", online_caption, (png, png.with_suffix(".svg"))) if png is not None \
            else Figure("online_bandwidth", online_caption, skipped="no samples recorded")
        at = next((i for i, f in enumerate(figures) if f.name == "online_load"), len(figures))
        figures.insert(at, online)
    return figures


def _figures_section(figures: Sequence[Figure]) -> list[str]:
    lines = ["", "## Figures", "", "Each figure is in this folder as PNG and SVG.", ""]
    for f in figures:
        if f.ok:
            lines += [f"### `{f.name}`", "", f"![{f.name}]({f.name}.svg)", "", f.caption, ""]
    skipped = [f for f in figures if not f.ok]
    if skipped:
        lines += ["### Not drawn", ""] + [f"- `{f.name}`: {f.skipped}" for f in skipped] + [""]
    return lines


def _simulation_model(env: dict[str, Any]) -> list[str]:
    """The report's "Simulation model" section: each parameter of a simulated run and how it was set."""
    defaults = set(env.get("defaults", []))

    def how(*keys: str) -> str:
        if all(k in defaults for k in keys):
            return "default"
        return "set in the config" + (" (see how below)" if env.get("calibration") else "")

    cpu = int(env.get("cpu_cores") or 0)
    lines = ["**Simulated run**: these figures come from the flow-level model on SimGrid "
             "(`orchestrator/simulation`), not from the emulation; no model was trained (no accuracy).", "",
             "## Simulation model", "",
             f"- link rates: {env.get('rates', '?')} (bw_scale {env.get('bw_scale', '?')}); flows share links max-min",
             f"- TCP efficiency factor {env.get('tcp_efficiency', '?')} ({how('tcp_efficiency')}; 1.0 by default, "
             "the calibration derives 1448/1514: TCP payload per Ethernet frame at MTU 1500, as htb counts it)",
             f"- propagation: fiber delay {'on' if env.get('delay_emulated') else 'off'}, plus "
             f"{env.get('per_hop_latency_ms', '?')} ms per hop ({how('per_hop_latency_ms')})",
             f"- per-chunk work at each sender: {env.get('alpha_s', '?')} s ({how('alpha_s')}; by default the "
             "emulation's own figure, `orchestrator/runtime/timing.py` ALPHA_S); chunk size as the emulation "
             "chooses it unless the config fixes it",
             f"- segments per transfer: {env.get('max_segments') or 'one per chunk'} ({how('max_segments')})",
             f"- training: {env.get('seconds_per_example', '?')} s per example and epoch, "
             f"{env.get('local_epochs', '?')} epochs, {env.get('train_examples', '?')} examples split among "
             f"the locals ({how('seconds_per_example')}; the default is a placeholder, not measured)"]
    if cpu:
        lines.append(f"- CPU: {cpu} cores shared by every site's processes; per transfer "
                     f"{env.get('cpu_s_per_byte', 0)} s per byte and {env.get('cpu_s_per_chunk', 0)} s per chunk "
                     "in the sender's and receiver's processes (one core each), and "
                     f"{env.get('cpu_s_per_byte_hop', 0)} s per byte and hop on the switch's one thread "
                     f"({how('cpu_cores', 'cpu_s_per_byte', 'cpu_s_per_chunk', 'cpu_s_per_byte_hop')})")
    else:
        lines.append("- CPU: not modelled (`cpu_cores` 0, the default): transfers never wait for CPU")
    if env.get("calibration"):
        lines.append(f"- how the parameters were set: {env['calibration']}")
    lines += ["- these parameters are the config's `simulation` section (defaults in "
              "`orchestrator/experiment/config.py`); `benchmarks/bench_simulation.py --calibrate` sets them from an "
              "emulated run (derived, measured, one fitted) and tests the fit", ""]
    return lines


def write_report(db: ResultsDB, run_id: int, out_dir: Path, *, figures: Sequence[Figure] | None = None) -> Path:
    """A markdown report (the environment, the summary table, the paper's two claims, the paired
    ratios, where the time went, the online section, the figures) and the same as self-contained
    ``report.html`` beside it. Draws the figures (`draw_figures`) unless they are given.

    Returns the path of ``report.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if figures is None:
        figures = draw_figures(db, run_id, out_dir)
    run = db.run(run_id)
    points = summarize(db, run_id)
    tasks = task_results(db, run_id)
    lines = [f"# Run {run_id}: {run['name']}", "", f"Status: **{run['status']}**"
             + (f" ({run['note']})" if run.get("note") else ""), ""]
    failed = [t for t in tasks if t.state == "failed"]
    if failed:
        lines += [f"**{len(failed)} of {len(tasks)} tasks failed.** First reasons:", ""]
        lines += [f"- {t.scheduler} task {t.task_id}: {t.reason or 'no reason recorded'}" for t in failed[:5]]
        lines.append("")
    if run.get("engine") == "simulation":
        lines += _simulation_model(run["environment"])
    lines += ["## Environment", ""]
    for k, v in sorted(run["environment"].items()):
        lines.append(f"- {k}: {v}")
    lines += ["", "## Summary", "",
              "| scheduler | locals | tasks ran / total | blocked | latency ms (mean ± std) | reserved Gbit/s (mean ± std) "
              "| carried MB | latency / lower bound | latency / reference | rounds with stragglers | accuracy |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
        return "-" if x is None else f"{x * scale:.{digits}f}"

    for p in points:
        lines.append(
            f"| {p.scheduler} | {p.n_locals} | {p.tasks_ran} / {p.tasks} | {p.blocked} "
            f"| {fmt(p.latency_s_mean, 1e3, 1)} ± {fmt(p.latency_s_std, 1e3, 1)} "
            f"| {fmt(p.reserved_mbps_mean, 1e-3)} ± {fmt(p.reserved_mbps_std, 1e-3)} "
            f"| {fmt(p.carried_mb_mean, 1, 1)} | {fmt(p.ratio_to_bound_mean)} | {fmt(p.ratio_to_reference_mean)} "
            f"| {p.straggler_rounds} | {fmt(p.accuracy_mean, 1, 3)} |"
        )
    locals_seen = sorted({p.n_locals for p in points})
    if locals_seen:
        n = 8 if 8 in locals_seen else locals_seen[-1]
        c = claims(points, n_locals=n)
        lines += ["", f"## The paper's two claims, at {n} local models", ""]
        for key, text in (("bandwidth", "reserved bandwidth"), ("latency", "mean round latency")):
            ratio = c[f"{key}_ratio"]
            if ratio is None:
                lines.append(f"- {text}: not measured (no data for both schedulers)")
            else:
                verdict = "lower" if ratio < 1 else "not lower"
                lines.append(
                    f"- {text}: mst / spff = {ratio:.3f} (mst is {verdict}); spread over tasks (std/mean): "
                    f"mst {fmt(c[f'{key}_cv_mst'], 1, 3)}, spff {fmt(c[f'{key}_cv_spff'], 1, 3)}"
                )
    lines += _paired_section(db, run_id, locals_seen)
    lines += _time_section(tasks, run["environment"].get("clock_end_s"))
    if run["environment"].get("mode") == "online":
        lines += _online_section(db, run_id, tasks)
    lines += _faults_section(db, run_id)
    lines += selection_section(db)
    lines += _figures_section(figures)
    path = out_dir / "report.md"
    text = "\n".join(lines)
    path.write_text(text)
    (out_dir / "report.html").write_text(markdown_to_html(text, base_dir=out_dir))
    return path


def _paired_section(db: ResultsDB, run_id: int, locals_seen: list[int]) -> list[str]:
    """Latency ratios of every scheduler to spff on the same tasks, with 95 % bootstrap intervals,
    and the figures outside the rounds (start-up, connection set-up, chunk size, reservations)."""
    tasks = task_results(db, run_id)
    others = sorted({t.scheduler for t in tasks} - {"spff"})
    lines = ["", "## Latency against spff on the same tasks", "",
             "Mean over tasks of the per-task ratio of mean round latency (rounds with stragglers left out), "
             "95 % percentile-bootstrap interval.", "",
             "| scheduler / spff | locals | ratio | 95 % CI | half-width / ratio | tasks | rounds |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for sched in others:
        for n in locals_seen:
            pr = paired_ratio(tasks, n_locals=n, numerator=sched, denominator="spff")
            if pr is not None:
                lines.append(f"| {sched} | {n} | {pr.mean:.3f} | [{pr.low:.3f}, {pr.high:.3f}] "
                             f"| {pr.half_width_rel:.3f} | {pr.tasks} | {pr.rounds} |")
    ran = [t for t in tasks if t.agents_ready_s is not None]
    if ran:
        def avg(xs: list[float]) -> str:
            return f"{statistics.fmean(xs):.3f}" if xs else "-"

        overhead = [t.start_overhead_s for t in ran if t.start_overhead_s is not None]
        lines += ["", "## Outside the rounds", "",
                  f"- start overhead (admission to G's first broadcast byte), median: "
                  f"{statistics.median(overhead):.3f} s" if overhead else "- start overhead: -",
                  f"- roles ready (sent to the site servers to the last one listening), mean: "
                  f"{avg([t.agents_ready_s or 0 for t in ran])} s",
                  f"- connection set-up (every overlay edge, before round 1), mean: "
                  f"{avg([t.connect_s or 0 for t in ran])} s",
                  f"- chunk sizes used: {sorted({t.chunk_bytes for t in ran if t.chunk_bytes})}",
                  f"- tasks whose reservation was enforced on the links: "
                  f"{sum(bool(t.reservation_enforced) for t in ran)} of {len(ran)}"]
    return lines


def _time_section(tasks: list[TaskResult], clock_end_s: float | None) -> list[str]:
    useful = useful_time(tasks, clock_end_s)
    if useful is None or clock_end_s is None:
        return []
    return ["", "## Where the time went", "",
            f"- run wall time after bring-up: {clock_end_s:.1f} s; time in rounds (any task in a round): "
            f"{useful * clock_end_s:.1f} s; useful time {useful:.3f}",
            f"- most tasks running at once: {max_overlap(tasks)}"]


def online_figures(db: ResultsDB, run_id: int, tasks: list[TaskResult]) -> list[dict[str, Any]]:
    """Per scheduler: tasks, blocked, failed, blocking ratio, mean round latency, median completion
    time, most tasks at once, peak memory in use, mean reserved and carried bandwidth, and the CPU
    seconds each site's server used over the scheduler's trace."""
    out = []
    for sched in sorted({t.scheduler for t in tasks}):
        ts = [t for t in tasks if t.scheduler == sched]
        lat = [t.mean_latency_s for t in ts if t.mean_latency_s is not None]
        comp = [t.completion_s for t in ts if t.completion_s is not None and t.state == "done"]
        samples = db.query("SELECT * FROM samples WHERE run_id = ? AND scheduler = ? ORDER BY t_s", (run_id, sched))
        mem = [s["memory_used_bytes"] for s in samples if s["memory_used_bytes"] is not None]
        carried = [s["carried_mbps"] for s in samples if s["carried_mbps"] is not None]
        cpu = db.query("SELECT site, MAX(cpu_s) - MIN(cpu_s) AS cpu FROM site_samples WHERE run_id = ? "
                       "AND scheduler = ? GROUP BY site ORDER BY site", (run_id, sched))
        out.append({
            "scheduler": sched, "tasks": len(ts), "done": sum(t.state == "done" for t in ts),
            "blocked": sum(t.state == "blocked" for t in ts), "failed": sum(t.state == "failed" for t in ts),
            "blocking_ratio": sum(t.state == "blocked" for t in ts) / len(ts),
            "latency_s_mean": _mean(lat), "completion_s_median": statistics.median(comp) if comp else None,
            "max_overlap": max_overlap(ts), "memory_peak_bytes": max(mem) if mem else None,
            "reserved_mbps_mean": _mean([s["reserved_mbps"] for s in samples]),
            "carried_mbps_mean": _mean(carried),
            "site_cpu_s": {r["site"]: round(r["cpu"], 2) for r in cpu},
        })
    return out


def _not_applied(fault: Mapping[str, Any]) -> bool:
    """A `faults` row of an event the trace ended before (recorded, never applied)."""
    return not fault["ok"] and str(fault["detail"]).startswith(NOT_APPLIED)


def fault_figures(db: ResultsDB, run_id: int) -> list[dict[str, Any]]:
    """Per label (scheduler, or scheduler/policy): events applied (and of those failed), events the
    trace ended before (not applied), tasks done and failed, moves,
    rounds retried (a move resumes at the round in flight), mean interruption, mean round latency,
    and the predicted saving the moves bought (old minus new round bound, summed)."""
    labels = [r["scheduler"] for r in db.query("SELECT DISTINCT scheduler FROM tasks WHERE run_id = ? ORDER BY "
                                               "scheduler", (run_id,))]
    out = []
    for label in labels:
        q = (run_id, label)
        tasks = db.query("SELECT state FROM tasks WHERE run_id = ? AND scheduler = ?", q)
        moves = db.query("SELECT * FROM moves WHERE run_id = ? AND scheduler = ?", q)
        faults = db.query("SELECT ok, detail FROM faults WHERE run_id = ? AND scheduler = ?", q)
        applied = [f for f in faults if not _not_applied(f)]
        lat = db.query("SELECT latency_s FROM rounds WHERE run_id = ? AND scheduler = ?", q)
        gaps = [m["interruption_s"] for m in moves if m["interruption_s"] is not None]
        saved = [m["old_bound_s"] - m["new_bound_s"] for m in moves
                 if m["old_bound_s"] is not None and m["new_bound_s"] is not None]
        out.append({
            "scheduler": label, "events": len(applied), "events_failed": sum(1 for f in applied if not f["ok"]),
            "events_not_applied": len(faults) - len(applied),
            "done": sum(1 for t in tasks if t["state"] == "done"),
            "failed": sum(1 for t in tasks if t["state"] == "failed"),
            "moves": len(moves), "rounds_retried": len(moves),
            "interruption_s_mean": _mean(gaps), "latency_s_mean": _mean([r["latency_s"] for r in lat]),
            "saved_bound_s": sum(saved) if saved else None,
        })
    return out


def _faults_section(db: ResultsDB, run_id: int) -> list[str]:
    if not db.query("SELECT 1 FROM faults WHERE run_id = ? UNION SELECT 1 FROM moves WHERE run_id = ?",
                    (run_id, run_id)):
        return []

    def f(x: float | None, d: int = 3) -> str:
        return "-" if x is None else f"{x:.{d}f}"

    lines = ["", "## Faults and rescheduling", "",
             "Every label ran the same tasks and the same events (each at a time from its first task's arrival, "
             "or after a round of a task; the times listed are when each was applied, or when the trace ended "
             "for one it ended before). "
             "A move stops the task's roles, schedules it again on the network as it is, and resumes at "
             "the round after the last one G completed (the round in flight is retried); its interruption "
             "runs from the end of that round to the start of the next.", "",
             "| label | events applied (failed) | not applied | done | failed | moves | mean interruption s "
             "| mean round latency ms | predicted saving s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for o in fault_figures(db, run_id):
        lat = None if o["latency_s_mean"] is None else o["latency_s_mean"] * 1e3
        lines.append(f"| {o['scheduler']} | {o['events']} ({o['events_failed']}) | {o['events_not_applied']} "
                     f"| {o['done']} | {o['failed']} "
                     f"| {o['moves']} | {f(o['interruption_s_mean'])} | {f(lat, 1)} | {f(o['saved_bound_s'])} |")
    lines += ["", "Events:", ""]
    for e in db.query("SELECT * FROM faults WHERE run_id = ? ORDER BY scheduler, at_s", (run_id,)):
        lines.append(f"- {e['scheduler']}: {e['at_s']:.2f} s {e['action']} {e['target']}"
                     f"{'' if e['ok'] or _not_applied(e) else ' FAILED'}{': ' + e['detail'] if e['detail'] else ''}")
    moves = db.query("SELECT * FROM moves WHERE run_id = ? ORDER BY scheduler, task_id, move", (run_id,))
    if moves:
        lines += ["", "Moves:", ""]
    for m in moves:
        gap = "-" if m["interruption_s"] is None else f"{m['interruption_s']:.3f} s"
        lines.append(f"- {m['scheduler']} task {m['task_id']} move {m['move']} at {m['at_s']:.2f} s ({m['reason']}): "
                     f"resumed at round {m['resumed_round']}, interruption {gap}, round bound "
                     f"{f(m['old_bound_s'])} -> {f(m['new_bound_s'])} s, reserved "
                     f"{f(m['old_reserved_mbps'], 0)} -> {f(m['new_reserved_mbps'], 0)} Mbit/s")
    for t in db.query("SELECT scheduler, task_id, reason FROM tasks WHERE run_id = ? AND state = 'failed'",
                      (run_id,)):
        lines.append(f"- {t['scheduler']} task {t['task_id']} failed: {t['reason']}")
    return lines


def _online_section(db: ResultsDB, run_id: int, tasks: list[TaskResult]) -> list[str]:
    def f(x: float | None, scale: float = 1.0, d: int = 3) -> str:
        return "-" if x is None else f"{x * scale:.{d}f}"

    lines = ["", "## Online: tasks arriving and running side by side", "",
             "| scheduler | tasks | done | blocked | failed | blocking ratio | latency ms (mean) "
             "| completion s (median) | most at once | peak memory GB | reserved Gbit/s (mean) "
             "| carried Gbit/s (mean) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    figs = online_figures(db, run_id, tasks)
    for o in figs:
        lines.append(f"| {o['scheduler']} | {o['tasks']} | {o['done']} | {o['blocked']} | {o['failed']} "
                     f"| {o['blocking_ratio']:.3f} | {f(o['latency_s_mean'], 1e3, 1)} | {f(o['completion_s_median'], 1, 1)} "
                     f"| {o['max_overlap']} | {f(o['memory_peak_bytes'], 1e-9, 2)} | {f(o['reserved_mbps_mean'], 1e-3)} "
                     f"| {f(o['carried_mbps_mean'], 1e-3)} |")
    lines += ["", "CPU seconds used by each site's server over each scheduler's trace:", ""]
    for o in figs:
        lines.append(f"- {o['scheduler']}: " + ", ".join(f"{s} {c}" for s, c in o["site_cpu_s"].items()))
    lines += ["", "Figures: `online_bandwidth` (reserved and carried bandwidth and tasks running over time) and "
              "`online_load` (blocking ratio and load over time), under Figures below."]
    return lines


# -- local-model selection (docs/selection.md) ---------------------------------------------------------
SELECTION_CAPTION = ("Local-model selection: mean accuracy after each round against the cumulative round latency "
                     "(left) and the cumulative bytes of the updates sent up the trees (right), one line per run, "
                     "policy and scheduler (means over tasks at each round).")


def selection_rows(db: ResultsDB) -> list[dict[str, Any]]:
    """Every recorded round with its selection, of every run in the database (so that runs with
    different policies compare in one report): run_id, scheduler, task_id, round, policy,
    selected (list), upload_bytes, latency_s, accuracy."""
    rows = db.query(
        "SELECT s.run_id, s.scheduler, s.task_id, s.round, s.policy, s.selected_json, s.upload_bytes, "
        "r.latency_s, r.accuracy FROM round_selection s JOIN rounds r USING (run_id, scheduler, task_id, round) "
        "ORDER BY s.run_id, s.scheduler, s.task_id, s.round")
    for r in rows:
        r["selected"] = json.loads(r.pop("selected_json"))
    return rows


def selection_curves(db: ResultsDB) -> dict[str, list[tuple[float, float, float]]]:
    """Per ``run N: policy, scheduler``: (cumulative latency s, cumulative upload MB, accuracy) after
    each round index, each the mean over the tasks that completed that round."""
    by_task: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in selection_rows(db):
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


def plot_selection(db: ResultsDB, out_dir: Path) -> Figure:
    """The ``selection_accuracy`` figure (see `SELECTION_CAPTION`)."""
    curves = selection_curves(db)
    if not curves:
        return Figure("selection_accuracy", SELECTION_CAPTION, skipped="no round with an accuracy")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.savefig(png, dpi=120)
    fig.savefig(png.with_suffix(".svg"))
    plt.close(fig)
    return Figure("selection_accuracy", SELECTION_CAPTION, (png, png.with_suffix(".svg")), drawn=curves)


def selection_section(db: ResultsDB) -> list[str]:
    """Per run, policy and scheduler: rounds, locals trained per round, latency, update bytes and the
    final accuracy (only when some run of the database selected locals)."""
    rows = selection_rows(db)
    if not any(r["policy"] != "all" for r in rows):
        return []
    groups: dict[tuple[int, str, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["run_id"], r["policy"], r["scheduler"]), []).append(r)
    lines = ["", "## Local-model selection", "",
             "Every run of this database that recorded rounds (docs/selection.md). Locals per round: those G "
             "chose (all, without selection: -). Final accuracy: mean over tasks of their last round's.", "",
             "| run | policy | scheduler | rounds | locals per round | round latency ms (mean) "
             "| update MB per round (mean) | final accuracy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (run, policy, sched), rs in sorted(groups.items()):
        last: dict[int, dict[str, Any]] = {}
        for r in rs:
            last[r["task_id"]] = r
        finals = [r["accuracy"] for r in last.values() if r["accuracy"] is not None]
        chosen = [len(r["selected"]) for r in rs if r["selected"]]
        lines.append(
            f"| {run} | {policy} | {sched} | {len(rs)} | {f'{statistics.fmean(chosen):.1f}' if chosen else '-'} "
            f"| {statistics.fmean(r['latency_s'] for r in rs) * 1e3:.1f} "
            f"| {statistics.fmean(r['upload_bytes'] for r in rs) / 1e6:.3f} "
            f"| {f'{statistics.fmean(finals):.3f}' if finals else '-'} |")
    return lines


def plot_online(db: ResultsDB, run_id: int, out_dir: Path) -> Path | None:
    """Reserved and carried bandwidth and the tasks running over time, one panel per scheduler."""
    samples = db.query("SELECT * FROM samples WHERE run_id = ? ORDER BY scheduler, t_s", (run_id,))
    if not samples:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.savefig(path, dpi=120)
    fig.savefig(path.with_suffix(".svg"))
    plt.close(fig)
    return path


# -- report.html: the markdown above, self-contained --------------------------------------------------
#: Over this size an SVG figure is embedded as its PNG sibling instead (long link time series).
SVG_EMBED_MAX_BYTES = 1_500_000
_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 72rem; margin: 2rem auto;
       padding: 0 1rem; color: #222; line-height: 1.45; }
h1, h2, h3 { line-height: 1.2; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: .5rem 0; font-size: .9rem; }
th, td { border: 1px solid #ccc; padding: .25rem .5rem; text-align: left; }
th { background: #f3f3f3; } tr:nth-child(even) td { background: #fafafa; }
code { background: #f3f3f3; padding: 0 .2rem; border-radius: 3px; }
figure { margin: 1rem 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
"""
_IMAGE = re.compile(r"^!\[(?P<alt>[^\]]*)\]\((?P<src>[^)\s]+)\)$")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")


def _is_local(ref: str) -> bool:
    """A plain relative reference (no scheme, not protocol- or root-relative, no way up)."""
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", ref) and not ref.startswith(("/", "\\")) \
        and ".." not in Path(ref).parts


def _inline(text: str) -> str:
    """Escape `text` and render its inline markdown: `code`, **bold**, and links to local files
    (any other link target is kept as text)."""
    out = []
    for part in re.split(r"(`[^`]*`)", text):
        if len(part) >= 2 and part.startswith("`") and part.endswith("`"):
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
            continue
        s = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(part, quote=False))
        out.append(_LINK.sub(lambda m: f'<a href="{m[2].replace(chr(34), "&quot;")}">{m[1]}</a>' if _is_local(m[2])
                             else f"{m[1]} ({m[2]})", s))
    return "".join(out)


def _data_uri(base_dir: Path, src: str) -> str | None:
    """The local image `src` (relative to `base_dir`) as a data URI: an SVG over
    `SVG_EMBED_MAX_BYTES` with a PNG beside it as the PNG. None if it is not a local file."""
    if not _is_local(src):
        return None
    path = base_dir / src
    if path.suffix == ".svg" and path.is_file() and path.stat().st_size > SVG_EMBED_MAX_BYTES \
            and path.with_suffix(".png").is_file():
        path = path.with_suffix(".png")
    mime = {".svg": "image/svg+xml", ".png": "image/png"}.get(path.suffix)
    if mime is None or not path.is_file():
        return None
    return f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"


def _table(rows: list[str]) -> list[str]:
    cells = [[c.strip() for c in r.strip().strip("|").split("|")] for r in rows]
    head, body = cells[0], cells[1:]
    if body and all(re.fullmatch(r":?-{3,}:?", c) for c in body[0]):
        body = body[1:]
    out = ["<table>", "<thead><tr>" + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr></thead>", "<tbody>"]
    out += ["<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body]
    return [*out, "</tbody>", "</table>"]


def markdown_to_html(text: str, *, base_dir: Path) -> str:
    """The report's markdown as one self-contained HTML page.

    Handles what `write_report` writes: headings, paragraphs, ``- `` lists, pipe tables, inline
    code, bold, links to local files, and images alone on a line, which are embedded from
    `base_dir` as data URIs (an image that is not a local file is shown as its text). The page has
    its CSS inline, no script and no reference outside itself.
    """
    body: list[str] = []
    para: list[str] = []
    items: list[str] = []
    table: list[str] = []

    def flush() -> None:
        if para:
            body.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()
        if items:
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()
        if table:
            body.extend(_table(table))
            table.clear()

    title = "report"
    for line in text.splitlines():
        stripped = line.strip()
        heading = re.match(r"^(#{1,6})\s+(.*)$", stripped)
        image = _IMAGE.match(stripped)
        if stripped.startswith("|"):
            if not table:
                flush()
            table.append(stripped)
            continue
        if table or not stripped:
            flush()
        if not stripped:
            continue
        if heading:
            flush()
            level = len(heading[1])
            if level == 1 and title == "report":
                title = heading[2]
            body.append(f"<h{level}>{_inline(heading[2])}</h{level}>")
        elif image:
            flush()
            uri = _data_uri(base_dir, image["src"])
            alt = html.escape(image["alt"])
            body.append(f'<figure><img src="{uri}" alt="{alt}"></figure>' if uri
                        else f"<p><em>figure not found: {_inline(image['src'])}</em></p>")
        elif stripped.startswith("- "):
            if para:
                flush()
            items.append(stripped[2:])
        elif items:  # a list item's continuation line
            items[-1] += " " + stripped
        else:
            para.append(stripped)
    flush()
    return "\n".join(['<!DOCTYPE html>', '<html lang="en">', "<head>", '<meta charset="utf-8">',
                      f"<title>{html.escape(title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>",
                      *body, "</body>", "</html>", ""])
