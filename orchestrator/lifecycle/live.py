"""What the lifecycle core holds of a task it has admitted (`LiveTask`) and of the flow counters
still settling (`CounterReads`): plain data, which the core and its policy
(`orchestrator.lifecycle.policy`) both use, so that neither imports the other's module for it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.lifecycle import states as st
from orchestrator.lifecycle.ports import Execution
from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.cost import RoundFigures
from orchestrator.scheduling.tasks import Task


@dataclass
class LiveTask:
    """A task the core has admitted (or tried to): its schedule and roles, and how it ended."""

    label: str
    task: Task
    schedule: Schedule
    state: NetworkState
    figures: RoundFigures | None
    #: The id its flows (cookie), ports and roles carry (`NetworkPort.new_install_id`).
    install_id: int
    execution: Execution | None = None
    admitted_s: float = 0.0
    reservation_enforced: bool = False
    #: The task's state (`orchestrator.lifecycle.states`) and, once final, why.
    status: str = st.SCHEDULED
    reason: str = ""
    #: The last round recorded while the task ran, and when its events were last read (monotonic).
    rounds_recorded: int = 0
    progress_read_t: float = 0.0
    #: Moves so far; the move whose next round start is not yet recorded; when the last good round
    #: ended (roles' clock); G's first round start (from the first execution); G's latest checkpoint.
    moves: int = 0
    pending_move: int | None = None
    last_round_end_t: float | None = None
    first_broadcast_t: float | None = None
    checkpoint: Path | None = None
    #: Sites whose role loss was already recorded (this execution).
    lost_seen: set[str] = field(default_factory=set)
    #: The log directory of the task (each move's roles log in a subdirectory).
    log_dir: Path | None = None
    last_move_s: float = 0.0
    #: The task's result once done (`orchestrator.runtime.summaries.TaskResult`).
    result: Any = None

    @property
    def scheduler(self) -> str:
        """The label the task is recorded under (kept for the drivers' readability)."""
        return self.label

    @property
    def ended(self) -> bool:
        return self.status in st.FINAL


@dataclass
class CounterReads:
    """Tasks whose flow counters are still settling: (label, task id, install id) -> (last read, bytes)."""

    pending: dict[tuple[str, int, int], tuple[float, int | None]] = field(default_factory=dict)
