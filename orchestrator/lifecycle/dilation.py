"""Time dilation on the records: every duration the core records is in emulated time.

Under a dilation K (`EmulationPlan.dilated`) the emulated network and the modelled sites run K times
slower than the time they emulate. The run's clock (`RunClock` with ``dilation=K``) already reads
emulated seconds; what the roles measure as differences of their own time stamps (a round's latency
and its parts, set-up figures, overruns) is divided by K here, before it reaches the database. The
bounds and references need nothing: the core computes them on the undilated rates
(`ControllerNetwork`'s ``rate_scale``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

from orchestrator.lifecycle.ports import Recorder
from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.tasks import Task

#: Set-up figures measured by the roles in wall seconds (the rest are computed in emulated time).
MEASURED_SETUP_S = ("agents_ready_s", "connect_s")


def undilate_round(r: Any, k: float) -> Any:
    """A round's result with every duration (a float field named ``*_s``) divided by `k`."""
    return replace(r, **{f.name: getattr(r, f.name) / k for f in fields(r)
                         if f.name.endswith("_s") and isinstance(getattr(r, f.name), float)})


class DilatedRecorder:
    """A `Recorder` that divides what the roles measured by the dilation `k` (see the module docstring)."""

    def __init__(self, inner: Recorder, k: float) -> None:
        self.inner = inner
        self.k = k

    def rounds(self, label: str, schedule: Schedule, rounds: Sequence[Any], bounds: Sequence[Any],
               reference_s: Sequence[float], *, policy: str, node_rows: list[dict[str, Any]]) -> None:
        self.inner.rounds(label, schedule, [undilate_round(r, self.k) for r in rounds], bounds, reference_s,
                          policy=policy, node_rows=node_rows)

    def setup(self, label: str, task_id: int, **figures: float | int | bool) -> None:
        self.inner.setup(label, task_id, **{k: (v / self.k if k in MEASURED_SETUP_S and isinstance(v, float) else v)
                                            for k, v in figures.items()})

    def fidelity(self, label: str, task_id: int, *, hops: list[dict[str, Any]],
                 overruns: list[dict[str, Any]]) -> None:
        self.inner.fidelity(label, task_id, hops=hops, overruns=[
            o | {"real_s": o["real_s"] / self.k, "modelled_s": o["modelled_s"] / self.k} for o in overruns])

    # unchanged: times on the run's (dilated) clock, and what is not a duration
    def task(self, label: str, task: Task, *, arrival_s: float) -> None:
        self.inner.task(label, task, arrival_s=arrival_s)

    def state(self, label: str, task_id: int, state: str, reason: str = "", *, at_s: float) -> None:
        self.inner.state(label, task_id, state, reason, at_s=at_s)

    def times(self, label: str, task_id: int, **times: float | None) -> None:
        self.inner.times(label, task_id, **times)

    def network_state(self, label: str, task_id: int, state: NetworkState) -> None:
        self.inner.network_state(label, task_id, state)

    def schedule(self, label: str, schedule: Schedule, lower_bound_s: float) -> None:
        self.inner.schedule(label, schedule, lower_bound_s)

    def move(self, label: str, task_id: int, move: int, **fields_: Any) -> None:
        self.inner.move(label, task_id, move, **fields_)

    def carried_bytes(self, label: str, task_id: int, carried: int) -> None:
        self.inner.carried_bytes(label, task_id, carried)
