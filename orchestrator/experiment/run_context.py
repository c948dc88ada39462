"""An emulated experiment's run as the drivers see it: the lifecycle core on the emulation's ports,
and the objects the faults and the online sampler act on (the emulation, the site servers).

`lifecycle_for` is the one place where an experiment config becomes the core's ports and settings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.emulation.background_view import BackgroundView, settings_for
from orchestrator.emulation.network_port import ControllerNetwork
from orchestrator.experiment.config import ExperimentConfig, TaskConfig
from orchestrator.experiment.lost_machines import MachineWatch, machine_watch
from orchestrator.lifecycle.core import Lifecycle, RunClock
from orchestrator.lifecycle.recorder import DbRecorder
from orchestrator.results.db import ResultsDB
from orchestrator.runtime.compute_model import for_training, resolve
from orchestrator.runtime.compute_port import ServerCompute
from orchestrator.runtime.task_runner import FLOptions
from orchestrator.scheduling.cost import emulated_rate
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan


def fl_options(task: TaskConfig, *, rounds: int, seed: int) -> FLOptions:
    """How a task of an experiment learns: the learning spec of its config's `task` section, with the
    task's own rounds and seed."""
    return FLOptions.of(task, rounds=rounds, seed=seed)


def background_view(cfg: ExperimentConfig, client: Any, plan: EmulationPlan, *, db: ResultsDB, run_id: int,
                    clock: RunClock, live: bool = False) -> BackgroundView:
    """What measures the background the schedulers see (`orchestrator.emulation.background_view`),
    settled to the config's pattern (`live`: counters exact when read, the tc datapath's); each
    measurement, and the settings, go into the database."""
    bg = cfg.background
    settings = settings_for(bg.pattern, mean_on_s=bg.mean_on_s, mean_off_s=bg.mean_off_s, live=live)
    db.update_environment(run_id, background_view={"source": "background flow counters", "window_s": settings.window_s,
                                                   "max_cv": settings.max_cv, "timeout_s": settings.timeout_s})
    return BackgroundView(client, plan, settings, on_measured=lambda m: db.record_background_view(
        run_id, m.key, clock.of(m.taken_at), m))


@dataclass
class ExperimentRun:
    """The core of one emulated run and what its drivers act on besides it."""

    core: Lifecycle
    cfg: ExperimentConfig
    emu: Any
    compute: ServerCompute
    db: ResultsDB
    run_id: int
    plan: EmulationPlan
    model: NetworkModel
    #: Sets the background load to a fraction (a fault event's load step), or None.
    background_step: Callable[[float], None] | None = None
    #: The far machines lost mid-run, as links down (`orchestrator.experiment.lost_machines`); None
    #: without servers on other machines.
    machines: MachineWatch | None = None


def lifecycle_for(cfg: ExperimentConfig, emu: Any, manager: Any, *, db: ResultsDB, run_id: int,
                  plan: EmulationPlan, model: NetworkModel, run_dir: Path, clock_start_s: float = 0.0,
                  install_ids: Iterator[int] | None = None) -> ExperimentRun:
    """The lifecycle core of `cfg`'s run on the emulation `emu` and the site servers `manager`; its
    clock reads `clock_start_s` emulated seconds now (a later session of the run goes on from the last);
    its tasks' install ids come from `install_ids` (default 1, 2, ...: the emulation's own, when
    another session ran on it before)."""
    delay = bool(getattr(emu.info, "delay_emulated", False))
    k = plan.time_dilation
    clock = RunClock(time.monotonic() - clock_start_s * k, dilation=k)
    live = getattr(emu.info, "datapath", "") == "tc"  # the tc datapath's counters are exact when read
    view = background_view(cfg, emu.client, plan, db=db, run_id=run_id, clock=clock, live=live)
    network = ControllerNetwork(emu.client, plan, delay_emulated=delay, background_view=view, install_ids=install_ids,
                                background_per_task=cfg.mode != "online", live_counters=live,
                                paced=cfg.emulation.pace_copies)
    faults = bool(getattr(cfg, "faults", False))
    compute = ServerCompute(manager, model=model, rate=emulated_rate(plan), propagation=delay,
                            train_allowance_s=cfg.task.train_allowance_s * k, time_dilation=k,
                            options=lambda task: fl_options(cfg.task, rounds=task.rounds, seed=cfg.seed + task.id),
                            checkpoint=faults, links_dir=run_dir / "tasks",
                            training=(training := resolve(cfg.task, cfg.compute)).cost,
                            pace_copies=cfg.emulation.pace_copies)
    core = Lifecycle(network=network, compute=compute, recorder=DbRecorder(db, run_id), clock=clock, model=model,
                     dilation=k, release_on_end=cfg.mode == "online",
                     schedulers=lambda label: for_training(cfg.scheduler(label), training, cfg.task.local_epochs),
                     whole_updates=cfg.task.compression == "none", faults=faults)
    machines = machine_watch(emu, plan, lambda label, **fault: db.record_fault(run_id, label, **fault), clock.now,
                             on_lost=getattr(manager, "lose", None))
    return ExperimentRun(core=core, cfg=cfg, emu=emu, compute=compute, db=db, run_id=run_id, plan=plan, model=model,
                         machines=machines)
