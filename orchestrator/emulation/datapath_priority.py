"""The switch datapath's scheduling priority: ovs-vswitchd's threads raised when an emulation starts.

With the userspace datapath every packet of every emulated link is moved by ovs-vswitchd's threads
(its main thread polls the ports). On a busy host (eight local models training on two cores) they
waited behind training like any normal thread, and each hop of a model's path took several times
its transmission time; raising them by hand halved a hop's median. So the emulation raises every
thread of the local ovs-vswitchd to nice `DATAPATH_NICE` (the agents' network-path threads run at
the same value, `workers.priority.TRANSFER_NICE`), once its ports exist, and records what it did in
the run's environment (``datapath_priority``). New threads start with their creator's value, so
threads ovs-vswitchd makes later are raised too.

It never fails a run: without the privilege (not root, no CAP_SYS_NICE), or without a local
ovs-vswitchd, the record says so (``applied: False`` and a ``note``) and a warning is logged. In
cluster mode only this host's ovs-vswitchd is raised. The value is left in place at the end of the
run: the daemon serves only the emulation, and the next run sets the same value.

What it must not do: touch any process but ovs-vswitchd, or use a real-time policy (a busy
datapath thread under SCHED_FIFO could take a core from everything else).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, Final

LOG = logging.getLogger(__name__)

#: ovs-vswitchd's nice value during an emulation (the agents' transfer threads': -10 too).
DATAPATH_NICE: Final = -10
DAEMON: Final = "ovs-vswitchd"
#: Field numbers (1-based, as proc(5) counts) of /proc/PID/task/TID/stat.
_STAT_NICE, _STAT_POLICY = 19, 41


def daemon_pids(name: str = DAEMON, proc: Path = Path("/proc")) -> list[int]:
    """Pids of the processes whose command name is `name` (its ``--monitor`` parent is called
    ``monitor`` and is not included)."""
    pids = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() == name:
                pids.append(int(entry.name))
        except OSError:
            continue  # exited meanwhile
    return sorted(pids)


def thread_ids(pid: int) -> list[int]:
    """The thread ids of `pid` (empty if it is gone)."""
    try:
        return sorted(int(t.name) for t in Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return []


def thread_sched(pid: int, tid: int) -> tuple[int, int]:
    """(policy number, nice) of thread `tid` of `pid` from /proc; raises OSError if it is gone."""
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[_STAT_POLICY - 3]), int(fields[_STAT_NICE - 3])


def set_threads_nice(pid: int, nice: int) -> dict[int, int]:
    """Set every thread of `pid` to `nice`; their earlier values by thread id (for a restore).

    Raises
    ------
    PermissionError
        Raising needs CAP_SYS_NICE.
    """
    before: dict[int, int] = {}
    for tid in thread_ids(pid):
        try:
            before[tid] = os.getpriority(os.PRIO_PROCESS, tid)
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except ProcessLookupError:
            before.pop(tid, None)  # the thread ended meanwhile
    return before


def raise_datapath(info: Any = None, nice: int = DATAPATH_NICE) -> dict[str, Any]:
    """Raise every thread of the local ovs-vswitchd to `nice` (see the module docstring); the record
    of what was applied, also set as `info`'s ``datapath_priority`` when `info` is given (the run's
    `EmulationInfo`, which the run's environment is made from)."""
    record: dict[str, Any] = {"process": DAEMON, "nice": nice, "applied": False, "threads": 0}
    pids = daemon_pids()
    if not pids:
        record["note"] = f"no {DAEMON} runs on this host: nothing raised"
    for pid in pids:
        try:
            before = set_threads_nice(pid, nice)
        except OSError as e:
            record["note"] = f"{DAEMON} (pid {pid}) keeps its priority: {e} (raising needs root or CAP_SYS_NICE)"
            break
        record.update(applied=True, pid=pid, threads=record["threads"] + len(before),
                      nice_before=sorted(set(before.values())))
    if record["applied"]:
        LOG.info("%s: %d threads at nice %+d", DAEMON, record["threads"], nice)
    else:
        LOG.warning("the switch datapath's priority was not raised: %s", record["note"])
    if info is not None:
        info.datapath_priority = record
    return record
