"""Training runs on a thread of its own, below the agent's transfer threads in priority."""

from __future__ import annotations

import os
import threading

import pytest

from workers.learning import TRAIN_NICE, run_at_lower_priority


def _nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_the_work_runs_lower_on_another_thread_and_the_caller_keeps_its_priority() -> None:
    caller = _nice()
    seen = run_at_lower_priority(lambda: (threading.get_native_id(), _nice()))
    assert seen[0] != threading.get_native_id()
    assert seen[1] == min(19, caller + TRAIN_NICE)
    assert _nice() == caller, "only the training thread was lowered"


def test_the_result_and_the_exception_come_back_to_the_caller() -> None:
    assert run_at_lower_priority(lambda: 42) == 42

    def fails() -> int:
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        run_at_lower_priority(fails)
