"""The kill campaign's comparison of a resumed run with the uninterrupted one (`tests.kill_campaign.compare`):
what it finds wrong in a resumed run's database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.results.db import ResultsDB
from tests.kill_campaign import compare, host_flagged, judge
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


def _slowed(path: Path, environment: dict[str, Any]) -> Path:
    """A run whose mst rounds took 1.5 times the uninterrupted run's (its ratios outside the intervals)."""
    _run(path, environment)
    with ResultsDB(path) as db:
        db.conn.execute("UPDATE rounds SET latency_s = latency_s * 1.5 WHERE scheduler = 'mst'")
        db.conn.commit()
    return path


def test_ratios_are_compared_where_the_verdict_is_faithful_and_only_there(tmp_path: Path) -> None:
    # Prepare: a faithful uninterrupted run (modelled training); two resumed runs with slowed mst rounds,
    # one faithful and one whose training was measured on the host (not faithful: its figures the host's)
    reference = _run(tmp_path / "ref.db", {"compute_timing": "modeled"})
    faithful = _slowed(tmp_path / "faithful.db", {"compute_timing": "modeled"})
    flagged = _slowed(tmp_path / "flagged.db", {"compute_timing": "measured"})

    # Execute
    problems_faithful, flags_faithful = judge(faithful, reference)
    problems_flagged, flags_flagged = judge(flagged, reference)

    # Assert: the faithful run's latency ratio is found outside; the flagged run is named, not compared
    assert host_flagged(reference) == []
    assert flags_faithful == []
    assert [p.split(" at ")[0] for p in problems_faithful] == ["mean_latency_s mst/spff"] * 2
    assert problems_flagged == []
    assert len(flags_flagged) == 4 and all("training: measured on this host" in f for f in flags_flagged)
