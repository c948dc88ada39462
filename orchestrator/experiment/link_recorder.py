"""`LinkRecorder`: link load (`orchestrator.emulation.link_load`) sampled on a thread about once a
second into a run's `link_stats` table, through its own database connection; `latest` is the
last sample. The experiment runner and `netai net up` record with it; the dashboard reads it.
With each sample it also records how busy the host's CPU was since the last (`host_samples`, from
/proc/stat): one of the fidelity figures (docs/fidelity.md); and, given the emulation's run id, where
that CPU went by component (`orchestrator.emulation.cpu_use`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from orchestrator.emulation.cpu_use import CpuAccount
from orchestrator.emulation.link_load import LinkLoadSampler
from orchestrator.results.db import ResultsDB
from topologies.plan import EmulationPlan

LOG = logging.getLogger(__name__)


def cpu_times() -> tuple[int, int] | None:
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat (None where it cannot be read)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of CPU time busy between two `cpu_times` readings (None without both, or no time)."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


class LinkRecorder:
    """Samples link load every `period_s` on a thread into `db_path`'s `link_stats` for `run_id`.

    Times are `clock()` (the run's clock). A failed reading (the controller busy or restarting) is
    skipped and counted in `errors`; `stop` (or leaving the context) ends the thread.
    """

    def __init__(self, client: Any, plan: EmulationPlan, db_path: Path, run_id: int, *,
                 clock: Callable[[], float], period_s: float = 1.0, cpu: str | None = None) -> None:
        self.sampler = LinkLoadSampler(client, plan)
        #: Given the emulation's run id (`cpu`): where the host's CPU goes, by component, sampled with the
        #: links from `start` on (`orchestrator.emulation.cpu_use`).
        self.cpu_run = cpu
        self.cpu: CpuAccount | None = None
        self.db_path = db_path
        self.run_id = run_id
        self.clock = clock
        self.period_s = period_s
        self.latest: list[dict[str, Any]] = []
        self.samples = 0
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> LinkRecorder:
        if self.cpu_run is not None:
            self.cpu = CpuAccount(self.cpu_run)
        self._thread = threading.Thread(target=self._loop, name="link-recorder", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        with ResultsDB(self.db_path) as db:
            cpu = cpu_times()
            while not self._stop.is_set():
                t0 = time.monotonic()
                try:
                    rows = self.sampler.sample()
                    t = self.clock()
                    now = cpu_times()
                    busy, cpu = busy_share(cpu, now), now
                    if busy is not None:
                        db.record_host_sample(self.run_id, t, busy)
                    db.record_link_stats(self.run_id, t, rows)
                    if self.cpu is not None:
                        self.cpu.sample()
                    self.latest = rows
                    self.samples += 1
                except Exception as e:  # noqa: BLE001 -- a missed sample is not the run's failure
                    self.errors += 1
                    if self.errors <= 3:
                        LOG.warning("link sample failed: %s", e)
                self._stop.wait(max(0.0, self.period_s - (time.monotonic() - t0)))

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
            if self.cpu is not None:
                self.cpu.sample()

    def cpu_environment(self) -> dict[str, float]:
        """Where the host's CPU went by component up to `stop` (`CpuAccount.environment`; {} without one)."""
        return self.cpu.environment() if self.cpu is not None else {}

    def __enter__(self) -> LinkRecorder:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
