"""The recorder port on the run's results database, and the round figures the core records.

`round_bound` and `round_policy` are pure: the figures of a round as every engine records them
(one definition; `docs/architecture.md`, "Definitions of the measured quantities").
"""

from __future__ import annotations

from collections.abc import Sequence
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
    """`orchestrator.lifecycle.ports.Recorder` on one run of a `ResultsDB`."""

    def __init__(self, db: ResultsDB, run_id: int) -> None:
        self.db = db
        self.run_id = run_id

    def task(self, label: str, task: Task, *, arrival_s: float) -> None:
        self.db.record_task(self.run_id, label, task, state="pending")
        self.db.set_task_times(self.run_id, label, task.id, arrival_s=arrival_s)
        self.db.set_task_state(self.run_id, label, task.id, "pending", at_s=arrival_s)

    def state(self, label: str, task_id: int, state: str, reason: str = "", *, at_s: float) -> None:
        self.db.set_task_state(self.run_id, label, task_id, state, reason, at_s=at_s)

    def times(self, label: str, task_id: int, **times: float | None) -> None:
        self.db.set_task_times(self.run_id, label, task_id, **times)

    def network_state(self, label: str, task_id: int, state: NetworkState) -> None:
        self.db.record_network_state(self.run_id, label, task_id, state)

    def schedule(self, label: str, schedule: Schedule, lower_bound_s: float) -> None:
        self.db.record_schedule(self.run_id, schedule, lower_bound_s, scheduler=label)

    def rounds(self, label: str, schedule: Schedule, rounds: Sequence[Any], bounds: Sequence[RoundBound],
               reference_s: Sequence[float], *, policy: str, node_rows: list[dict[str, Any]]) -> None:
        for r, bound, ref in zip(rounds, bounds, reference_s, strict=True):
            accuracy = None if r.accuracy != r.accuracy else r.accuracy  # NaN: no training was run
            self.db.record_round(
                self.run_id, label, schedule.task_id, r.round, latency_s=r.latency_s, broadcast_s=r.broadcast_s,
                train_s=r.train_s, upload_s=r.upload_s, accuracy=accuracy, lower_bound_s=bound.lower_s,
                stragglers=len(r.stragglers), broadcast_all_s=r.broadcast_all_s, upload_tail_s=r.upload_tail_s,
                broadcast_bound_s=bound.broadcast_s, upload_bound_s=bound.upload_s, reference_s=ref)
            self.db.record_round_selection(self.run_id, label, schedule.task_id, r.round, policy=policy,
                                           selected=r.selected, upload_bytes=r.upload_bytes)
        self.db.record_node_rounds(self.run_id, label, schedule.task_id, node_rows)

    def setup(self, label: str, task_id: int, **figures: float | int | bool) -> None:
        self.db.set_task_setup(self.run_id, label, task_id, **figures)

    def move(self, label: str, task_id: int, move: int, **fields: Any) -> None:
        self.db.record_move(self.run_id, label, task_id, move, **fields)

    def carried_bytes(self, label: str, task_id: int, carried: int) -> None:
        self.db.add_carried_bytes(self.run_id, label, task_id, carried)

    def tcp_bytes(self, label: str, task_id: int, sent: int | None, retrans: int | None) -> None:
        self.db.set_tcp_bytes(self.run_id, label, task_id, sent, retrans)

    def fidelity(self, label: str, task_id: int, *, hops: list[dict[str, Any]],
                 overruns: list[dict[str, Any]], link_rates: list[dict[str, Any]],
                 trainings: list[dict[str, Any]]) -> None:
        self.db.record_fidelity(self.run_id, label, task_id, hops=hops, overruns=overruns, link_rates=link_rates,
                                trainings=trainings)


class NullRecorder:
    """`orchestrator.lifecycle.ports.Recorder` that keeps nothing (a running network without a database)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return lambda *args, **kw: None
