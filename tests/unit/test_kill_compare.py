"""The kill campaign's comparison of a resumed run with the uninterrupted one (`tests.kill_campaign.compare`):
what it finds wrong in a resumed run's database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.results.db import ResultsDB
from tests.kill_campaign import compare
from tests.unit.test_experiment_pieces import fill


def _run(path: Path, environment: dict[str, Any]) -> Path:
    with ResultsDB(path) as db:
        fill(db, environment)
    return path


def test_a_resumed_run_at_another_k_is_found_and_the_same_run_is_not(tmp_path: Path) -> None:
    # Prepare: the uninterrupted run at K = 16; the same tasks and figures at K = 16, and at K = 8
    reference = _run(tmp_path / "ref.db", {"time_dilation": 16.0})
    same = _run(tmp_path / "same.db", {"time_dilation": 16.0})
    other = _run(tmp_path / "other.db", {"time_dilation": 8.0, "time_dilation_per_point": {"2": 8.0}})

    # Execute
    found_same = compare(same, reference)
    found_other = compare(other, reference)

    # Assert: only the K differs, and each key that differs is named with both values
    assert found_same == []
    assert found_other == ["time_dilation: 8.0 resumed, 16.0 uninterrupted",
                           "time_dilation_per_point: {'2': 8.0} resumed, None uninterrupted"]
