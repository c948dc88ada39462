"""The lifecycle core's three ports (and its clock): what the core needs from a network, from the
compute that runs a task's roles, and from whatever records the run.

The core (`orchestrator.lifecycle.core`) holds the only copy of a task's states and of the policy
(admission, faults, moves); each engine implements these ports: the emulation and the running
network (`orchestrator.emulation.network_port`), the site servers (`orchestrator.runtime.compute_port`),
the flow-level simulation (`orchestrator.simulation.ports`) and the results database
(`orchestrator.lifecycle.recorder.DbRecorder`). The fakes the core's tests use live in one module,
``tests/unit/lifecycle_fakes.py``.

This module must not import any engine: it only states the contracts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.cost import RateFn
from orchestrator.scheduling.tasks import Task

#: A role's timing events by site (the JSON lines the agents log; `workers.rounds`).
Events = Mapping[str, Sequence[Mapping[str, Any]]]
#: A link as a sorted site pair.
Link = tuple[str, str]


def link_name(link: Link) -> str:
    """``A - B`` (site names may contain hyphens)."""
    return f"{link[0]} - {link[1]}"


class Clock(Protocol):
    """The run's clock: seconds since the run started (what every recorded time is on)."""

    def now(self) -> float:
        """Now, on the run's clock."""
        ...

    def of(self, t: float) -> float:
        """A time stamped by the roles (CLOCK_MONOTONIC in an emulation) on the run's clock."""
        ...


class NetworkPort(Protocol):
    """Install and remove a task's paths, read its carried bytes, the links' state and load.

    Contract:

    - `install` raises on any failure (nothing of the task is left installed then); it returns
      whether the task's reservation is enforced by the links (a rate class per task).
    - `remove` and `task_bytes` take the *install id* (`new_install_id`): the id the task's flows
      carry, unique in the run, so that a task's next install (a move, or the same task under the
      next scheduler) never meets the flows of this one while their counters settle.
    - `task_bytes` raises if the install id has no flows.
    - `background` is the load the scheduler must see on each directed link (model units), or
      None while it cannot be measured (the controller restarts): the core then keeps the last.
      Asked with a `task_id` (an arrival), it may hand every scheduler of that task the same
      load; without one (a re-scheduling look), the load as it is now.
    """

    #: Whether link delays are emulated (the bounds count propagation only then).
    delay_emulated: bool
    #: The rate a directed link carries (`orchestrator.scheduling.cost`): the bounds' rates.
    rate: RateFn
    #: Seconds two reads of a task's counters must be apart to be final (0: final at once).
    counter_settle_s: float
    #: The share of a link's rate the transport leaves a task's bytes (the per-hop floor's).
    payload_share: float
    #: Bytes a directed link passes ahead of its rate after an idle gap (its shaper's burst; 0 where
    #: nothing bursts): the link-rate check judges a link only where a round's copies on it are many
    #: times that (`orchestrator.lifecycle.fidelity.SATURATING_BURSTS`).
    link_burst_bytes: Callable[[str, str], int]

    def new_install_id(self) -> int: ...

    def install(self, wire: Schedule) -> bool: ...

    def remove(self, install_id: int) -> None: ...

    def task_bytes(self, install_id: int) -> int: ...

    def background(self, state: NetworkState, task_id: int | None = None) -> dict[tuple[str, str], float] | None:
        ...


class Execution(Protocol):
    """One task's roles, started and followed without blocking (one per install of a task).

    `check` returns True once every role has finished; it raises RuntimeError when a role failed
    (or its server is gone) and the task cannot go on without it, TimeoutError past the task's
    budget. `stop` is idempotent. Roles other than G that are lost while the task may go on
    without them are listed in `lost_roles` (site -> why).
    """

    first_round: int
    log_dir: Path
    lost_roles: dict[str, str]

    def start(self) -> None: ...

    def check(self, statuses: Any) -> bool: ...

    def stop(self) -> None: ...

    def events(self) -> dict[str, list[dict[str, Any]]]: ...

    def rounds_completed(self, events: Any = None) -> int: ...

    @property
    def checkpoint_file(self) -> Path: ...

    def rounds_so_far(self, events: Any) -> list[Any]:
        """The rounds G has completed (`orchestrator.runtime.summaries.RoundResult`)."""
        ...

    def node_rows(self, events: Any, clock_of: Any) -> list[dict[str, Any]]:
        """What every node did in each round, on the run's clock (the ``node_rounds`` table)."""
        ...

    def result(self, events: Any = None) -> Any:
        """The task's result (`orchestrator.runtime.summaries.TaskResult`)."""
        ...


class ComputePort(Protocol):
    """Start, poll and stop a task's roles on the sites' compute.

    `launch` prepares (does not start) the roles of `wire` (the schedule under its install id);
    `poll` returns the servers' status replies that `Execution.check` reads; `lost` names the
    sites whose server is gone (site -> why).
    """

    @property
    def lost(self) -> Mapping[str, str]: ...

    def task_dir(self, name: str) -> Path: ...

    def launch(self, wire: Schedule, *, task: Task, schedule: Schedule, log_dir: Path, first_round: int,
               init_model: Path | None) -> Execution: ...

    def poll(self, sites: Sequence[str] | None = None) -> dict[str, dict[str, Any]]: ...


class Recorder(Protocol):
    """Where the core writes what happens to each task (the results database of the run).

    Every time is on the run's clock. ``label`` is the scheduler's label in the run (a scheduler,
    or ``<scheduler>/<policy>`` when a trace runs several rescheduling policies).
    """

    def task(self, label: str, task: Task, *, arrival_s: float) -> None: ...

    def hold(self, label: str, task_id: int) -> None:
        """From the start of the task's end: keep its writes back until `seal`."""

    def seal(self, label: str, task_id: int) -> None:
        """Write what `hold` kept back and mark the task's record whole, in one transaction."""

    def state(self, label: str, task_id: int, state: str, reason: str = "", *, at_s: float) -> None: ...

    def times(self, label: str, task_id: int, **times: float | None) -> None: ...

    def network_state(self, label: str, task_id: int, state: NetworkState) -> None: ...

    def schedule(self, label: str, schedule: Schedule, lower_bound_s: float) -> None: ...

    def rounds(self, label: str, schedule: Schedule, rounds: Sequence[Any], bounds: Sequence[Any],
               reference_s: Sequence[float], *, policy: str, node_rows: list[dict[str, Any]]) -> None: ...

    def setup(self, label: str, task_id: int, **figures: float | int | bool) -> None: ...

    def move(self, label: str, task_id: int, move: int, **fields: Any) -> None: ...

    def carried_bytes(self, label: str, task_id: int, carried: int) -> None: ...

    def tcp_bytes(self, label: str, task_id: int, sent: int | None, retrans: int | None) -> None: ...

    def fidelity(self, label: str, task_id: int, *, hops: list[dict[str, Any]],
                 overruns: list[dict[str, Any]], link_rates: list[dict[str, Any]],
                 trainings: list[dict[str, Any]]) -> None: ...
