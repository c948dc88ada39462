"""The lifecycle's ports on the flow-level simulation: a task is "installed" and its roles
"launched" by adding its run to a batch, which SimGrid simulates in one go (`SimBatch.run`); the
core then follows and records every task exactly as it does an emulated one.

The batch keeps the simulation's speed (one engine process per group of runs, `spec.simulate`),
while the states, bounds and records come from the one lifecycle core. Simulated time is the run's
clock (`SimBatch.now`): a task arrives, is admitted and starts its first broadcast when its run
starts (the simulation models no set-up), and ends when its run ends.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.runtime.summaries import RoundResult, TaskResult, node_rounds, summarize
from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.cost import RateFn
from orchestrator.scheduling.tasks import Task
from orchestrator.simulation.background import SimBackground
from orchestrator.simulation.frames import wire_bytes_factor
from orchestrator.simulation.spec import SimParams, TaskRun, build_spec, simulate
from topologies.model import NetworkModel
from topologies.shaping import burst_bytes


class SimBatch:
    """The runs the core has launched, simulated together once every task is admitted."""

    def __init__(self, model: NetworkModel, params: SimParams, rate: RateFn,
                 background: SimBackground | None = None,
                 frames: Callable[[int], Sequence[int]] | None = None) -> None:
        self.model = model
        self.params = params
        self.rate = rate
        self.background = background
        #: A copy's frames at a chunk size (`spec.build_spec`); None: not modelled.
        self.frames = frames
        self.runs: list[TaskRun] = []
        self.results: dict[str, dict[str, Any]] = {}
        self.result: dict[str, Any] = {"runs": [], "sim_end_s": 0.0}
        self.ran = False
        #: Per run: wire bytes per byte on its links, ACKs included (`frames.wire_bytes_factor`).
        self.wire_factors: dict[str, float] = {}
        #: Where the engine processes' files go (a run's own folder: what a killed run leaves stays
        #: there, `orchestrator.experiment.simulated` removes it on resume); None: the system's temp.
        self.work_dir: Path | None = None

    def add(self, run: TaskRun) -> None:
        if self.ran:
            raise RuntimeError("the simulation already ran: admit every task before it runs")
        self.runs.append(run)

    def run(self) -> dict[str, Any]:
        """Simulate every run added (once); the engine's result."""
        if not self.ran:
            self.ran = True
            if self.runs:
                spec = build_spec(self.model, self.runs, self.params, self.rate, self.background, self.frames)
                self.wire_factors = {r["key"]: wire_bytes_factor(r, self.params.wire_bytes_factor) for r in spec["runs"]}
                self.result = simulate(spec, work_dir=self.work_dir)
            self.results = {r["key"]: r for r in self.result["runs"]}
        return self.result

    # the run's clock: simulated seconds
    def now(self) -> float:
        return float(self.result.get("sim_end_s", 0.0)) if self.ran else 0.0

    def of(self, t: float) -> float:
        return float(t)


class SimNetwork:
    """`NetworkPort` of the simulation: paths need no install; carried bytes are the simulated
    bytes over every link the task's transfers crossed, as wire bytes (`frames.wire_bytes_factor`:
    the emulation counts frames, headers and ACKs included).

    `replay` (task id -> load per directed link, model Mbit/s) gives a task's schedulers the
    background an emulated run's schedulers were given for it (`netai validate`: the same inputs,
    so the same decisions); a task not in it gets the modelled view."""

    counter_settle_s = 0.0

    def __init__(self, batch: SimBatch, *, propagation: bool,
                 replay: Mapping[int, Mapping[tuple[str, str], float]] | None = None) -> None:
        self.batch = batch
        self.replay = replay
        #: The task ids whose schedulers asked for the background.
        self.asked: set[int] = set()
        self.rate = batch.rate
        self.delay_emulated = propagation
        self.payload_share = batch.params.tcp_efficiency  # its transfers' share of a link's rate
        #: What a link passes ahead of its rate: nothing on a flow-level link, unless the run models the
        #: emulation's shaper at its K (`SimParams.shaper_burst_k`, `orchestrator.simulation.shaper`).
        k = batch.params.shaper_burst_k
        self.link_burst_bytes: Callable[[str, str], int] = \
            (lambda a, b: burst_bytes(self.rate(a, b) / k)) if k > 0 else (lambda a, b: 0)
        self._ids = itertools.count(1)
        #: install id -> the run's key in the batch.
        self.keys: dict[int, str] = {}

    @property
    def replayed(self) -> set[int]:
        """The task ids whose schedulers were given a replayed background."""
        return self.asked & set(self.replay or ())

    def new_install_id(self) -> int:
        return next(self._ids)

    def install(self, wire: Schedule) -> bool:
        return False  # a flow-level model: nothing enforces a reservation but the schedule itself

    def remove(self, install_id: int) -> None:
        self.keys.pop(install_id, None)

    def task_bytes(self, install_id: int) -> int:
        key = self.keys.get(install_id, "")
        r = self.batch.results.get(key)
        if r is None:
            raise LookupError(f"install {install_id} was not simulated")
        factor = self.batch.wire_factors.get(key, self.batch.params.wire_bytes_factor)
        return round(sum(int(n) for _, _, n in r["link_bytes"]) * factor)

    def background(self, state: NetworkState, task_id: int | None = None) -> dict[tuple[str, str], float] | None:
        """The background flows' own traffic per directed link (`SimBackground.view_mbps`), the
        same for every task: never a task's traffic (the emulated view's rule). None without
        background. A task in `replay` gets its replayed view instead."""
        if task_id is not None:
            self.asked.add(task_id)
        if self.replay is not None and task_id is not None and task_id in self.replay:
            return dict(self.replay[task_id])
        bg = self.batch.background
        return None if bg is None else bg.view_mbps()


class SimExecution:
    """`Execution` of one simulated run: its events are the engine's."""

    def __init__(self, batch: SimBatch, key: str, wire: Schedule, rounds: int, log_dir: Path) -> None:
        self.batch = batch
        self.key = key
        self.schedule = wire
        self.rounds = rounds
        self.first_round = 1
        self.log_dir = log_dir
        self.lost_roles: dict[str, str] = {}

    def start(self) -> None:
        """Nothing to start: the batch runs once every task is admitted."""

    def stop(self) -> None:
        """Nothing to stop."""

    def _run(self) -> dict[str, Any]:
        self.batch.run()
        r = self.batch.results.get(self.key)
        if r is None:
            raise RuntimeError("the simulation did not finish the task")
        return r

    def check(self, statuses: Mapping[str, Mapping[str, Any]]) -> bool:
        self._run()
        return True

    def events(self) -> dict[str, list[dict[str, Any]]]:
        events: dict[str, list[dict[str, Any]]] = self._run()["events"]
        for ev in events.get(self.schedule.global_site, []):
            if ev["event"] == "round_complete" and "accuracy" not in ev:  # no training is run
                ev.update(accuracy=math.nan, loss=math.nan, num_examples=0)
        return events

    def rounds_completed(self, events: Any = None) -> int:
        evs = (self.events() if events is None else events).get(self.schedule.global_site, [])
        return max((int(e["round"]) for e in evs if e.get("event") == "round_complete"), default=0)

    @property
    def checkpoint_file(self) -> Path:
        return self.log_dir / "no-checkpoint"  # a simulated task is never moved

    def rounds_so_far(self, events: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[RoundResult]:
        return summarize(self.schedule, events, rounds=self.rounds_completed(events))

    def node_rows(self, events: Mapping[str, Sequence[Mapping[str, Any]]], clock_of: Any) -> list[dict[str, Any]]:
        return node_rounds(self.schedule, events, clock_of)

    def result(self, events: Any = None) -> TaskResult:
        r = self._run()
        events = self.events() if events is None else events
        return TaskResult(task_id=self.schedule.task_id, backend="simulation", scheduler=self.schedule.scheduler,
                          rounds=tuple(summarize(self.schedule, events, rounds=self.rounds)),
                          model_bytes=0, log_dir="", chunk_bytes=int(r["chunk_bytes"]),
                          started_t=float(r["start_s"]), first_broadcast_t=float(r["start_s"]),
                          finished_t=float(r["end_s"]))


class SimCompute:
    """`ComputePort` of the simulation: a launch adds the task's run to the batch."""

    lost: Mapping[str, str] = {}

    def __init__(self, batch: SimBatch, network: SimNetwork, run_dir: Path) -> None:
        self.batch = batch
        self.network = network
        self.run_dir = run_dir

    def task_dir(self, name: str) -> Path:
        return self.run_dir / "tasks" / name  # not created: a simulated task writes no logs

    def launch(self, wire: Schedule, *, task: Task, schedule: Schedule, log_dir: Path, first_round: int,
               init_model: Path | None) -> SimExecution:
        key = f"{schedule.scheduler}/{task.id}/{wire.task_id}"
        self.batch.add(TaskRun(key, schedule, task.model_bytes, task.rounds))
        self.network.keys[wire.task_id] = key
        return SimExecution(self.batch, key, schedule, task.rounds, log_dir)

    def poll(self, sites: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        return {}
