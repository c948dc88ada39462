"""The recorder port on the run's results database, and the round figures the core records.

`round_bound` and `round_policy` are pure: the figures of a round as every engine records them
(one definition; `docs/architecture.md`, "Definitions of the measured quantities").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from orchestrator.lifecycle.ports import Events
from orchestrator.results.db import ResultsDB
from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.cost import RoundBound, RoundFigures
from orchestrator.scheduling.tasks import Task


def round_bound(figures: RoundFigures, schedule: Schedule, r: Any) -> RoundBound:
    """The lower bound of round `r`: with the round's own fastest training, and the joint bound
    only if every local trained and none was left out (`orchestrator.scheduling.cost`)."""
    every_local = r.trained >= len(schedule.local_sites) and not r.stragglers
    return replace(figures.lower_bound, train_s=r.train_min_s, joint_s=figures.joint_s if every_local else 0.0)


def round_reference_s(figures: RoundFigures, r: Any) -> float:
    """The physical reference of round `r`: the schedule's, with the round's own fastest training."""
    return replace(figures.reference, train_s=r.train_min_s).lower_s


def round_policy(schedule: Schedule, events: Events) -> str:
    """The local-model selection policy G logged (``all`` when it logged none)."""
    chose = [e for e in events.get(schedule.global_site, ()) if e.get("event") == "selected"]
    return str(chose[0].get("policy", "all")) if chose else "all"


class DbRecorder:
    """`orchestrator.lifecycle.ports.Recorder` on one run of a `ResultsDB`.

    While a task runs its rows are written as they come (a live view sees them). From `hold` (the
    core's start of a task's end) its writes are kept back, and `seal` writes them in one transaction
    that also marks the task's record whole (`ResultsDB.seal_task`): a crash at any moment leaves the
    task either whole or half recorded, and the half-recorded ones are discarded
    (`orchestrator.results.durability`)."""

    def __init__(self, db: ResultsDB, run_id: int) -> None:
        self.db = db
        self.run_id = run_id
        self._held: dict[tuple[str, int], list[Callable[[], None]]] = {}

    def _write(self, label: str, task_id: int, write: Callable[[], None]) -> None:
        held = self._held.get((label, task_id))
        if held is None:
            write()
        else:
            held.append(write)

    def hold(self, label: str, task_id: int) -> None:
        """Keep the task's writes back until `seal`."""
        self._held.setdefault((label, task_id), [])

    def seal(self, label: str, task_id: int) -> None:
        """The task's held writes and its mark as whole, in one transaction."""
        writes = self._held.pop((label, task_id), [])
        with self.db.transaction():
            for write in writes:
                write()
            self.db.seal_task(self.run_id, label, task_id)

    def task(self, label: str, task: Task, *, arrival_s: float) -> None:
        with self.db.transaction():
            self.db.record_task(self.run_id, label, task, state="pending", complete=False)
            self.db.set_task_times(self.run_id, label, task.id, arrival_s=arrival_s)
            self.db.set_task_state(self.run_id, label, task.id, "pending", at_s=arrival_s)

    def state(self, label: str, task_id: int, state: str, reason: str = "", *, at_s: float) -> None:
        self._write(label, task_id, lambda: self.db.set_task_state(self.run_id, label, task_id, state, reason,
                                                                   at_s=at_s))

    def times(self, label: str, task_id: int, **times: float | None) -> None:
        self._write(label, task_id, lambda: self.db.set_task_times(self.run_id, label, task_id, **times))

    def network_state(self, label: str, task_id: int, state: NetworkState) -> None:
        self._write(label, task_id, lambda: self.db.record_network_state(self.run_id, label, task_id, state))

    def schedule(self, label: str, schedule: Schedule, lower_bound_s: float) -> None:
        self._write(label, schedule.task_id,
                    lambda: self.db.record_schedule(self.run_id, schedule, lower_bound_s, scheduler=label))

    def rounds(self, label: str, schedule: Schedule, rounds: Sequence[Any], bounds: Sequence[RoundBound],
               reference_s: Sequence[float], *, policy: str, node_rows: list[dict[str, Any]]) -> None:
        rows = list(zip(rounds, bounds, reference_s, strict=True))
        self._write(label, schedule.task_id, lambda: self._rounds(label, schedule.task_id, rows, policy, node_rows))

    def _rounds(self, label: str, task_id: int, rows: list[tuple[Any, RoundBound, float]], policy: str,
                node_rows: list[dict[str, Any]]) -> None:
        with self.db.transaction():
            for r, bound, ref in rows:
                accuracy = None if r.accuracy != r.accuracy else r.accuracy  # NaN: no training was run
                self.db.record_round(
                    self.run_id, label, task_id, r.round, latency_s=r.latency_s, broadcast_s=r.broadcast_s,
                    train_s=r.train_s, upload_s=r.upload_s, accuracy=accuracy, lower_bound_s=bound.lower_s,
                    stragglers=len(r.stragglers), broadcast_all_s=r.broadcast_all_s, upload_tail_s=r.upload_tail_s,
                    broadcast_bound_s=bound.broadcast_s, upload_bound_s=bound.upload_s, reference_s=ref)
                self.db.record_round_selection(self.run_id, label, task_id, r.round, policy=policy,
                                               selected=r.selected, upload_bytes=r.upload_bytes)
            self.db.record_node_rounds(self.run_id, label, task_id, node_rows)

    def setup(self, label: str, task_id: int, **figures: float | int | bool) -> None:
        self._write(label, task_id, lambda: self.db.set_task_setup(self.run_id, label, task_id, **figures))

    def move(self, label: str, task_id: int, move: int, **fields: Any) -> None:
        self._write(label, task_id, lambda: self.db.record_move(self.run_id, label, task_id, move, **fields))

    def carried_bytes(self, label: str, task_id: int, carried: int) -> None:
        self._write(label, task_id, lambda: self.db.add_carried_bytes(self.run_id, label, task_id, carried))

    def tcp_bytes(self, label: str, task_id: int, sent: int | None, retrans: int | None) -> None:
        self._write(label, task_id, lambda: self.db.set_tcp_bytes(self.run_id, label, task_id, sent, retrans))

    def fidelity(self, label: str, task_id: int, *, hops: list[dict[str, Any]],
                 overruns: list[dict[str, Any]], link_rates: list[dict[str, Any]],
                 trainings: list[dict[str, Any]]) -> None:
        self._write(label, task_id, lambda: self.db.record_fidelity(
            self.run_id, label, task_id, hops=hops, overruns=overruns, link_rates=link_rates, trainings=trainings))


class NullRecorder:
    """`orchestrator.lifecycle.ports.Recorder` that keeps nothing (a running network without a database)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kw: None
