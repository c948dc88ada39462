"""Schedulers: interchangeable algorithms that place a task's trees on the network.

`SCHEDULERS` maps a name to a scheduler class; `get_scheduler(name)` builds one.
Every scheduler is a pure function of the network state and the task: no I/O.
"""

from orchestrator.scheduling.schedule import PROCEDURES, OverlayEdge, Procedure, Schedule, task_ports

__all__ = ["PROCEDURES", "OverlayEdge", "Procedure", "Schedule", "task_ports"]
