"""What the experiment's drivers share: the seeded task sets of the sequential mode, the order the
schedulers run each task in, and what a run gives back. The emulated runner
(`orchestrator.experiment.runner`) and the flow-level one (`orchestrator.experiment.simulated`) both
import it, so neither imports the other's module for it and both run the tasks in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.experiment.config import ExperimentConfig
from orchestrator.results.summary import RunSummary
from orchestrator.scheduling.tasks import Task, generate_tasks
from topologies.model import NetworkModel


@dataclass(frozen=True)
class RunOutcome:
    run_id: int
    run_dir: Path
    status: str
    report: Path | None
    #: The run's summary, computed once for the report and the terminal (None: writing the results failed).
    summary: RunSummary | None = None


def task_id_stride(tasks_per_point: int) -> int:
    """How far apart the points' first task ids are: 100 (point n's tasks are 100 n + 1, 100 n + 2, ...),
    or the first power of ten that holds a point's tasks when there are more than 100."""
    stride = 100
    while stride < tasks_per_point:
        stride *= 10
    return stride


def task_sets(cfg: ExperimentConfig, model: NetworkModel, model_bytes: int) -> dict[int, list[Task]]:
    """The seeded tasks of every point (number of locals); ids are unique in the run (point n's start
    at n times `task_id_stride` plus 1)."""
    stride = task_id_stride(cfg.tasks_per_point)
    return {
        n: generate_tasks(
            model, count=cfg.tasks_per_point, locals_per_task=n, seed=cfg.seed * 1000 + n, first_id=stride * n + 1,
            model_name=cfg.task.model, rounds=cfg.task.rounds, demand_mbps=cfg.task.demand_mbps,
            model_bytes=model_bytes,
        )
        for n in cfg.locals
    }


def scheduler_order(schedulers: Sequence[str], k: int, order: str = "rotate") -> tuple[str, ...]:
    """The order the schedulers run a point's `k`-th task in (k from 0). ``rotate``: the config's
    order rotated left by k (task 0: a, b, c; task 1: b, c, a; ...), so over a multiple of
    len(schedulers) tasks each scheduler runs first (and in every position) equally often and
    a drift of the instrument from one run of a task to the next (the machine warming, the
    background's on/off processes moving on) does not always favour the same scheduler; ``fixed``:
    the config's order for every task (runs before the rotation)."""
    names = tuple(schedulers)
    if order == "fixed" or not names:
        return names
    if order != "rotate":
        raise ValueError(f"unknown scheduler order {order!r}")
    i = k % len(names)
    return names[i:] + names[:i]


def check_memory(cfg: ExperimentConfig, model: NetworkModel, model_bytes: int) -> None:
    """Refuse, before anything starts, a run one of whose tasks a site cannot hold: G's and the
    locals' roles at their sites (`orchestrator.scheduling.memory`; relays are only known once scheduled,
    and admission blocks a task whose relay would not fit).

    Raises
    ------
    ConfigError
        One line naming the task, the site and its memory.
    """
    from orchestrator.errors import ConfigError
    from orchestrator.scheduling.memory import refusal, roles_by_site

    memory = {site: s.memory_mb for site, s in model.sites.items()}
    for tasks in task_sets(cfg, model, model_bytes).values():
        for task in tasks:
            why = refusal(memory, roles_by_site(task.global_site, task.local_sites, ()), model_bytes)
            if why is not None:
                raise ConfigError(f"task {task.id} ({len(task.local_sites)} locals) cannot run: {why} "
                                  "(a smaller model, or more memory_mb for the site in the topology)")


def site_peaks(compute: Any, model_bytes: int) -> dict[str, Any]:
    """The environment's record of every site server's peak resident memory (its status replies) against
    the model's size: ``site_peak_rss_mb`` {site: MB}, ``site_peak_per_model`` (the largest peak over
    the model's bytes) and ``site_peak_model_mb`` (the model's size, MB); empty when the servers
    reported none."""
    peaks = dict(getattr(compute, "peak_rss", {}) or {})
    if not peaks:
        return {}
    return {"site_peak_rss_mb": {site: round(b / 2**20, 1) for site, b in sorted(peaks.items())},
            "site_peak_per_model": round(max(peaks.values()) / max(model_bytes, 1), 1),
            "site_peak_model_mb": round(model_bytes / 2**20, 2)}
