"""Distributed AI tasks: a global model G at one site and local models at others.

A `Task` is immutable data; `generate_tasks` draws a seeded set of them over a model's compute
sites. Validation (`validate_task`) rejects a task that names unknown sites, puts a local model
on a site without compute, puts G among the locals, or asks for more locals than there are
compute sites.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from orchestrator.errors import ConfigError
from topologies.model import NetworkModel

DEFAULT_DEMAND_MBPS = 1000.0
DEFAULT_MODEL_BYTES = 10_000_000
DEFAULT_MODEL = "mlp"
DEFAULT_ROUNDS = 3


@dataclass(frozen=True)
class Task:
    """One federated-learning task.

    Attributes
    ----------
    id
        Positive integer; also the OpenFlow cookie of the task's flow entries.
    global_site
        Site of the global model G (aggregates and starts every round).
    local_sites
        Sites of the local models, in order; distinct and not containing `global_site`.
    model
        Model name in the worker registry (or ``module:callable`` / ``file.py:callable``).
    rounds
        Number of FL rounds.
    demand_mbps
        Bandwidth the schedule reserves per overlay edge (model units, not emulated).
    model_bytes
        Size of the model's weights on the wire; used by the analytic cost model.
    """

    id: int
    global_site: str
    local_sites: tuple[str, ...]
    model: str = DEFAULT_MODEL
    rounds: int = DEFAULT_ROUNDS
    demand_mbps: float = DEFAULT_DEMAND_MBPS
    model_bytes: int = DEFAULT_MODEL_BYTES
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def terminals(self) -> tuple[str, ...]:
        """G followed by the locals."""
        return (self.global_site, *self.local_sites)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["local_sites"] = list(self.local_sites)
        return d


def validate_task(model: NetworkModel, task: Task) -> None:
    """Raise `ConfigError` (one line) if `task` cannot run on `model`."""
    if isinstance(task.id, bool) or not isinstance(task.id, int) or task.id <= 0:
        raise ConfigError(f"task id must be a positive integer, got {task.id!r}")
    if task.id >= 2**63:
        raise ConfigError(f"task id {task.id} does not fit an OpenFlow cookie")
    for site in task.terminals:
        if site not in model.sites:
            raise ConfigError(f"task {task.id}: unknown site {site!r} in topology {model.name!r}")
    if not task.local_sites:
        raise ConfigError(f"task {task.id}: it needs at least one local model")
    if task.global_site in task.local_sites:
        raise ConfigError(f"task {task.id}: the global site {task.global_site!r} is also a local site")
    if len(set(task.local_sites)) != len(task.local_sites):
        raise ConfigError(f"task {task.id}: a local site is listed twice")
    for site in task.terminals:
        if not model.sites[site].has_compute:
            raise ConfigError(f"task {task.id}: site {site!r} has no compute for a model")
    if task.rounds <= 0:
        raise ConfigError(f"task {task.id}: rounds must be positive, got {task.rounds}")
    if not task.demand_mbps > 0:
        raise ConfigError(f"task {task.id}: demand_mbps must be positive, got {task.demand_mbps}")
    if task.model_bytes <= 0:
        raise ConfigError(f"task {task.id}: model_bytes must be positive, got {task.model_bytes}")


def max_locals(model: NetworkModel) -> int:
    """The most local models one task can have: compute sites less the one for G."""
    return max(0, len(model.compute_sites) - 1)


def generate_tasks(
    model: NetworkModel,
    *,
    count: int,
    locals_per_task: int,
    seed: int = 0,
    first_id: int = 1,
    model_name: str = DEFAULT_MODEL,
    rounds: int = DEFAULT_ROUNDS,
    demand_mbps: float = DEFAULT_DEMAND_MBPS,
    model_bytes: int = DEFAULT_MODEL_BYTES,
) -> list[Task]:
    """Draw `count` tasks, each with G and `locals_per_task` locals on distinct compute sites.

    The draw depends only on `seed` and the model's compute sites (in model order).

    Raises
    ------
    ConfigError
        If `locals_per_task` is not in 1..max_locals(model) or `count` is negative.
    """
    if count < 0:
        raise ConfigError(f"task count must not be negative, got {count}")
    limit = max_locals(model)
    if not 1 <= locals_per_task <= limit:
        raise ConfigError(
            f"{locals_per_task} local models requested, but topology {model.name!r} has "
            f"{len(model.compute_sites)} compute sites (at most {limit} locals besides G)"
        )
    rng = random.Random(seed)
    sites: Sequence[str] = model.compute_sites
    tasks = []
    for k in range(count):
        chosen = rng.sample(list(sites), locals_per_task + 1)
        task = Task(
            id=first_id + k,
            global_site=chosen[0],
            local_sites=tuple(chosen[1:]),
            model=model_name,
            rounds=rounds,
            demand_mbps=demand_mbps,
            model_bytes=model_bytes,
        )
        validate_task(model, task)
        tasks.append(task)
    return tasks
