"""A scheduler's `Schedule` as the controller's input (`controller.paths.TaskPaths`).

Every overlay edge of the schedule becomes one path: from the edge's source host to its
destination host, along the edge's physical sites, to the task's broadcast or upload port
(`orchestrator.scheduling.task_ports`). Each path reserves the task's demand on every link it
crosses, as the scheduler's books do (`NetworkState.admit`), scaled into the emulation by the
plan's `bw_scale`, the same factor as the links themselves.
"""

from __future__ import annotations

from controller.paths import PathSpec, TaskPaths
from orchestrator.scheduling.schedule import Schedule, task_ports


def task_paths(schedule: Schedule, *, bw_scale: float = 1.0) -> TaskPaths:
    """The controller's input for `schedule`.

    Raises
    ------
    ValueError
        If the schedule is blocked (it has nothing to install).
    """
    if schedule.blocked:
        raise ValueError(f"task {schedule.task_id} is blocked ({schedule.reason}): nothing to install")
    broadcast_port, upload_port = task_ports(schedule.task_id)
    return TaskPaths(
        task_id=schedule.task_id,
        label=schedule.scheduler,
        paths=tuple(
            PathSpec(
                src=e.src,
                dst=e.dst,
                sites=e.path,
                tcp_dst=broadcast_port if e.procedure == "broadcast" else upload_port,
                reserved_mbps=schedule.demand_mbps * bw_scale,
                kind=e.procedure,
            )
            for e in schedule.edges
        ),
    )
