"""The experiment's progress on a terminal: bars for the run, the task and the round (plain log lines
elsewhere), moved by a running task's events (`orchestrator.experiment.runner`'s sequential mode)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from orchestrator.scheduling import Schedule

LOG = logging.getLogger("netai.experiment")


class Progress:
    """Bars for the run, the task and the round on a terminal; plain log lines elsewhere."""

    def __init__(self, total_runs: int, *, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._p: Any = None
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._p = RichProgress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                                   TimeElapsedColumn(), transient=False)
            self._p.start()
            self.run_bar = self._p.add_task("run (tasks x schedulers)", total=total_runs)
            self.task_bar = self._p.add_task("task", total=1)
            self.round_bar = self._p.add_task("round", total=1)

    def task(self, label: str, rounds: int) -> None:
        LOG.info("%s", label)
        if self._p:
            self._p.reset(self.task_bar, total=rounds, description=label[:34])

    def round_progress(self, done_rounds: int, locals_done: int, n_locals: int, rnd: int) -> None:
        if self._p:
            self._p.update(self.task_bar, completed=done_rounds)
            self._p.reset(self.round_bar, total=n_locals, completed=locals_done, description=f"round {rnd}: locals trained")

    def follow(self, live: Any, events: Any) -> None:
        """Move the task and round bars from a running task's events (the core's ``on_events``)."""
        if self._p:
            done, trained = round_progress(events, live.schedule)
            self.round_progress(done, trained, len(live.schedule.local_sites), min(done + 1, live.task.rounds))

    def advance_run(self) -> None:
        if self._p:
            self._p.advance(self.run_bar)

    def close(self) -> None:
        if self._p:
            self._p.stop()


def round_progress(events: Any, schedule: Schedule) -> tuple[int, int]:
    """(rounds G has completed, locals that finished training in the round under way), from the
    agents' timing events by site."""
    done = max((int(ev.get("round", 0)) for ev in events.get(schedule.global_site, [])
                if ev.get("event") == "round_complete"), default=0)
    current = done + 1
    trained = sum(
        1 for site in schedule.local_sites
        if any(ev.get("event") == "train_end" and ev.get("round") == current for ev in events.get(site, []))
    )
    return done, trained
