"""Schedulers: interchangeable algorithms that place a task's trees on the network.

`SCHEDULERS` maps a name to a scheduler class; `get_scheduler(name, **options)` builds one.
Every scheduler is a pure function of the network state and the task: no I/O.

- ``spff``: the paper's fixed baseline (shortest path + first-fit wavelength, unicast per local);
- ``mst``: the paper's flexible scheduler (MST over auxiliary broadcast/upload graphs);
- ``steiner``: approximate Steiner tree (Kou et al. or Mehlhorn), aggregation at branch points;
- ``spt``: shortest-path tree from G, aggregation at branch points.

``optimum`` (`orchestrator.scheduling.ilp.Optimum`, the exact minimum-bandwidth trees by an ILP)
is known to `get_scheduler` but is not in `SCHEDULERS`: what iterates over the default
schedulers (``netai compare``, the property tests) stays fast; ask for it by name.
"""

from __future__ import annotations

from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.scheduling.base import Scheduler
from orchestrator.scheduling.ilp import Optimum
from orchestrator.scheduling.mst import MST
from orchestrator.scheduling.schedule import PROCEDURES, OverlayEdge, Procedure, Schedule, task_ports
from orchestrator.scheduling.spff import SPFF
from orchestrator.scheduling.state import NetworkState
from orchestrator.scheduling.trees import SPT, Steiner

SCHEDULERS: dict[str, type[Scheduler]] = {"spff": SPFF, "mst": MST, "steiner": Steiner, "spt": SPT}
#: Schedulers known by name but left out of the defaults (slow: an ILP per task).
EXTRA_SCHEDULERS: dict[str, type[Scheduler]] = {"optimum": Optimum}


def get_scheduler(name: str, **options: Any) -> Scheduler:
    """Build the scheduler registered as `name` with keyword `options`.

    Raises
    ------
    ConfigError
        If `name` is not registered or an option is not accepted.
    """
    try:
        cls = SCHEDULERS[name] if name in SCHEDULERS else EXTRA_SCHEDULERS[name]
    except KeyError as e:
        raise ConfigError(
            f"unknown scheduler {name!r}; choose from {', '.join([*SCHEDULERS, *EXTRA_SCHEDULERS])}"
        ) from e
    try:
        return cls(**options)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"scheduler {name!r}: {e}") from e


__all__ = [
    "EXTRA_SCHEDULERS",
    "PROCEDURES",
    "SCHEDULERS",
    "NetworkState",
    "OverlayEdge",
    "Procedure",
    "Schedule",
    "Scheduler",
    "get_scheduler",
    "task_ports",
]
