"""The controller's own database of what it installed, so that a restarted controller comes back
with it (docs/faults.md, "Faults and rescheduling").

One SQLite file (`ENV_STATE_DB` names it; the emulation puts it in the run's log directory): the
installed tasks (their paths as the REST body gave them, and the htb class minor their reservation
holds on the links) and the background host pairs. The core writes it on every change it accepted;
on start, `load` gives it back and the core re-installs it before any switch connects, so a
switch that reconnects gets every entry it held. Only JSON and integers are stored: nothing is
unpickled.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

#: Environment variable naming the state database file.
ENV_STATE_DB = "NETAI_STATE_DB"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tasks (task_id INTEGER PRIMARY KEY, paths_json TEXT NOT NULL, class_minor INTEGER);
CREATE TABLE IF NOT EXISTS background (id INTEGER PRIMARY KEY CHECK (id = 1), pairs_json TEXT NOT NULL);
"""


class StateStore:
    """The installed tasks and background pairs of one controller, in `path`."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._conn.executescript(_SCHEMA)

    def save_task(self, task_id: int, paths: dict[str, Any], class_minor: int | None) -> None:
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO tasks(task_id, paths_json, class_minor) VALUES (?, ?, ?)",
                               (int(task_id), json.dumps(paths, allow_nan=False), class_minor))

    def delete_task(self, task_id: int) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM tasks WHERE task_id = ?", (int(task_id),))

    def save_background(self, pairs: list[list[str]]) -> None:
        with self._lock:
            self._conn.execute("INSERT OR REPLACE INTO background(id, pairs_json) VALUES (1, ?)", (json.dumps(pairs),))

    def load(self) -> tuple[list[tuple[dict[str, Any], int | None]], list[list[str]]]:
        """(installed tasks as (paths body, class minor), in task id order; background pairs)."""
        with self._lock:
            tasks = [(json.loads(p), m) for p, m in
                     self._conn.execute("SELECT paths_json, class_minor FROM tasks ORDER BY task_id")]
            row = self._conn.execute("SELECT pairs_json FROM background WHERE id = 1").fetchone()
        return tasks, (json.loads(row[0]) if row else [])

    def close(self) -> None:
        with self._lock:
            self._conn.close()
