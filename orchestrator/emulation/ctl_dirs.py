"""The site servers' control-socket folders, and those a killed run left behind.

A run makes short folders in the temporary directory for its site servers' control sockets
(`orchestrator.runtime.forked.new_ctl_dir`: the backend's, and the process backend's fork
server's) and removes them when its servers stop. A run killed with SIGKILL, or one whose machine
lost power, cannot: the folders stay. Each name says whose it is:
``netai-ctl-<boot>.<pid>.<start ticks>-<random>``, the machine's boot (the first 8 characters of
its boot id), the process that made it and when that process started (`procs.proc_start_ticks`, so
that a reused pid is not taken for the owner). `stale` lists the folders of this boot whose owner
is gone, and `remove_stale` removes them; `cleanup.clean` and `cleanup.clean_dead_runs` call it,
so the next run or ``netai clean`` removes what a killed run left. A folder of another boot (or
another machine's, made there by a Docker daemon for a bind mount), and one of the earlier form
(``netai-ctl-<random>``, no owner in the name; also made when this process's start cannot be
read), is never touched.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from orchestrator.procs import boot_id, proc_start_ticks, process_alive

PREFIX = "netai-ctl-"
_OWNED = re.compile(re.escape(PREFIX) + r"([0-9a-f]{8})\.([0-9]+)\.([0-9]+)-[^/]+")


def boot_tag() -> str | None:
    """This boot's tag in a folder's name; None if the boot id cannot be read."""
    tag = boot_id().replace("-", "")[:8].lower()
    return tag if re.fullmatch(r"[0-9a-f]{8}", tag) else None


def prefix_for(boot: str, pid: int, start_ticks: int) -> str:
    """The name prefix of a control folder owned by process `pid` (started at `start_ticks`) of `boot`."""
    return f"{PREFIX}{boot}.{pid}.{start_ticks}-"


def owner(name: str) -> tuple[str, int, int] | None:
    """(boot, pid, start ticks) of the process that made the control folder `name`; None if the name
    does not say (not a control folder, or one of the earlier form)."""
    m = _OWNED.fullmatch(name)
    return None if m is None else (m[1], int(m[2]), int(m[3]))


def stale(root: Path | None = None, *, alive: Callable[[int, int | None], bool] = process_alive,
          boot: str | None = None) -> list[Path]:
    """The control folders in `root` (default: the temporary directory) of this boot (`boot`, default
    `boot_tag`) whose owner is gone (`alive(pid, start_ticks)` false)."""
    boot = boot_tag() if boot is None else boot
    root = Path(tempfile.gettempdir()) if root is None else root
    out = []
    for folder in sorted(root.glob(PREFIX + "*")):
        who = owner(folder.name)
        if who is not None and boot is not None and who[0] == boot and folder.is_dir() \
                and not folder.is_symlink() and not alive(who[1], who[2]):
            out.append(folder)
    return out


def remove_stale(*, log: Callable[[str], None], root: Path | None = None) -> list[str]:
    """Remove the control folders whose owner is gone (`stale`); those removed."""
    gone = []
    for folder in stale(root):
        shutil.rmtree(folder, ignore_errors=True)
        if not folder.exists():
            gone.append(str(folder))
    if gone:
        log(f"removed {len(gone)} control-socket folder(s) of processes that are gone")
    return gone


def make(root: Path | None = None) -> Path:
    """A fresh control folder owned by this process (only its owner may enter it)."""
    pid, boot = os.getpid(), boot_tag()
    ticks = proc_start_ticks(pid)
    prefix = PREFIX if ticks is None or boot is None else prefix_for(boot, pid, ticks)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))
