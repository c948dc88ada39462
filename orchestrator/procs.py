"""Processes by pid and start time: whether one still runs, and not a reused pid. A leaf every
orchestrator layer may use (`orchestrator.emulation.cleanup` and `ctl_dirs` for a dead run's
leftovers, `orchestrator.results.durability` for a crashed run's owner), as `orchestrator.errors` is."""

from __future__ import annotations

from pathlib import Path


def stat_fields(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, from field 3 (state; then ppid, ...);
    None if `pid` is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may contain spaces; fields after the closing parenthesis don't.
    return stat.rsplit(")", 1)[1].split()


def proc_start_ticks(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/PID/stat); None if gone."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[19])


def boot_id() -> str:
    """This boot of the machine (a pid and its start time name a process within one boot only)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return "?"


def process_alive(pid: int, start_ticks: int | None = None) -> bool:
    """True if `pid` runs (and, when given, started at `start_ticks`: not a reused pid)."""
    fields = stat_fields(pid)
    if fields is None or fields[0] == "Z":
        return False
    return start_ticks is None or int(fields[19]) == start_ticks
