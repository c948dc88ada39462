"""What the experiment's drivers share: the seeded task sets of the sequential mode and what a run
gives back. The emulated runner (`orchestrator.experiment.runner`) and the flow-level one
(`orchestrator.experiment.simulated`) both import it, so neither imports the other's module for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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


def task_sets(cfg: ExperimentConfig, model: NetworkModel, model_bytes: int) -> dict[int, list[Task]]:
    """The seeded tasks of every point (number of locals); ids are unique in the run."""
    return {
        n: generate_tasks(
            model, count=cfg.tasks_per_point, locals_per_task=n, seed=cfg.seed * 1000 + n, first_id=100 * n + 1,
            model_name=cfg.task.model, rounds=cfg.task.rounds, demand_mbps=cfg.task.demand_mbps,
            model_bytes=model_bytes,
        )
        for n in cfg.locals
    }
