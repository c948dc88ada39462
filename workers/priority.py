"""Scheduling priority of a worker's threads: the network path runs before training.

A round's latency waits on short bursts of network-path work (a reader taking a chunk in and
forwarding it, the round loop aggregating it, a sender writing it, the site server answering its manager),
while training is one long CPU-bound step per round. With eight locals training on two cores, the
bursts queued behind training: a hop of a broadcast tree took about 7 times one copy's
transmission time. So each thread says what kind it is when it starts:

- `enter_training`: the training thread runs under ``SCHED_IDLE`` (CFS weight 3 against a
  normal thread's 1024: it gets the cores whenever nothing else wants them, and any woken
  network-path thread preempts it at once). If that is refused, nice +10 (an absolute value, so a
  training thread started by a raised thread still goes below normal ones); if that is refused
  too, it runs as it is.
- `enter_transfer`: a network-path thread runs at nice -10 (`TRANSFER_NICE`), above every normal
  thread on the machine (iperf3's background traffic included). Raising needs CAP_SYS_NICE: without
  it the thread keeps its priority and a note is logged once per process. It also asks for the
  kernel's shortest time slice (`TRANSFER_SLICE_NS`, `set_slice`), which needs no privilege.

Why the slice. SCHED_IDLE and nice act only between threads of one cgroup (Linux 6.6 on, its EEVDF
scheduler): where they sit in different cgroups, as each site of the docker backend does, the
kernel compares the cgroups, and a site whose only runnable thread is a SCHED_IDLE training weighs
its group's full share. A woken relay thread of another site then waited until that group's slice
(1.4 ms on two cores) ran out, noticed at the next tick (4 ms at HZ = 250). A waking thread whose
slice is shorter than the running one's preempts it at once (EEVDF's ``PREEMPT_SHORT``, a group
presenting its shortest queued thread's slice), so network-path threads ask for the kernel's least,
0.1 ms, and a training thread goes back to the default. Before Linux 6.12 the kernel keeps no slice
for fair threads: the call is accepted and ignored (read back as 0), and nothing changes.

Linux keeps the policy and the nice value per thread (sched_setscheduler(2) and setpriority(2) on
a thread id), and a new thread starts with its creator's: each kind sets its own at its start, so
a thread's priority never depends on which thread happened to create it.

`use` picks another `Scheme` for the whole process (the hop benchmark compares them in one run);
agents always run the default, `DEFAULT_SCHEME`.

What this module must never do: raise a training thread, or fail a role because a priority could
not be set.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import platform
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

LOG = logging.getLogger(__name__)

#: The nice value of network-path threads (and of the switch datapath's: the emulation sets it).
#: -10 puts a woken transfer thread far above normal threads (CFS weight 9548 against 1024) without
#: a real-time policy, which a busy thread could use to starve the machine.
TRANSFER_NICE: Final = -10
#: Training's nice value where SCHED_IDLE is refused (the priority before SCHED_IDLE was used).
TRAIN_NICE_FALLBACK: Final = 10
#: Real-time priority of transfer threads under the ``rt`` scheme (SCHED_FIFO, lowest band).
TRANSFER_RT_PRIORITY: Final = 1
#: The time slice network-path threads ask for, ns: the least the kernel grants (it clamps to 0.1-100 ms).
TRANSFER_SLICE_NS: Final = 100_000
#: sched_setattr(2) and sched_getattr(2) by machine; elsewhere no slice is asked for.
_SCHED_ATTR_CALLS: Final = {"x86_64": (314, 315), "aarch64": (274, 275)}
#: sched_attr's flag that keeps the thread's policy (SCHED_OTHER or SCHED_IDLE) as it is.
_SCHED_FLAG_KEEP_POLICY: Final = 0x08

#: Field numbers (1-based, as proc(5) counts) of /proc/PID/task/TID/stat.
_STAT_NICE, _STAT_POLICY = 19, 41
POLICY_NAMES: Final = {0: "SCHED_OTHER", 1: "SCHED_FIFO", 2: "SCHED_RR", 3: "SCHED_BATCH", 5: "SCHED_IDLE",
                       6: "SCHED_DEADLINE"}


@dataclass(frozen=True)
class Scheme:
    """What each thread kind is set to.

    ``train``: ``idle`` (SCHED_IDLE), ``nice`` (nice +10) or ``keep``. ``transfer``: ``nice``
    (nice -10), ``fifo`` (SCHED_FIFO at `TRANSFER_RT_PRIORITY`) or ``keep``.
    """

    name: str
    train: Literal["idle", "nice", "keep"]
    transfer: Literal["nice", "fifo", "keep"]


SCHEMES: Final = {
    s.name: s for s in (
        Scheme("network-first", train="idle", transfer="nice"),  # the default
        Scheme("train-niced", train="nice", transfer="keep"),  # training at nice +10 only
        Scheme("none", train="keep", transfer="keep"),
        Scheme("rt", train="idle", transfer="fifo"),
    )
}
DEFAULT_SCHEME: Final = "network-first"
_active = SCHEMES[DEFAULT_SCHEME]
_noted: set[str] = set()
_noted_lock = threading.Lock()


def use(name: str) -> Scheme:
    """Make `name` (a key of `SCHEMES`) this process's scheme for threads that start from now on.

    Raises
    ------
    ValueError
        An unknown name.
    """
    global _active
    try:
        _active = SCHEMES[name]
    except KeyError as e:
        raise ValueError(f"unknown priority scheme {name!r} (known: {', '.join(SCHEMES)})") from e
    return _active


def active() -> Scheme:
    return _active


def _note_once(kind: str, text: str) -> None:
    """Log `text` once per process and thread kind: a refused priority is a fact about the host."""
    with _noted_lock:
        if kind in _noted:
            return
        _noted.add(kind)
    LOG.warning("%s", text)


class _SchedAttr(ctypes.Structure):
    """``struct sched_attr`` (include/uapi/linux/sched/types.h), its first version's 48 bytes."""

    _fields_ = [("size", ctypes.c_uint32), ("sched_policy", ctypes.c_uint32), ("sched_flags", ctypes.c_uint64),
                ("sched_nice", ctypes.c_int32), ("sched_priority", ctypes.c_uint32),
                ("sched_runtime", ctypes.c_uint64), ("sched_deadline", ctypes.c_uint64),
                ("sched_period", ctypes.c_uint64)]


def set_slice(ns: int) -> int:
    """Ask for a time slice of `ns` for the calling thread (0: the kernel's default), its policy and
    nice value kept; the slice now in force in ns as the kernel reads it back, 0 where it keeps none
    for the thread's policy (before Linux 6.12, or a real-time thread) or the call failed.

    Raises
    ------
    ValueError
        A negative `ns`.
    """
    if ns < 0:
        raise ValueError(f"a time slice cannot be negative: {ns}")
    calls = _sched_attr_calls()
    if calls is None:
        return 0
    syscall, set_nr, _get_nr = calls
    try:
        nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    except (OSError, AttributeError):
        return 0
    attr = _SchedAttr(size=ctypes.sizeof(_SchedAttr), sched_flags=_SCHED_FLAG_KEEP_POLICY, sched_nice=nice,
                      sched_runtime=ns)
    if syscall(set_nr, 0, ctypes.byref(attr), 0) != 0:
        return 0
    return thread_slice()


def thread_slice() -> int:
    """The calling thread's time slice in ns as the kernel reads it back (sched_getattr(2)), 0 where
    it keeps none for the thread's policy (before Linux 6.12, or a real-time thread)."""
    calls = _sched_attr_calls()
    if calls is None:
        return 0
    syscall, _set_nr, get_nr = calls
    got = _SchedAttr()
    try:
        if syscall(get_nr, 0, ctypes.byref(got), ctypes.sizeof(_SchedAttr), 0) != 0:
            return 0
        fair = os.sched_getscheduler(0) in (os.SCHED_OTHER, os.SCHED_IDLE, os.SCHED_BATCH)
    except (OSError, AttributeError):
        return 0
    return int(got.sched_runtime) if fair else 0


@functools.cache
def _sched_attr_calls() -> tuple[Callable[..., int], int, int] | None:
    """libc's syscall(2) with sched_setattr's and sched_getattr's numbers on this machine, looked up
    once per process; None where they are not known (`_SCHED_ATTR_CALLS`) or there is no libc."""
    numbers = _SCHED_ATTR_CALLS.get(platform.machine())
    if numbers is None:
        return None
    try:
        syscall: Callable[..., int] = ctypes.CDLL(None).syscall
    except (OSError, AttributeError):
        return None
    return syscall, numbers[0], numbers[1]


def _short_slice() -> str:
    """The network path's slice (`TRANSFER_SLICE_NS`), as `enter_transfer` reports it ("" if not kept)."""
    got = set_slice(TRANSFER_SLICE_NS)
    if got != TRANSFER_SLICE_NS:
        _note_once("slice", "network-path threads keep the default time slice (this kernel keeps none for "
                   "fair threads before Linux 6.12): across cgroups, as the docker backend's sites are, "
                   "one may wait a scheduler tick behind another site's training")
        return ""
    return f", slice {got / 1e6:g} ms"


def enter_training() -> str:
    """Lower the calling thread for training (see the module docstring); what now applies."""
    mode = _active.train
    if mode == "keep":
        return "unchanged"
    if mode == "idle":
        try:
            # first the default slice, not a network-path creator's short one: Linux keeps a custom
            # slice across sched_setscheduler, and a SCHED_IDLE thread's cannot be changed
            set_slice(0)
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            return "SCHED_IDLE"
        except (OSError, AttributeError) as e:
            _note_once("train-idle", f"training thread: SCHED_IDLE refused ({e}); nice +{TRAIN_NICE_FALLBACK} instead")
    tid = threading.get_native_id()
    try:
        # absolute, not relative to the creator's: a thread made by a raised one must still go below 0
        os.setpriority(os.PRIO_PROCESS, tid, max(os.getpriority(os.PRIO_PROCESS, tid), TRAIN_NICE_FALLBACK))
        set_slice(0)  # not a network-path thread's short slice, inherited from its creator
        return f"nice {os.getpriority(os.PRIO_PROCESS, tid):+d}"
    except (OSError, AttributeError) as e:
        _note_once("train-nice", f"training thread: priority unchanged, nice refused ({e})")
        return "unchanged"


def enter_transfer() -> str:
    """Raise the calling network-path thread (see the module docstring); what now applies."""
    mode = _active.transfer
    if mode == "keep":
        return "unchanged"
    try:
        if mode == "fifo":
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(TRANSFER_RT_PRIORITY))
            return f"SCHED_FIFO {TRANSFER_RT_PRIORITY}"
        tid = threading.get_native_id()
        if os.sched_getscheduler(0) != os.SCHED_OTHER:  # e.g. created by a SCHED_IDLE thread
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        if os.getpriority(os.PRIO_PROCESS, tid) != TRANSFER_NICE:
            os.setpriority(os.PRIO_PROCESS, tid, TRANSFER_NICE)
        applied = f"nice {TRANSFER_NICE:+d}"
    except (OSError, AttributeError) as e:
        _note_once("transfer", f"network-path threads keep their priority ({mode} refused: {e}; "
                   "raising needs CAP_SYS_NICE): they may wait behind other work on a busy host")
        applied = "unchanged"
    if os.sched_getscheduler(0) == os.SCHED_IDLE:  # left SCHED_IDLE was refused: no network-path slice
        return applied
    return applied + _short_slice()


def thread_priority(tid: int, pid: int | None = None) -> tuple[str, int]:
    """(policy name, nice) of thread `tid` of process `pid` (default: this process), as /proc says.

    Raises
    ------
    OSError
        No such thread.
    """
    stat = Path(f"/proc/{pid or os.getpid()}/task/{tid}/stat").read_text()
    # the command name (field 2) may hold spaces and parentheses; the fields after its last ")" do not
    fields = stat.rsplit(")", 1)[1].split()
    policy = int(fields[_STAT_POLICY - 3])
    return POLICY_NAMES.get(policy, str(policy)), int(fields[_STAT_NICE - 3])
