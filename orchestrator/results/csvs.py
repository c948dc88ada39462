"""The run folder's CSV files, for a spreadsheet or pandas: ``rounds.csv`` (every recorded round, as
the database holds it), ``tasks.csv`` (one `TaskSummary` per row) and ``summary.csv`` (one
`PointSummary` per row). A reader of the database (`orchestrator.results.queries`) and of the run's
summary; it never changes the database."""

from __future__ import annotations

import csv
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from orchestrator.results import durability, queries
from orchestrator.results.db import ResultsDB
from orchestrator.results.summary import RunSummary, run_summary


def _write(path: Path, rows: Sequence[Mapping[str, Any]]) -> Path:
    with durability.written_whole(path) as part, part.open("w", newline="") as f:
        if rows:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    return path


def write_csvs(db: ResultsDB, run_id: int, out_dir: Path, *, summary: RunSummary | None = None) -> list[Path]:
    """Write the three CSVs into `out_dir` (the tasks and points of `summary`, computed from the rows
    when not given); returns their paths. A table without rows gives an empty file."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if summary is None:
        summary = run_summary(db, run_id)
    return [_write(out_dir / "rounds.csv", queries.rounds(db.conn, run_id)),
            _write(out_dir / "tasks.csv", [asdict(t) for t in summary.tasks]),
            _write(out_dir / "summary.csv", [asdict(p) for p in summary.points])]
