"""The agent's timing events: JSON lines on CLOCK_MONOTONIC (system-wide, so events of agents on
one machine compare), one flushed line per event; thread-safe. No torch imported here."""

from __future__ import annotations

import json
import threading
import time
from typing import IO, Any

from workers.config import AgentConfig


class EventLog:
    """JSON-lines timing events on the monotonic clock; thread-safe; flushed per line."""

    def __init__(self, cfg: AgentConfig, stream: IO[str]) -> None:
        self._cfg = cfg
        self._stream = stream
        self._lock = threading.Lock()

    def emit(self, event: str, round: int | None = None, **extra: Any) -> float:
        t = time.monotonic()
        rec = {"t": t, "wall": time.time(), "event": event, "task": self._cfg.task, "site": self._cfg.site}
        if round is not None:
            rec["round"] = round
        rec.update(extra)
        line = json.dumps(rec, separators=(",", ":"))
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()
        return t
