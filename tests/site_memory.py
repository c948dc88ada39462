"""Site servers' memory against the model's size, on loopback (issue 48; no root, no Mininet): real site
servers run tasks one after another while every server's resident set is sampled, so each task gives
each site's peak beside the roles it hosted there, and each server's memory once the task is over.

Shared by `tests/unit/test_site_memory.py` (the admission's bound holds, nothing accumulates) and
`benchmarks/bench_site_memory.py` (the figures, in copies of the model).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from orchestrator.runtime.backends import LoopbackBackend
from orchestrator.runtime.compute import ComputeManager
from orchestrator.runtime.task_runner import FLOptions, TaskExecution
from orchestrator.scheduling.memory import roles_by_site
from orchestrator.scheduling.schedule import Schedule

#: G, three locals and a relay: the relay forwards to three children and aggregates their updates.
SITES = ("G", "A", "B", "C", "R")
#: How often the servers' resident sets are read.
PERIOD_S = 0.01
#: How long after a task's end its servers' memory is read (the roles' senders closing).
SETTLE_S = 0.5


def hand_schedule(task_id: int, g: str, locals_: tuple[str, ...], parent: dict[str, str]) -> Schedule:
    """A task scheduled by hand: G `g`, the locals, and each node's parent in both trees."""
    return Schedule(task_id=task_id, scheduler="hand", global_site=g, local_sites=locals_, demand_mbps=1.0,
                    broadcast_parent=parent, upload_parent=parent)


def relay_tree(task_id: int, children: int = 3) -> Schedule:
    """G broadcasts to relay R, which forwards to the locals A, B and C (and aggregates their updates);
    with `children` 1, R serves A only and G serves B and C."""
    parent = {"A": "R", "B": "R", "C": "R", "R": "G"} if children == 3 else {"A": "R", "B": "G", "C": "G", "R": "G"}
    return hand_schedule(task_id, "G", ("A", "B", "C"), parent)


@dataclass(frozen=True)
class TaskMemory:
    """One task's memory: each site's roles, its peak resident set during the task and after it."""

    roles: dict[str, list[str]]
    peak_bytes: dict[str, int]
    after_bytes: dict[str, int]


def rss_bytes(pid: int) -> int:
    """Resident set of process `pid` (``/proc/PID/smaps_rollup``)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Rss:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"no Rss line for process {pid}")


def _sample(pids: dict[str, int], peak: dict[str, int], done: threading.Event) -> None:
    """Raise `peak` to each server's resident set, every `PERIOD_S`, until `done`."""
    while not done.is_set():
        for s, p in pids.items():
            peak[s] = max(peak[s], rss_bytes(p))
        time.sleep(PERIOD_S)


def paced(run: TaskExecution, mbps: float) -> None:
    """Pace every copy of `run` at `mbps` (`workers.pacing`), as the emulation's links would carry it."""
    for n, cfg in run.configs.items():
        pace = {f"broadcast:{c.site}": mbps for c in cfg.broadcast_children}
        if cfg.upload_parent is not None:
            pace[f"upload:{cfg.upload_parent.site}"] = mbps
        run.configs[n] = replace(cfg, pace_mbps=pace)


def run_tasks(tmp: Path, schedules: Sequence[Schedule], *, model: str, model_args: dict[str, int], rounds: int,
              pace_mbps: float | None = None, timeout_s: float = 300.0) -> tuple[dict[str, int], int, list[TaskMemory]]:
    """Run `schedules` one after another on loopback servers of `SITES`: (each server's resident set
    before any task, the model's bytes, each task's `TaskMemory`). `pace_mbps`: every copy paced at
    that rate (None: at loopback's speed)."""
    results: list[TaskMemory] = []
    model_bytes = 0
    with ComputeManager(LoopbackBackend(SITES, log_root=tmp / "servers", first_octet=180), SITES) as cm:
        pids = {s: srv.pid for s, srv in cm.servers.items()}
        base = {s: rss_bytes(p) for s, p in pids.items()}
        for i, schedule in enumerate(schedules):
            done = threading.Event()
            peak = {s: rss_bytes(p) for s, p in pids.items()}
            sampler = threading.Thread(target=_sample, args=(pids, peak, done), daemon=True)
            sampler.start()
            run = TaskExecution(schedule, manager=cm, options=FLOptions(rounds=rounds, model=model,
                                                                        model_args=model_args),
                                log_dir=cm.task_dir(f"task{i + 1}"))
            if pace_mbps is not None:
                paced(run, pace_mbps)
            try:
                run.start()
                deadline = time.monotonic() + timeout_s
                while not run.check(cm.poll()):
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"task {schedule.task_id} did not end within {timeout_s:.0f} s")
                    time.sleep(0.05)
                model_bytes = run.result().model_bytes
            finally:
                run.stop()
                time.sleep(SETTLE_S)
                done.set()
                sampler.join()
            roles = roles_by_site(schedule.global_site, schedule.local_sites, schedule.overlay_nodes)
            results.append(TaskMemory(roles=roles, peak_bytes=peak,
                                      after_bytes={s: rss_bytes(p) for s, p in pids.items()}))
    return base, model_bytes, results
