"""The results package: one summary computation behind the report and the printed summary, and every
SQL SELECT of the project in orchestrator/results/queries.py (no emulation)."""

from __future__ import annotations

import argparse
import ast
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.results import csvs as csvs_module
from orchestrator.results import report as report_module
from orchestrator.results import summary_figures as summary_figures_module
from orchestrator.results.db import ResultsDB
from orchestrator.results.report import summary_lines, write_report, write_results
from orchestrator.results.summary import RunSummary, run_summary
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.tasks import generate_tasks
from topologies.loaders import load

ROOT = Path(__file__).resolve().parents[2]
QUERIES = ROOT / "orchestrator" / "results" / "queries.py"
#: An SQL SELECT: the keyword, then a column list's first item (``*``, a name followed by a comma,
#: FROM or AS, an aggregate, a constant), so that English words like "selection" or "--select" pass.
SQL_SELECT = re.compile(r"\bselect\s+(?:distinct\s+)?(?:\*|\d+\b|(?:count|max|min|avg|sum)\s*\(|[a-z_][\w.]*\s*"
                        r"(?:,|\bfrom\b|\bas\b))", re.IGNORECASE)


def fill(db: ResultsDB) -> int:
    """A run with real schedules, made-up rounds, one failed and one blocked task."""
    model = load("sndlib/nobel-us")
    run_id = db.start_run("t", {}, {"mode": "sequential"})
    for scheduler in ("spff", "mst"):
        state, sched = NetworkState(model), get_scheduler(scheduler)
        for n in (2, 4):
            for i, task in enumerate(generate_tasks(model, count=3, locals_per_task=n, seed=n, first_id=10 * n)):
                db.record_task(run_id, scheduler, task)
                if i == 2:
                    db.set_task_state(run_id, scheduler, task.id, "blocked" if n == 2 else "failed", "made up")
                    continue
                s = sched.schedule(state, task)
                state.admit(s)
                db.record_schedule(run_id, s, lower_bound_s=0.01 * n)
                for r in (1, 2):
                    lat = 0.02 * n + 0.001 * r + (0.004 if scheduler == "spff" else 0.0) + 0.0002 * task.id
                    db.record_round(run_id, scheduler, task.id, r, latency_s=lat, broadcast_s=lat / 3, train_s=lat / 3,
                                    upload_s=lat / 3, accuracy=0.5 + 0.1 * r + 0.01 * i, lower_bound_s=0.01 * n)
                db.set_carried_bytes(run_id, scheduler, task.id, 1_000_000 * n + task.id)
                db.set_task_state(run_id, scheduler, task.id, "done")
    db.finish_run(run_id, "completed")
    return run_id


def _report_row(report: str, scheduler: str, n: int) -> list[str]:
    row = next(line for line in report.splitlines() if line.startswith(f"| {scheduler} | {n} |"))
    return [c.strip() for c in row.strip("|").split("|")]


def test_the_report_and_the_printed_summary_render_one_computation(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a database, and every reader's run_summary counted.
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db)
    calls: list[int] = []

    def counted(db_: ResultsDB, run_id_: int) -> RunSummary:
        calls.append(run_id_)
        return run_summary(db_, run_id_)

    for module in (report_module, csvs_module, summary_figures_module):
        monkeypatch.setattr(module, "run_summary", counted)

    # Execute: what the driver does at the end of a run.
    path, summary = write_results(db, run_id, tmp_path)
    printed = summary_lines(summary, tmp_path)
    report = path.read_text()

    # Assert: computed once; each printed row carries the numbers of the report's row for its point.
    assert calls == [run_id]
    assert len(summary.points) == 4
    for p in summary.points:
        cells = _report_row(report, p.scheduler, p.n_locals)
        fields = next(line.split() for line in printed if line.split()[:2] == [p.scheduler, str(p.n_locals)])
        latency, latency_std = cells[4].split(" ± ")
        reserved = cells[5].split(" ± ")[0]
        assert fields[2:4] == [cells[2].split(" / ")[0], cells[3]]  # tasks ran, blocked
        assert fields[4:8] == [latency, latency_std, reserved, cells[6]]  # latency, std, reserved, carried
        assert (fields[8], fields[9]) == (cells[7], cells[10])  # ratio to the bound, accuracy
        assert latency != "-" and reserved != "-"
    claims = summary.claims()
    assert claims is not None and claims["n_locals"] == 4
    ratio = f"{claims['latency_ratio']:.3f}"
    assert f"latency mst/spff at 4 locals: {ratio}" in printed
    assert f"- mean round latency: mst / spff = {ratio}" in report
    assert printed[0] == (f"\nrun {run_id} completed: 8 of 12 tasks done, 2 blocked; 2 of 12 tasks FAILED; "
                          f"results in {tmp_path}")


def test_both_renderings_show_the_summary_they_are_given(tmp_path: Path) -> None:
    # Prepare: the run's summary with one point's latency changed (no row says 1234.5 ms).
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db)
    summary = run_summary(db, run_id)
    first = replace(summary.points[0], latency_s_mean=1.2345)
    altered = replace(summary, points=(first, *summary.points[1:]))

    # Execute
    report = write_report(db, run_id, tmp_path, summary=altered, figures=[]).read_text()
    printed = summary_lines(altered, tmp_path)

    # Assert: neither recomputed the point from the rows.
    assert _report_row(report, first.scheduler, first.n_locals)[4].startswith("1234.5 ± ")
    assert next(line for line in printed if line.startswith(first.scheduler)).split()[4] == "1234.5"


def test_netai_experiment_prints_the_summary_the_run_wrote_its_report_from(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: a run whose folder has no database any more: the CLI can only print the outcome's summary.
    from orchestrator.cli.experiment import cmd_experiment
    from orchestrator.experiment import runner

    db = ResultsDB(tmp_path / "results.db")
    summary = run_summary(db, fill(db))
    db.close()
    gone = tmp_path / "gone"

    def run_experiment(cfg: Any, **_: Any) -> runner.RunOutcome:
        return runner.RunOutcome(run_id=summary.run_id, run_dir=gone, status="completed", report=None,
                                 summary=summary)

    monkeypatch.setattr(runner, "run_experiment", run_experiment)
    args = argparse.Namespace(config=str(ROOT / "experiments" / "quick.yaml"), locals=None, tasks=None,
                              rounds=None, out=str(tmp_path), no_progress=True, no_figures=False, dashboard=False, time_dilation=None, max_time_dilation=None,
                              dashboard_port=None)

    # Execute
    code = cmd_experiment(args)

    # Assert
    assert code == 0
    assert capsys.readouterr().out == "\n".join(summary_lines(summary, gone)) + "\n"


def _selects(path: Path) -> list[str]:
    """``path:line`` of every string constant (f-string parts included) holding an SQL SELECT."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL_SELECT.search(node.value)]


def test_no_module_outside_the_queries_module_selects() -> None:
    modules = sorted((ROOT / "orchestrator").rglob("*.py"))

    found = [hit for path in modules if path != QUERIES for hit in _selects(path)]

    assert found == []
    assert len(_selects(QUERIES)) >= 25  # the scan sees the queries where they are


def test_the_scan_sees_a_select_and_passes_english(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text('"""Select the locals from a policy; --select all; local-model selection."""\n'
                   'a = conn.execute("SELECT id FROM runs")\n'
                   'b = f"select count(*) from {table}"\n'
                   'c = "select * from t"\n'
                   'd = ("SELECT t.scheduler, t.task_id "\n     "FROM tasks t")\n')

    assert sorted(int(hit.split(":")[1]) for hit in _selects(src)) == [2, 3, 4, 5]
