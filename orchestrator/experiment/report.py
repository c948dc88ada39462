"""Turn a run's database rows into the results a researcher reads: CSVs, figures, a report.

Summaries are computed from the database only (never from in-memory state of the runner), so
anything plotted can be recomputed from the rows (`tests/unit/test_results.py` does).

Per task: its mean round latency over the rounds it completed, its reserved bandwidth, its
carried bytes, its mean ratio of measured round latency to the round's lower bound and its final
accuracy. Per point (scheduler, number of locals): the mean and the population standard
deviation of those over the point's tasks that ran.
"""

from __future__ import annotations

import csv
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

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


def _mean(xs: list[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def _std(xs: list[float]) -> float | None:
    return statistics.pstdev(xs) if xs else None


def task_results(db: ResultsDB, run_id: int) -> list[TaskResult]:
    tasks = db.query(
        "SELECT t.scheduler, t.task_id, t.n_locals, t.state, t.carried_bytes, s.reserved_mbps "
        "FROM tasks t LEFT JOIN schedules s USING (run_id, scheduler, task_id) WHERE t.run_id = ? "
        "ORDER BY t.scheduler, t.n_locals, t.task_id",
        (run_id,),
    )
    rounds: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for r in db.query("SELECT * FROM rounds WHERE run_id = ? ORDER BY round", (run_id,)):
        rounds.setdefault((r["scheduler"], r["task_id"]), []).append(r)
    out = []
    for t in tasks:
        rs = rounds.get((t["scheduler"], t["task_id"]), [])
        ratios = [r["latency_s"] / r["lower_bound_s"] for r in rs if r["lower_bound_s"]]
        accs = [r["accuracy"] for r in rs if r["accuracy"] is not None]
        out.append(
            TaskResult(
                scheduler=t["scheduler"],
                task_id=t["task_id"],
                n_locals=t["n_locals"],
                state=t["state"],
                reserved_mbps=t["reserved_mbps"] if t["state"] != "blocked" else None,
                carried_bytes=t["carried_bytes"],
                rounds=len(rs),
                mean_latency_s=_mean([r["latency_s"] for r in rs]),
                mean_ratio_to_bound=_mean(ratios),
                final_accuracy=accs[-1] if accs else None,
            )
        )
    return out


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


def write_report(db: ResultsDB, run_id: int, out_dir: Path) -> Path:
    """A markdown report: the environment, the summary table and the paper's two claims."""
    run = db.run(run_id)
    points = summarize(db, run_id)
    lines = [f"# Run {run_id}: {run['name']}", "", f"Status: **{run['status']}**", "", "## Environment", ""]
    for k, v in sorted(run["environment"].items()):
        lines.append(f"- {k}: {v}")
    lines += ["", "## Summary", "",
              "| scheduler | locals | tasks ran / total | blocked | latency ms (mean ± std) | reserved Gbit/s (mean ± std) "
              "| carried MB | latency / lower bound | accuracy |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]

    def fmt(x: float | None, scale: float = 1.0, digits: int = 2) -> str:
        return "-" if x is None else f"{x * scale:.{digits}f}"

    for p in points:
        lines.append(
            f"| {p.scheduler} | {p.n_locals} | {p.tasks_ran} / {p.tasks} | {p.blocked} "
            f"| {fmt(p.latency_s_mean, 1e3, 1)} ± {fmt(p.latency_s_std, 1e3, 1)} "
            f"| {fmt(p.reserved_mbps_mean, 1e-3)} ± {fmt(p.reserved_mbps_std, 1e-3)} "
            f"| {fmt(p.carried_mb_mean, 1, 1)} | {fmt(p.ratio_to_bound_mean)} | {fmt(p.accuracy_mean, 1, 3)} |"
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
    lines += ["", "Figures: " + ", ".join(f"`{f}.png`" for f in FIGURES), ""]
    path = out_dir / "report.md"
    out_dir.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))
    return path
