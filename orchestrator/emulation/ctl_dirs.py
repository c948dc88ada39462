"""The site servers' control-socket folders, and those a killed run left behind.

A run makes one short folder in the temporary directory for its site servers' control sockets
(`orchestrator.runtime.forked.new_ctl_dir`) and removes it when its servers stop. A run killed with
SIGKILL, or one whose machine lost power, cannot: the folder stays. Its name says whose it is:
``netai-ctl-<pid>.<start ticks>-<random>``, the process that made it and when that process started
(`procs.proc_start_ticks`, so that a reused pid is not taken for the owner). `stale` lists the
folders whose owner is gone, and `remove_stale` removes them; `cleanup.clean` and
`cleanup.clean_dead_runs` call it, so the next run or ``netai clean`` removes what a killed run
left. A folder of the earlier form (``netai-ctl-<random>``, no owner in its name) is never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from orchestrator.emulation.procs import proc_start_ticks, process_alive

PREFIX = "netai-ctl-"
_OWNED = re.compile(re.escape(PREFIX) + r"(\d+)\.(\d+)-[^/]+")


def prefix_for(pid: int, start_ticks: int | None) -> str:
    """The name prefix of a control folder owned by process `pid` (started at `start_ticks`)."""
    return f"{PREFIX}{pid}.{start_ticks or 0}-"


def owner(name: str) -> tuple[int, int] | None:
    """(pid, start ticks) of the process that made the control folder `name`; None if the name
    does not say (not a control folder, or one of the earlier form)."""
    m = _OWNED.fullmatch(name)
    return None if m is None else (int(m[1]), int(m[2]))


def stale(root: Path | None = None, *, alive: Callable[[int, int | None], bool] | None = None) -> list[Path]:
    """The control folders in `root` (default: the temporary directory) whose owner is gone.
    `alive(pid, start_ticks)`: whether that process runs (default `procs.process_alive`)."""
    alive = process_alive if alive is None else alive
    root = Path(tempfile.gettempdir()) if root is None else root
    out = []
    for folder in sorted(root.glob(PREFIX + "*")):
        who = owner(folder.name)
        if who is not None and folder.is_dir() and not folder.is_symlink() and not alive(*who):
            out.append(folder)
    return out


def remove_stale(*, log: Callable[[str], None], root: Path | None = None) -> list[str]:
    """Remove the control folders whose owner is gone (`stale`); what was removed."""
    gone = stale(root)
    for folder in gone:
        shutil.rmtree(folder, ignore_errors=True)
    if gone:
        log(f"removed {len(gone)} control-socket folder(s) of processes that are gone")
    return [str(f) for f in gone]


def make(root: Path | None = None) -> Path:
    """A fresh control folder owned by this process (only its owner may enter it)."""
    pid = os.getpid()
    return Path(tempfile.mkdtemp(prefix=prefix_for(pid, proc_start_ticks(pid)), dir=root))
