"""Reusing an auto-chosen time dilation for the same workload on the same host (`k_store`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.experiment import k_store
from orchestrator.experiment.calibration import Trial


def _trials(faithful_from: float) -> tuple[list[float], object]:
    tried: list[float] = []

    def trial(k: float) -> Trial:
        tried.append(k)
        return Trial(k=k, faithful=k >= faithful_from, reasons=() if k >= faithful_from else ("overran",), wall_s=1.0)

    return tried, trial


def test_a_faithful_choice_is_stored_and_reused_without_trials(tmp_path: Path) -> None:
    store = tmp_path / "auto_k.json"
    tried, trial = _trials(4)
    said: list[str] = []
    first = k_store.search_or_reuse("w1", trial, 16, say=said.append, path=store)  # type: ignore[arg-type]
    assert first.k == 4 and tried == [1, 2, 4] and not first.reused_from
    second = k_store.search_or_reuse("w1", trial, 16, say=said.append, path=store)  # type: ignore[arg-type]
    assert second.k == 4 and second.trials == () and second.reused_from and tried == [1, 2, 4]
    assert "as this host chose for the same workload" in said[-1]
    other = k_store.search_or_reuse("w2", trial, 16, say=said.append, path=store)  # type: ignore[arg-type]
    assert other.trials and tried[-3:] == [1, 2, 4]  # another workload calibrates on its own


def test_nothing_faithful_is_not_stored_and_a_forgotten_k_calibrates_again(tmp_path: Path) -> None:
    store = tmp_path / "auto_k.json"
    _tried, never = _trials(99)
    cal = k_store.search_or_reuse("w", never, 4, say=lambda _l: None, path=store)  # type: ignore[arg-type]
    assert not cal.faithful and k_store.find("w", store) is None
    k_store.save("w", 8, store)
    assert k_store.find("w", store)["k"] == 8  # type: ignore[index]
    assert k_store.forget("w", store) and k_store.find("w", store) is None and not k_store.forget("w", store)


def test_a_stored_k_above_the_cap_or_recalibrate_runs_the_trials(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = tmp_path / "auto_k.json"
    k_store.save("w", 32, store)
    tried, trial = _trials(2)
    cal = k_store.search_or_reuse("w", trial, 16, say=lambda _l: None, path=store)  # type: ignore[arg-type]
    assert tried == [1, 2] and cal.k == 2
    monkeypatch.setenv(k_store.ENV_RECALIBRATE, "1")
    k_store.search_or_reuse("w", trial, 16, say=lambda _l: None, path=store)  # type: ignore[arg-type]
    assert tried == [1, 2, 1, 2]


def test_an_unreadable_store_is_no_store(tmp_path: Path) -> None:
    store = tmp_path / "auto_k.json"
    store.write_text("{not json")
    assert k_store.find("w", store) is None


def test_a_stored_k_below_the_runs_floor_gives_way_to_the_floor_without_trials(tmp_path: Path) -> None:
    from orchestrator.results.dilation import dilation_lines

    store = tmp_path / "auto_k.json"
    k_store.save("w", 8.0, store)
    tried, trial = _trials(1)
    said: list[str] = []

    above = k_store.search_or_reuse("w", trial, 64, say=said.append, path=store, floor=32, floor_locals=3)  # type: ignore[arg-type]
    below = k_store.search_or_reuse("w", trial, 64, say=said.append, path=store, floor=4, floor_locals=2)  # type: ignore[arg-type]

    assert tried == [] and above.k == 32 and above.reused_from and above.floor_locals == 3
    assert said[0].startswith("time dilation auto: K=32, the K of this run's point at 3 locals, above the K=8 this host")
    assert below.k == 8  # a stored K at or above the floor is reused as it is
    env = {"time_dilation": 32.0, "time_dilation_calibration": above.to_dict()}
    assert "the K of the run's point at 3 locals, above the K this host chose" in dilation_lines(env)[0]
