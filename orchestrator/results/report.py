"""A run's report (``report.md`` and the same as self-contained ``report.html``) and the summary
printed at the end of a run: two renderings of one `RunSummary`.

`write_results` computes the run's summary once (`orchestrator.results.summary.run_summary`) and
writes the CSVs, the figures and the report from it, each file whole or not at all
(`durability.written_whole`); the driver keeps the summary and prints it (`print_summary`), so the
numbers on the terminal are those of the report's summary table. The drivers call it on a run's
exit path through `write_results_on_exit` (what a failure there does).

The report reads top-down, the answer first: the status and any failures; the paper's two claims
with their intervals and the verdict of the points they rest on (`report_parts.claims_section`);
the main figure (`latency_vs_locals`); then the tables (summary, fidelity, time dilation, the paired
ratios, outside the rounds, where the time went, the online section, faults and moves, local-model
selection); every other figure of the run folder (`orchestrator.results.summary_figures.draw_figures`;
one line why for each one not drawn); a simulated run's model; the site servers' peak memory against
the model's size (`report_parts.memory_section`); and last the environment, as a table
(`report_parts.environment_section`). Everything else is read from the database through
`orchestrator.results.queries`.
"""

from __future__ import annotations

import logging
import sqlite3
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.results import durability, queries
from orchestrator.results.csvs import write_csvs
from orchestrator.results.db import ResultsDB
from orchestrator.results.dilation import dilation_lines, dilation_section, k_suffix, locals_text
from orchestrator.results.fidelity import OVERRUN_SHARE
from orchestrator.results.figures import Figure
from orchestrator.results.report_html import markdown_to_html
from orchestrator.results.report_parts import (
    claims_section,
    environment_section,
    fmt,
    memory_section,
    validation_line,
)
from orchestrator.results.stats import (
    fault_figures,
    max_overlap,
    not_applied,
    online_figures,
    paired_ratio,
    useful_time,
)
from orchestrator.results.summary import RunSummary, TaskSummary, retrans_text, run_summary
from orchestrator.results.summary_figures import draw_figures

#: The figure the report shows right after the claims: the paper's latency against locals.
MAIN_FIGURE = "latency_vs_locals"


def write_results(db: ResultsDB, run_id: int, out_dir: Path, *, figures: bool = True) -> tuple[Path, RunSummary]:
    """The run folder's CSVs, figures (unless not `figures`), ``report.md`` and ``report.html``, from
    one summary.

    Returns the path of ``report.md`` and the summary (for the driver to print)."""
    summary = run_summary(db, run_id)
    write_csvs(db, run_id, out_dir, summary=summary)
    return write_report(db, run_id, out_dir, summary=summary, figures=None if figures else ()), summary


def write_results_on_exit(db: ResultsDB, run_id: int, out_dir: Path, *, figures: bool = True,
                          log: logging.Logger) -> tuple[Path | None, RunSummary | None]:
    """`write_results` on a run's exit path, once the run is marked: any other failure is logged and
    the run's outcome stands ((None, None)).

    Raises
    ------
    OSError, sqlite3.OperationalError
        A full disk (`durability.disk_full`), for the command line to say in one line, once the log
        and the run's note (when even that can be written) say what was not written.
    """
    try:
        return write_results(db, run_id, out_dir, figures=figures)
    except Exception as e:
        if not durability.disk_full(e):
            log.exception("writing the results failed")
            return None, None
        log.error("the run's report, CSVs and figures were not written, or not all: the disk is full (%s)", e)
        try:
            db.add_note(run_id, "its report, CSVs and figures were not written (the disk was full)")
        except sqlite3.Error as again:
            log.error("could not note it in the run (%s)", again)
        raise


# -- the terminal -----------------------------------------------------------------------------------
def summary_lines(summary: RunSummary, run_dir: Path) -> list[str]:
    """The summary printed at the end of a run: counts, the summary table, the paper's two claims."""
    counts, total = summary.counts, len(summary.tasks)
    failed = f"; {counts['failed']} of {total} tasks FAILED" if counts["failed"] else ""
    lines = [f"\nrun {summary.run_id} {summary.status}: {counts['done']} of {total} tasks done, "
             f"{counts['blocked']} blocked{failed}; results in {run_dir}",
             f"{'scheduler':<10}{'locals':>7}{'ran':>6}{'blocked':>8}{'latency ms':>12}{'± std':>9}"
             f"{'reserved Gb/s':>15}{'carried MB':>12}{'/bound':>8}{'accuracy':>10}"]
    for p in summary.points:
        lines.append(f"{p.scheduler:<10}{p.n_locals:>7}{p.tasks_ran:>6}{p.blocked:>8}"
                     f"{fmt(p.latency_s_mean, 1e3, 1):>12}{fmt(p.latency_s_std, 1e3, 1):>9}"
                     f"{fmt(p.reserved_mbps_mean, 1e-3):>15}{fmt(p.carried_mb_mean, 1, 1):>12}"
                     f"{fmt(p.ratio_to_bound_mean):>8}{fmt(p.accuracy_mean, 1, 3):>10}")
    c = summary.claims()
    for key in ("bandwidth", "latency"):
        if c is not None and c[f"{key}_ratio"] is not None:
            lines.append(f"{key} mst/spff at {c['n_locals']} locals: {c[f'{key}_ratio']:.3f}")
    lines += dilation_lines(summary.environment, trials=False)
    validated = validation_line(summary.environment) if summary.engine == "simulation" else None
    lines += [validated.replace("**", "")] if validated else []
    for v in summary.verdicts:
        lines.append(f"fidelity {v.scheduler} at {v.n_locals} locals{k_suffix(summary.environment, v.n_locals)}: "
                     f"{v.word}, latency / bound {v.bound_text}"
                     + (f" ({'; '.join(v.notes)})" if v.notes else ""))
    if summary.unfaithful:
        lines.append(f"netai: warning: {len(summary.unfaithful)} of {len(summary.verdicts)} points did not measure "
                     "the emulated network and sites faithfully (see the report's Fidelity section)")
    return lines


def print_summary(summary: RunSummary, run_dir: Path) -> None:
    """The summary table and the paper's two claims, on the terminal (`summary_lines`)."""
    print("\n".join(summary_lines(summary, run_dir)))


# -- report.md --------------------------------------------------------------------------------------
def write_report(db: ResultsDB, run_id: int, out_dir: Path, *, summary: RunSummary | None = None,
                 figures: Sequence[Figure] | None = None) -> Path:
    """A markdown report (see the module's docstring) and the same as self-contained ``report.html``
    beside it. Renders `summary` (computed from the rows when not given) and draws the figures
    (`draw_figures`) unless they are given.

    Returns the path of ``report.md``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if summary is None:
        summary = run_summary(db, run_id)
    if figures is None:
        figures = draw_figures(db, run_id, out_dir, summary=summary)
    env = summary.environment
    main = next((f for f in figures if f.ok and f.name == MAIN_FIGURE), None)
    lines = _head(summary)
    at = next((i + 2 for i, line in enumerate(lines) if line.startswith("Status: ")), len(lines))
    lines[at:at] = durability.resume_lines(db.conn, run_id)  # below its status: a resumed run says so
    lines += claims_section(summary) + _main_figure(main)
    lines += summary_table(summary) + fidelity_section(summary) + dilation_section(env)
    lines += _paired_section(summary.tasks, summary.locals_seen)
    lines += _time_section(summary.tasks, env.get("clock_end_s"))
    if env.get("mode") == "online":
        lines += _online_section(db, run_id, summary.tasks)
    lines += faults_section(db, run_id)
    lines += selection_section(db)
    lines += _figures_section([f for f in figures if f is not main])
    if summary.engine == "simulation":
        lines += simulation_model(env)
    lines += memory_section(env) + environment_section(env)
    path = out_dir / "report.md"
    text = "\n".join(lines)
    with durability.written_whole(path) as part:
        part.write_text(text)
    with durability.written_whole(out_dir / "report.html") as part:
        part.write_text(markdown_to_html(text, base_dir=out_dir))
    return path


def _head(summary: RunSummary) -> list[str]:
    """Title, status and the first failures; a simulated run says so, and which validation covers its
    regime (uncalibrated, or covered by none, it says so first, and by how much it may be off)."""
    env, simulated = summary.environment, summary.engine == "simulation"
    validated = validation_line(env) if simulated else None
    first = [uncalibrated_line(env)] if simulated and env.get("calibrated") is False else []
    first += [validated] if validated and env.get("validation") is None else []
    lines = [*(x for line in first for x in (line, "")), f"# Run {summary.run_id}: {summary.name}", ""]
    if summary.unfaithful:
        lines += [f"**Not faithful:** {len(summary.unfaithful)} of {len(summary.verdicts)} points measured the host, "
                  "not only the emulated network and sites; their figures and claims say so below "
                  "(see \"Fidelity\").", ""]
    lines += [f"Status: **{summary.status}**" + (f" ({summary.note})" if summary.note else ""), ""]
    failed = [t for t in summary.tasks if t.state == "failed"]
    if failed:
        lines += [f"**{len(failed)} of {len(summary.tasks)} tasks failed.** First reasons:", ""]
        lines += [f"- {t.scheduler} task {t.task_id}: {t.reason or 'no reason recorded'}" for t in failed[:5]]
        lines.append("")
    if simulated:
        lines += ["**Simulated run**: these figures come from the flow-level model on SimGrid "
                  "(`orchestrator/simulation`), not from the emulation; no model was trained (no accuracy); "
                  "the model's parameters are under \"Simulation model\".", ""]
        lines += [validated, ""] if validated and env.get("validation") is not None else []
    return lines


def _main_figure(figure: Figure | None) -> list[str]:
    """The report's main figure, right after the claims (`MAIN_FIGURE`, when drawn)."""
    if figure is None:
        return []
    return ["", f"## Main figure: `{figure.name}`", "", f"![{figure.name}]({figure.name}.svg)", "", figure.caption]


def summary_table(summary: RunSummary) -> list[str]:
    """The report's summary table: one row per point of `summary`."""
    lines = ["", "## Summary", "",
             "| scheduler | locals | tasks ran / total | blocked | latency ms (mean ± std) | reserved Gbit/s (mean ± std) "
             "| carried MB | latency / lower bound | latency / reference | rounds with stragglers | accuracy |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for p in summary.points:
        lines.append(
            f"| {p.scheduler} | {p.n_locals} | {p.tasks_ran} / {p.tasks} | {p.blocked} "
            f"| {fmt(p.latency_s_mean, 1e3, 1)} ± {fmt(p.latency_s_std, 1e3, 1)} "
            f"| {fmt(p.reserved_mbps_mean, 1e-3)} ± {fmt(p.reserved_mbps_std, 1e-3)} "
            f"| {fmt(p.carried_mb_mean, 1, 1)} | {fmt(p.ratio_to_bound_mean)} | {fmt(p.ratio_to_reference_mean)} "
            f"| {p.straggler_rounds} | {fmt(p.accuracy_mean, 1, 3)} |"
        )
    return lines


def fidelity_section(summary: RunSummary) -> list[str]:
    """Per point: the broadcast hops against one chunk's time on the link, the training overruns, the
    TCP retransmitted share (the agents' kernel figures; a simulation has no TCP: not modelled) and
    the verdict (`orchestrator.results.fidelity`); the host's CPU saturation under it."""
    if not summary.verdicts:
        return []
    shares = {(p.scheduler, p.n_locals): p.retrans_share for p in summary.points}
    modelled = summary.engine != "simulation"
    lines = ["", "## Fidelity", "",
             "| scheduler | locals | hops | median hop ms | one chunk ms | instrument ms/hop | deepest chain / round "
             "| overruns / trained "
             "| most training / modelled | link rate / configured (link-rounds) | TCP retransmitted "
             "| latency / bound [95 % CI] | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for v in summary.verdicts:
        lines.append(f"| {v.scheduler} | {locals_text(summary.environment, v.n_locals)} | {v.hops} | {fmt(v.hop_median_s, 1e3)} "
                     f"| {fmt(v.chunk_median_s, 1e3)} | {fmt(v.overhead_median_s, 1e3)} | {fmt(v.chain_share, 100, 1)} % "
                     f"| {v.overrun_text} "
                     f"| {fmt(v.training_use_max, 1, 2)} | {fmt(v.rate_share_median, 1, 3)} ({v.link_rounds}) "
                     f"| {retrans_text(shares.get((v.scheduler, v.n_locals)), modelled=modelled)} | {v.bound_text} "
                     f"| {v.word} |")
    lines += [""] + [f"- {v.scheduler} at {v.n_locals} locals: {r}" for v in summary.verdicts
                     for r in v.notes]
    lines.append("- TCP retransmitted: the data bytes the task's agents' connections retransmitted over those they "
                 "sent (kernel tcp_info), summed over the point's tasks; they cross the links again, so the "
                 "carried bytes include them" if modelled else
                 "- TCP retransmitted: not modelled (the flow-level simulation has no TCP)")
    lines.append(f"- overruns / trained: node-rounds whose real training ran past their site's modelled time; in "
                 f"brackets the most they can have added to the rounds' summed latency (a point with overruns stays "
                 f"faithful up to {OVERRUN_SHARE:.0%})")
    if summary.host_saturated is not None:
        lines.append(f"- host CPU saturated (both cores over 95 % busy) in {summary.host_saturated:.0%} of its samples")
    return lines


def _paired_section(tasks: Sequence[TaskSummary], locals_seen: list[int]) -> list[str]:
    """Latency ratios of every scheduler to spff on the same tasks, with 95 % bootstrap intervals,
    and the figures outside the rounds (`_outside_rounds`)."""
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
    return lines + _outside_rounds(tasks)


def _outside_rounds(tasks: Sequence[TaskSummary]) -> list[str]:
    """Start-up, connection set-up, chunk sizes and enforced reservations of the tasks that started."""
    ran = [t for t in tasks if t.agents_ready_s is not None]
    if not ran:
        return []

    def avg(xs: list[float]) -> str:
        return f"{statistics.fmean(xs):.3f}" if xs else "-"

    overhead = [t.start_overhead_s for t in ran if t.start_overhead_s is not None]
    return ["", "## Outside the rounds", "",
            f"- start overhead (admission to G's first broadcast byte), median: "
            f"{statistics.median(overhead):.3f} s" if overhead else "- start overhead: -",
            f"- roles ready (sent to the site servers to the last one listening), mean: "
            f"{avg([t.agents_ready_s or 0 for t in ran])} s",
            f"- connection set-up (every overlay edge, before round 1), mean: "
            f"{avg([t.connect_s or 0 for t in ran])} s",
            f"- chunk sizes used: {sorted({t.chunk_bytes for t in ran if t.chunk_bytes})}",
            f"- tasks whose reservation was enforced on the links: "
            f"{sum(bool(t.reservation_enforced) for t in ran)} of {len(ran)}"]


def _time_section(tasks: Sequence[TaskSummary], clock_end_s: float | None) -> list[str]:
    useful = useful_time(tasks, clock_end_s)
    if useful is None or clock_end_s is None:
        return []
    return ["", "## Where the time went", "",
            f"- run wall time after bring-up: {clock_end_s:.1f} s; time in rounds (any task in a round): "
            f"{useful * clock_end_s:.1f} s; useful time {useful:.3f}",
            f"- most tasks running at once: {max_overlap(tasks)}"]


def _online_section(db: ResultsDB, run_id: int, tasks: Sequence[TaskSummary]) -> list[str]:
    lines = ["", "## Online: tasks arriving and running side by side", "",
             "| scheduler | tasks | done | blocked | failed | blocking ratio | latency ms (mean) "
             "| completion s (median) | most at once | peak memory GB | reserved Gbit/s (mean) "
             "| carried Gbit/s (mean) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    figs = online_figures(db, run_id, tasks)
    for o in figs:
        lines.append(f"| {o['scheduler']} | {o['tasks']} | {o['done']} | {o['blocked']} | {o['failed']} "
                     f"| {o['blocking_ratio']:.3f} | {fmt(o['latency_s_mean'], 1e3, 1)} "
                     f"| {fmt(o['completion_s_median'], 1, 1)} | {o['max_overlap']} "
                     f"| {fmt(o['memory_peak_bytes'], 1e-9, 2)} | {fmt(o['reserved_mbps_mean'], 1e-3, 3)} "
                     f"| {fmt(o['carried_mbps_mean'], 1e-3, 3)} |")
    lines += ["", "CPU seconds used by each site's server over each scheduler's trace:", ""]
    for o in figs:
        lines.append(f"- {o['scheduler']}: " + ", ".join(f"{s} {c}" for s, c in o["site_cpu_s"].items()))
    lines += ["", "Figures: `online_bandwidth` (reserved and carried bandwidth and tasks running over time) and "
              "`online_load` (blocking ratio and load over time), under Figures below."]
    return lines


def faults_section(db: ResultsDB, run_id: int) -> list[str]:
    """Faults and rescheduling: per label, the events and the moves (`fault_figures`), then every
    event, move and failed task (`_fault_lines`). Empty when the run recorded neither."""
    if not queries.has_faults_or_moves(db.conn, run_id):
        return []
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
                     f"| {o['moves']} | {fmt(o['interruption_s_mean'], 1, 3)} | {fmt(lat, 1, 1)} "
                     f"| {fmt(o['saved_bound_s'], 1, 3)} |")
    return lines + _fault_lines(db, run_id)


def _fault_lines(db: ResultsDB, run_id: int) -> list[str]:
    lines = ["", "Events:", ""]
    for e in queries.faults(db.conn, run_id):
        lines.append(f"- {e['scheduler']}: {e['at_s']:.2f} s {e['action']} {e['target']}"
                     f"{'' if e['ok'] or not_applied(e) else ' FAILED'}{': ' + e['detail'] if e['detail'] else ''}")
    moves = queries.moves(db.conn, run_id)
    if moves:
        lines += ["", "Moves:", ""]
    for m in moves:
        gap = "-" if m["interruption_s"] is None else f"{m['interruption_s']:.3f} s"
        lines.append(f"- {m['scheduler']} task {m['task_id']} move {m['move']} at {m['at_s']:.2f} s ({m['reason']}): "
                     f"resumed at round {m['resumed_round']}, interruption {gap}, round bound "
                     f"{fmt(m['old_bound_s'], 1, 3)} -> {fmt(m['new_bound_s'], 1, 3)} s, reserved "
                     f"{fmt(m['old_reserved_mbps'], 1, 0)} -> {fmt(m['new_reserved_mbps'], 1, 0)} Mbit/s")
    for t in queries.failed_tasks(db.conn, run_id):
        lines.append(f"- {t['scheduler']} task {t['task_id']} failed: {t['reason']}")
    return lines


def selection_section(db: ResultsDB) -> list[str]:
    """Per run, policy and scheduler: rounds, locals trained per round, latency, update bytes and the
    final accuracy (only when some run of the database selected locals)."""
    rows = queries.round_selections(db.conn)
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


def _figures_section(figures: Sequence[Figure]) -> list[str]:
    lines = ["", "## Figures", "", "Each figure is in this folder as PNG and SVG.", ""]
    for f in figures:
        if f.ok:
            lines += [f"### `{f.name}`", "", f"![{f.name}]({f.name}.svg)", "", f.caption, ""]
    skipped = [f for f in figures if not f.ok]
    if skipped:
        lines += ["### Not drawn", ""] + [f"- `{f.name}`: {f.skipped}" for f in skipped] + [""]
    return lines


def uncalibrated_line(env: Mapping[str, Any]) -> str:
    """The first line of an uncalibrated simulated run's report."""
    off = float(env.get("uncalibrated_off_by") or 0.0)
    return (f"**Uncalibrated:** these simulated figures use the model's default parameters "
            f"({env.get('uncalibrated_reason', 'no calibration')}); with the defaults, simulated mean round "
            f"latency was off the emulated one by up to {off:.0%} per point ({env.get('uncalibrated_where', '?')}).")


def simulation_model(env: Mapping[str, Any]) -> list[str]:
    """The report's "Simulation model" section: each parameter of a simulated run and how it was set."""
    defaults = set(env.get("defaults", []))

    calibrated = set(env.get("calibrated_params", []))

    def how(*keys: str) -> str:
        if all(k in defaults for k in keys):
            return "default"
        if all(k in defaults or k in calibrated for k in keys):
            return "calibrated on this host"
        return "set in the config" + (" (see how below)" if env.get("calibration") else "")

    cpu = int(env.get("cpu_cores") or 0)
    lines = ["", "## Simulation model", "",
             f"- link rates: {env.get('rates', '?')} (bw_scale {env.get('bw_scale', '?')}); flows share links max-min",
             f"- TCP efficiency factor {env.get('tcp_efficiency', '?')} ({how('tcp_efficiency')}; 1.0 by default, "
             "the calibration derives 1448/1514: TCP payload per Ethernet frame at MTU 1500, as htb counts it)",
             "- ACKs on the reverse links: " + (f"{env['ack_share']} of the bytes sent ({how('ack_share')}; a "
             "transfer shares them with one going the other way)" if env.get("ack_share") else
             f"not modelled ({how('ack_share')}; the calibration sets them)"),
             f"- propagation: fiber delay {'on' if env.get('delay_emulated') else 'off'}, plus "
             f"{env.get('per_hop_latency_ms', '?')} ms per hop ({how('per_hop_latency_ms')})",
             f"- per-chunk work at each sender: {env.get('alpha_s', '?')} s ({how('alpha_s')}; by default the "
             "emulation's own figure, `orchestrator/runtime/timing.py` ALPHA_S); chunk size as the emulation "
             "chooses it unless the config fixes it",
             f"- segments per transfer: {env.get('max_segments') or 'one per chunk'} ({how('max_segments')})",
             f"- training: {env.get('seconds_per_round', 0)} s per round and {env.get('seconds_per_example', '?')} "
             "s per example and epoch, "
             f"{env.get('local_epochs', '?')} epochs, {env.get('train_examples', '?')} examples split among "
             f"the locals ("
             + ("the task's measured profile at each site's speed, as the emulation models compute"
                if env.get("training_from_profile") else f"{how('seconds_per_example')}; the default is a placeholder, "
                "not measured") + ")"]
    lines.append(f"- background: {env.get('background', 'off')}")
    if cpu:
        lines.append(f"- CPU: {cpu} cores shared by every site's processes; per transfer "
                     f"{env.get('cpu_s_per_byte', 0)} s per byte and {env.get('cpu_s_per_chunk', 0)} s per chunk "
                     "in the sender's and receiver's processes (one core each), and "
                     f"{env.get('cpu_s_per_byte_hop', 0)} s per byte and hop for the software switch, on the same cores; "
                     f"training also works off {env.get('train_cpu_factor', 1.0)} x its profile's CPU on its own "
                     "thread and the shared cores "
                     f"({how('cpu_cores', 'cpu_s_per_byte', 'cpu_s_per_chunk', 'cpu_s_per_byte_hop')})")
    else:
        lines.append("- CPU: not modelled (`cpu_cores` 0, the default): transfers never wait for CPU")
    if env.get("calibration"):
        lines.append(f"- how the parameters were set: {env['calibration']}")
    lines += ["- these parameters are the config's `simulation` section (defaults in "
              "`orchestrator/experiment/config.py`), where it leaves them at their defaults this host's calibration "
              "(`netai calibrate`: derived, measured, one fitted on a fixed emulated set), and "
              "`netai validate CONFIG` measures how far the simulation is from the emulation", ""]
    return lines
