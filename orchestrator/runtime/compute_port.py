"""The lifecycle's compute port on site servers (`orchestrator.lifecycle.ports.ComputePort`).

`ServerCompute` starts a task's roles on the site servers of a `ComputeManager` (one per emulated
site, any backend: process, docker, remote); `TaskServers` brings up servers for one task's sites
only, in a running network's hosts (``netai task run --attach``). Both hand the core a `RolesRun`:
a `TaskExecution` that also summarizes its own events.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.runtime.compute import ComputeManager
from orchestrator.runtime.summaries import RoundResult, node_rounds, rounds_so_far
from orchestrator.runtime.task_runner import FLOptions, TaskExecution, pace_rates
from orchestrator.runtime.timing import task_timing
from orchestrator.scheduling.cost import RateFn
from orchestrator.scheduling.schedule import Schedule
from orchestrator.scheduling.tasks import Task
from topologies.model import NetworkModel
from workers.compute import NOT_MODELLED, TrainingCost


class EventTail:
    """One role's events file, read incrementally: each call parses only the complete lines written
    since the last (a torn last line waits for its end), so following a task never re-reads a file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.events: list[dict[str, Any]] = []
        self._offset = 0
        self._inode: int | None = None

    def read(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as f:
                st = os.fstat(f.fileno())
                if st.st_ino != self._inode or st.st_size < self._offset:  # a new file: from the top
                    self._inode, self._offset, self.events = st.st_ino, 0, []
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return self.events
        end = chunk.rfind(b"\n") + 1
        self._offset += end
        for line in chunk[:end].splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a line an agent that was killed left torn
            if isinstance(ev, dict):
                self.events.append(ev)
        return self.events


class RolesRun(TaskExecution):
    """A `TaskExecution` that summarizes its own events for the core (`ports.Execution`), reading
    each role's events file incrementally (`EventTail`)."""

    on_stop: Callable[[], None] | None = None

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self._tails = {n: EventTail(p) for n, p in self.paths.items()}

    def start(self) -> None:
        super().start()  # removes the old files: the tails start over
        self._tails = {n: EventTail(p) for n, p in self.paths.items()}

    def events(self) -> dict[str, list[dict[str, Any]]]:
        return {n: list(t.read()) for n, t in self._tails.items()}

    def rounds_so_far(self, events: Mapping[str, Any]) -> list[RoundResult]:
        return rounds_so_far(self.schedule, events, first=self.first_round)

    def node_rows(self, events: Mapping[str, Any], clock_of: Callable[[float], float]) -> list[dict[str, Any]]:
        return node_rounds(self.schedule, events, clock_of)

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.on_stop is not None:
                done, self.on_stop = self.on_stop, None
                done()


class ServerCompute:
    """`ComputePort` on a `ComputeManager`'s site servers.

    Parameters
    ----------
    manager
        The site servers (`orchestrator.runtime.compute.ComputeManager`), already up.
    model, rate, propagation, train_allowance_s
        What the roles' timing budgets are computed from (`orchestrator.runtime.timing.task_timing`).
    options
        How a task learns: `FLOptions` for a task (its rounds and seed are the task's).
    checkpoint
        G checkpoints after every round and lost roles other than G are tolerated (faults, moves).
    training
        The tasks' modelled training cost, per round and per example, in seconds of one emulated
        core (`orchestrator.runtime.compute_model.training_cost`; none: training takes what it takes
        on this host). A local's site runs it on its ``cpu`` emulated cores, at most the role's
        training threads.
    time_dilation
        The emulation's time dilation: modelled durations last this many times as long.
    links_dir
        Where each task's log directory is also linked from, by its name (the run folder's ``tasks/``).
    dir_name
        The one task's log directory name, whatever the core calls it (``netai task run``: ``agents``).
    """

    def __init__(self, manager: Any, *, model: NetworkModel, rate: RateFn, propagation: bool,
                 train_allowance_s: float, options: Callable[[Task], FLOptions], checkpoint: bool = False,
                 links_dir: Path | None = None, dir_name: str | None = None, training: TrainingCost = NOT_MODELLED,
                 time_dilation: float = 1.0, pace_copies: bool = False) -> None:
        self.training = training
        self.pace_copies = pace_copies
        self.time_dilation = time_dilation
        self.links_dir = links_dir
        self.dir_name = dir_name
        self.manager = manager
        self.model = model
        self.rate = rate
        self.propagation = propagation
        self.train_allowance_s = train_allowance_s
        self.options = options
        self.checkpoint = checkpoint

    @property
    def lost(self) -> Mapping[str, str]:
        return self.manager.lost

    def task_dir(self, name: str) -> Path:
        path: Path = self.manager.task_dir(self.dir_name or name)
        if self.links_dir is not None:
            link = self.links_dir / name
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.exists() and not link.is_symlink():
                link.symlink_to(path.resolve(), target_is_directory=True)
        return path

    def poll(self, sites: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        return self.manager.poll(sites)

    def restart_server(self, site: str) -> float:
        return self.manager.restart_server(site)

    def launch(self, wire: Schedule, *, task: Task, schedule: Schedule, log_dir: Path, first_round: int,
               init_model: Path | None) -> RolesRun:
        timing = task_timing(self.model, schedule, task.model_bytes, rate=self.rate, propagation=self.propagation,
                             train_allowance_s=self.train_allowance_s, time_dilation=self.time_dilation)
        options = self.options(task)
        run = RolesRun(wire, manager=self.manager, options=options, log_dir=log_dir, timing=timing,
                       first_round=first_round, init_model=init_model, checkpoint=self.checkpoint,
                       tolerate_lost=self.checkpoint)
        if self.training.modelled:
            for n in wire.local_sites:
                speed = min(float(options.threads), self.model.site(n).cpu)
                run.configs[n] = replace(run.configs[n], train_s_per_example=self.training.s_per_example,
                                         train_s_per_round=self.training.s_per_round,
                                         site_speed=speed, time_dilation=self.time_dilation)
        if self.pace_copies:
            for n, pace in pace_rates(wire, self.rate).items():
                run.configs[n] = replace(run.configs[n], pace_mbps=pace)
        return run


class TaskServers(ServerCompute):
    """`ComputePort` that brings up site servers for one task's sites when it launches, in hosts a
    running network already has (``--attach``), and takes them down when the roles stop.

    `hosts`: site -> (host pid, address, host name); `backend`: builds a backend for some of them.
    """

    def __init__(self, hosts: Mapping[str, tuple[int, str, str]], backend: Callable[[dict[str, Any], Path], Any],
                 log_root: Path, **kw: Any) -> None:
        super().__init__(None, **kw)
        self.hosts = dict(hosts)
        self.backend = backend
        self.log_root = log_root
        self.on_up: Callable[[int], None] | None = None

    @property
    def lost(self) -> Mapping[str, str]:
        return {} if self.manager is None else self.manager.lost

    def task_dir(self, name: str) -> Path:
        return self.log_root  # the driver's folder for this one task

    def poll(self, sites: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
        return {} if self.manager is None else self.manager.poll(sites)

    def launch(self, wire: Schedule, *, task: Task, schedule: Schedule, log_dir: Path, first_round: int,
               init_model: Path | None) -> RolesRun:
        nodes = schedule.overlay_nodes
        manager = ComputeManager(self.backend({n: self.hosts[n] for n in nodes}, log_dir), nodes)
        manager.__enter__()
        self.manager = manager
        try:
            if self.on_up is not None:
                self.on_up(len(manager.servers))
            run = super().launch(wire, task=task, schedule=schedule, log_dir=manager.task_dir("agents"),
                                 first_round=first_round, init_model=init_model)
        except BaseException:
            manager.__exit__(None, None, None)
            raise
        run.on_stop = lambda: manager.__exit__(None, None, None)
        return run
