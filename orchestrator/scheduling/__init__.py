"""Schedulers: interchangeable algorithms that place a task's trees on the network.

`SCHEDULERS` maps a name to a scheduler class (`orchestrator.scheduling.registry`);
`get_scheduler(spec, **options)` builds one from a registered name, ``module:Class`` or
``path/file.py:Class`` (`orchestrator.scheduling.plugins`; the contract a scheduler keeps is in
docs/schedulers.md). Every scheduler is a pure function of the
network state and the task: no I/O.

- ``spff``: the paper's fixed baseline (shortest path + first-fit wavelength, unicast per local);
- ``mst``: the paper's flexible scheduler (MST over auxiliary broadcast/upload graphs);
- ``steiner``: approximate Steiner tree (Kou et al. or Mehlhorn), aggregation at branch points;
- ``spt``: shortest-path tree from G, aggregation at branch points;
- ``joint``: network and compute together: among the others' trees and aggregation placements,
  the one with the shortest predicted round given link load and site CPU load.

``optimum`` (`orchestrator.scheduling.ilp.Optimum`, the exact minimum-bandwidth trees by an ILP)
is known to `get_scheduler` but is not in `SCHEDULERS`: what iterates over the default
schedulers (``netai compare``, the property tests) stays fast; ask for it by name.
"""

from __future__ import annotations

from typing import Any

from orchestrator.scheduling.base import Scheduler
from orchestrator.scheduling.plugins import SchedulerSpec, resolve_scheduler, resolve_schedulers
from orchestrator.scheduling.registry import EXTRA_SCHEDULERS, SCHEDULERS
from orchestrator.scheduling.schedule import PROCEDURES, OverlayEdge, Procedure, Schedule, task_ports
from orchestrator.scheduling.state import NetworkState


def get_scheduler(spec: str, **options: Any) -> Scheduler:
    """Build the scheduler `spec` names (a registered name, ``module:Class`` or ``path/file.py:Class``
    relative to the working directory) with keyword `options`.

    Raises
    ------
    ConfigError
        If `spec` names no scheduler class or an option is not accepted (see `resolve_scheduler`).
    """
    return resolve_scheduler({"spec": spec, "options": options}).build()


__all__ = [
    "EXTRA_SCHEDULERS",
    "PROCEDURES",
    "SCHEDULERS",
    "NetworkState",
    "OverlayEdge",
    "Procedure",
    "Schedule",
    "Scheduler",
    "SchedulerSpec",
    "get_scheduler",
    "resolve_scheduler",
    "resolve_schedulers",
    "task_ports",
]
