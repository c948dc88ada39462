"""The agent's timing events: JSON lines on CLOCK_MONOTONIC (system-wide, so events of agents on
one machine compare), one flushed line per event; thread-safe. No torch imported here.

Events of a site server on another machine are on that machine's clock; the orchestrator maps them
onto its own by an offset it measures against `now` (the ``hello`` reply's ``clock``). For tests
only, ``NETAI_TEST_CLOCK_SKEW_S`` (seconds, read at start) is added to every time `now` gives: an
explicit skew that stands for a machine whose clock differs (test machines share one kernel clock).
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import IO, Any

from workers.config import AgentConfig

#: The environment variable of the tests' clock skew (see the module docstring).
CLOCK_SKEW_ENV = "NETAI_TEST_CLOCK_SKEW_S"
_SKEW_S = float(os.environ.get(CLOCK_SKEW_ENV) or 0.0)


def now() -> float:
    """This process's event clock: CLOCK_MONOTONIC, plus the tests' skew if one is set."""
    return time.monotonic() + _SKEW_S


def of_monotonic(t: float) -> float:
    """A CLOCK_MONOTONIC time (e.g. a frame's kernel arrival, `workers.arrivals`) on the event clock."""
    return t + _SKEW_S


def to_monotonic(t: float) -> float:
    """An event-clock time on CLOCK_MONOTONIC (`of_monotonic`'s inverse)."""
    return t - _SKEW_S


class EventLog:
    """JSON-lines timing events on the monotonic clock; thread-safe; flushed per line."""

    def __init__(self, cfg: AgentConfig, stream: IO[str]) -> None:
        self._cfg = cfg
        self._stream = stream
        self._lock = threading.Lock()

    def emit(self, event: str, round: int | None = None, **extra: Any) -> float:
        """Log `event` now; its time."""
        return self.emit_at(None, event, round, **extra)

    def emit_at(self, at: float | None, event: str, round: int | None = None, **extra: Any) -> float:
        """Log `event` at `at` (the event clock's time it happened, if before now: e.g. a frame's
        arrival in the kernel; None: now); its time."""
        t = now() if at is None else min(at, now())
        rec = {"t": t, "wall": time.time(), "event": event, "task": self._cfg.task, "site": self._cfg.site}
        if round is not None:
            rec["round"] = round
        rec.update(extra)
        line = json.dumps(rec, separators=(",", ":"))
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()
        return t
