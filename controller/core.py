"""The controller's state and decisions, independent of the OpenFlow framework.

`ControllerCore` holds the emulation plan, the connected switches, the installed tasks and
background pairs, the port states and the port counters. It decides which flow entries each
switch must hold and hands them to a `FlowSender` (the os-ken app in production, a fake flow table
in tests). The northbound REST layer (`controller.rest`) calls it; so does the app's event handlers.

Connectivity (`controller.flows`): in ``best-effort`` mode every switch also holds the best-effort
entries that route every host pair below tasks and background; in ``strict`` mode (the core's
default; the app passes the mode it was started with) only tasks and background routes carry
anything.

Reserved rates are enforced through an optional `controller.shaping.Shaper` (htb classes per task on
the switch-to-switch links): a task's classes go in after its flow entries and leave with them.
Without a shaper, or while it cannot shape (no ``tc``, no interfaces yet), tasks are still
installed and their summaries, like ``/health``, say that the reservation is not enforced and why.

It must not import the OpenFlow framework, block on anything but its sender and its shaper, or open
sockets. Errors (`controller.errors`) carry an HTTP-like `status` so the REST layer can map them
without knowing the cases. The sender's contract is `controller.southbound.FlowSender`; port states
and counters are kept by `controller.ports.PortBook`.

Over 400 lines: every decision of the controller (switches, tasks, background, reservations)
works on one locked state; the pure builders live in `controller.flows` and `controller.shaping`.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from controller.errors import (
    BadRequest,
    Conflict,
    ControllerError,
    NotFound,
    ShapingFailed,
    Unavailable,
    Unprocessable,
)
from controller.flows import (
    BACKGROUND_COOKIE,
    BEST_EFFORT,
    CONNECTIVITY_MODES,
    STRICT,
    FlowBuildError,
    FlowEntry,
    background_entries,
    best_effort_entries,
    by_dpid,
    entry_kind,
    normalize_pairs,
    table_miss_entry,
    task_entries,
)
from controller.paths import TaskPaths
from controller.ports import PORT_EVENT_HISTORY, PortBook, site_name, switch_name
from controller.shaping import Reservation, Shaper, ShapingBuildError, ShapingStatus
from controller.southbound import FlowSender, PortStat
from controller.state_store import StateStore
from controller.tc import ShapingError
from topologies.plan import EmulationPlan

#: Why reservations are not enforced when the core has no shaper.
NO_SHAPER = "the controller runs without a shaper: reserved rates are bookkeeping only"
#: A task's reservation while its entries are being sent.
PENDING = Reservation(False, "being installed")


@dataclass
class InstalledTask:
    paths: TaskPaths
    entries: list[FlowEntry]
    installed_at: float
    reservation: Reservation = PENDING


class ControllerCore:
    """State and decisions of the SDN app (see the module docstring).

    Parameters
    ----------
    plan
        The emulation plan; the single source of datapath ids and port numbers.
    sender
        Sends entries to switches and reads counters back.
    clock
        Seconds, monotonic; injectable for tests.
    shaper
        Enforces reserved rates on the links (`controller.shaping.TcShaper`); None: not enforced.
    connectivity
        ``strict`` or ``best-effort`` (see the module docstring).

    Raises
    ------
    ValueError
        On an unknown connectivity mode.
    """

    def __init__(
        self,
        plan: EmulationPlan,
        sender: FlowSender,
        *,
        clock: Callable[[], float] = time.monotonic,
        shaper: Shaper | None = None,
        connectivity: str = STRICT,
        store: StateStore | None = None,
    ) -> None:
        if connectivity not in CONNECTIVITY_MODES:
            raise ValueError(f"connectivity must be one of {', '.join(CONNECTIVITY_MODES)}, got {connectivity!r}")
        self.plan = plan
        self.connectivity = connectivity
        self.best_effort: list[FlowEntry] = best_effort_entries(plan) if connectivity == BEST_EFFORT else []
        self.sender = sender
        self.shaper = shaper
        self.clock = clock
        self.started_at = clock()
        self.connected: dict[int, float] = {}
        self.tasks: dict[int, InstalledTask] = {}
        self.background_pairs: list[tuple[str, str]] = []
        self.background: list[FlowEntry] = []
        self.ports = PortBook(plan)
        self.errors: deque[dict[str, Any]] = deque(maxlen=PORT_EVENT_HISTORY)
        self._dpids = {sw.dpid for sw in plan.switches}
        #: Where accepted changes are written, so that a restarted controller comes back with them.
        self.store = store
        #: Tasks taken back from the store at start (`restore`).
        self.restored: list[int] = []
        # REST greenthreads and the event loop interleave only at I/O, but a lock keeps it correct
        # under the native hub and in threaded tests too.
        self._lock = threading.RLock()

    # -- restart ---------------------------------------------------------------------------------------
    def restore(self) -> list[int]:
        """Take back what the store holds (a restarted controller; before any switch connects, so each
        gets every entry at its connection): the background pairs, then every task with its entries
        and its reservation's classes re-made. A stored task that no longer builds is dropped and
        recorded as an error. Returns the restored task ids."""
        if self.store is None:
            return []
        tasks, pairs = self.store.load()
        try:
            norm = normalize_pairs(pairs)
            with self._lock:
                self.background_pairs, self.background = norm, background_entries(self.plan, norm)
        except FlowBuildError as e:
            self.errors.append({"t_s": 0.0, "error": f"stored background not restored: {e}"})
        for body, minor in tasks:
            try:
                task = TaskPaths.from_dict(body)
                entries = task_entries(task, self.plan)
            except (FlowBuildError, ValueError, KeyError, TypeError) as e:
                self.errors.append({"t_s": 0.0, "error": f"stored task not restored: {e}"})
                continue
            installed = InstalledTask(task, entries, self.clock())
            with self._lock:
                self.tasks[task.task_id] = installed
            restore = getattr(self.shaper, "restore", None)
            if minor is not None and restore is not None:
                try:
                    installed.reservation = restore(task, int(minor))
                except (ShapingError, ShapingBuildError, ValueError) as e:
                    installed.reservation = Reservation(False, f"not restored: {e}")
            self.restored.append(task.task_id)
        return list(self.restored)

    def _persist_task(self, task_id: int) -> None:
        if self.store is None:
            return
        with self._lock:
            installed = self.tasks.get(task_id)
        if installed is None:
            self.store.delete_task(task_id)
            return
        classes = installed.reservation.classes
        self.store.save_task(task_id, installed.paths.to_dict(), None if classes is None else classes.minor)

    # -- switch life cycle -------------------------------------------------------------------------
    def expected_entries(self, dpid: int) -> list[FlowEntry]:
        """Everything switch `dpid` must hold now: table-miss drop, best-effort (if on), background, tasks."""
        with self._lock:
            entries = [table_miss_entry(dpid)]
            entries += [e for e in self.best_effort if e.dpid == dpid]
            entries += [e for e in self.background if e.dpid == dpid]
            for task in self.tasks.values():
                entries += [e for e in task.entries if e.dpid == dpid]
            return sorted(entries, key=FlowEntry.sort_key)

    def switch_connected(self, dpid: int) -> None:
        """Record a switch that holds `expected_entries(dpid)` and is ready for requests."""
        with self._lock:
            if dpid not in self._dpids:
                self.errors.append({"t_s": self.clock(), "error": f"unknown datapath id {dpid} connected"})
            self.connected[dpid] = self.clock()
        self._tell_shaper_down()

    def switch_disconnected(self, dpid: int) -> None:
        with self._lock:
            self.connected.pop(dpid, None)
        self._tell_shaper_down()

    def _tell_shaper_down(self) -> None:
        """The shaper learns which switches are not connected (it skips a lost machine's interfaces)."""
        tell = getattr(self.shaper, "switches_down", None)
        if tell is not None:
            with self._lock:
                down = [sw.name for sw in self.plan.switches if sw.dpid not in self.connected]
            tell(down)

    def record_port_status(self, dpid: int, port_no: int, reason: str, link_down: bool) -> None:
        """Keep a port-status change (added/deleted/modified, link up/down) for the API."""
        with self._lock:
            self.ports.record_status(round(self.clock() - self.started_at, 3), dpid, port_no, reason, link_down)

    def record_error(self, dpid: int, message: str) -> None:
        with self._lock:
            self.errors.append({"t_s": round(self.clock() - self.started_at, 3), "dpid": dpid, "error": message})

    def record_port_stats(self, dpid: int, stats: Iterable[PortStat], t_s: float | None = None) -> None:
        """Update port counters and current rates (from the previous sample of each port)."""
        now = self.clock() if t_s is None else t_s
        with self._lock:
            self.ports.record_stats(dpid, stats, now)

    # -- tasks -------------------------------------------------------------------------------------
    def _require_connected(self, dpids: Iterable[int]) -> None:
        missing = sorted(set(dpids) - set(self.connected))
        if missing:
            names = ", ".join(f"{switch_name(self.plan, d)} (dpid {d})" for d in missing)
            raise Unavailable(f"switch(es) not connected: {names}")

    def install_task(self, task: TaskPaths) -> dict[str, Any]:
        """Install (or replace) a task's flow entries on every switch of its paths, then its classes.

        The summary's ``reservation`` says whether the task's reserved rates are enforced (and why
        not, or which class and guaranteed rates it got).

        Raises
        ------
        Unprocessable
            If the paths name an unknown site or cannot be turned into entries.
        Unavailable
            If a switch the task needs is not connected (nothing is changed then).
        ShapingFailed
            If tc refused the task's classes (the task is rolled back: entries and classes).
        """
        try:
            entries = task_entries(task, self.plan)
        except FlowBuildError as e:
            raise Unprocessable(str(e)) from e
        task_id = task.task_id
        # The lock guards state only: sending waits for the switch, whose replies reach us through
        # the same event loop that may need the lock.
        with self._lock:
            old = self.tasks.get(task_id)
            touched = {e.dpid for e in entries} | ({e.dpid for e in old.entries} if old else set())
            self._require_connected(touched)
            self._require_no_overlap(task_id, entries)
            self.tasks[task_id] = InstalledTask(task, entries, self.clock())
        try:
            if old is not None:
                for dpid in sorted({e.dpid for e in old.entries}):
                    self.sender.remove_cookie(dpid, task_id)
            for dpid, dp_entries in sorted(by_dpid(entries).items()):
                self.sender.install(dpid, dp_entries)
            reservation = self._shape(task)
        except ControllerError:
            with self._lock:
                self.tasks.pop(task_id, None)
            for dpid in sorted(touched & set(self.connected)):
                try:
                    self.sender.remove_cookie(dpid, task_id)
                except ControllerError as cleanup_error:
                    self.record_error(dpid, f"rollback of task {task_id} failed: {cleanup_error}")
            self._unshape(task_id, "rollback of")
            raise
        with self._lock:
            installed = self.tasks.get(task_id)
            if installed is not None and installed.entries is entries:
                installed.reservation = reservation
        self._persist_task(task_id)
        return self._task_summary_of(task_id, task, entries, reservation)

    # -- reservations ------------------------------------------------------------------------------
    def reservation_status(self) -> ShapingStatus:
        """Whether reserved rates are enforced on the links now, and why (not)."""
        if self.shaper is None:
            return ShapingStatus(False, NO_SHAPER)
        return self.shaper.status()

    def _shape(self, task: TaskPaths) -> Reservation:
        """Install (or replace) the task's classes. Raises ControllerError (the caller rolls back)."""
        if self.shaper is None:
            return Reservation(False, NO_SHAPER)
        try:
            return self.shaper.install(task)
        except ShapingBuildError as e:
            raise Unprocessable(str(e)) from e
        except ShapingError as e:
            raise ShapingFailed(f"task {task.task_id}: its reserved rates could not be shaped: {e}") from e

    def _unshape(self, task_id: int, what: str) -> bool:
        """Remove the task's classes; a failure is recorded (and returned False), not raised."""
        if self.shaper is None:
            return True
        try:
            self.shaper.remove(task_id)
        except ShapingError as e:
            with self._lock:
                self.errors.append(
                    {"t_s": round(self.clock() - self.started_at, 3), "error": f"{what} task {task_id}'s classes failed: {e}"}
                )
            return False
        return True

    def _require_no_overlap(self, task_id: int, entries: Sequence[FlowEntry]) -> None:
        """Refuse entries that would overwrite another task's (same switch, priority and match).

        Task ports repeat every `TASK_PORT_SLOTS` task ids, so two such tasks on the same hosts clash.
        """
        mine = {(e.dpid, e.priority, e.match) for e in entries}
        for other_id, other in self.tasks.items():
            if other_id == task_id:
                continue
            clash = mine & {(e.dpid, e.priority, e.match) for e in other.entries}
            if clash:
                dpid, _prio, match = sorted(clash)[0]
                raise Conflict(
                    f"task {task_id} would overwrite task {other_id}'s entry on {switch_name(self.plan, dpid)} "
                    f"for {dict(match)}; remove task {other_id} first"
                )

    def remove_task(self, task_id: int) -> dict[str, Any]:
        """Remove a task's entries (by cookie). Raises `NotFound` for an unknown task."""
        with self._lock:
            task = self.tasks.pop(task_id, None)
            if task is None:
                raise NotFound(f"no task {task_id} is installed (installed: {sorted(self.tasks)})")
            dpids = sorted({e.dpid for e in task.entries} & set(self.connected))
        try:
            for dpid in dpids:
                self.sender.remove_cookie(dpid, task_id)
        finally:
            removed = self._unshape(task_id, "removal of")
            self._persist_task(task_id)
        summary = self._task_summary_of(task_id, task.paths, task.entries, task.reservation)
        summary["reservation"]["removed"] = removed
        return summary

    def get_task(self, task_id: int) -> dict[str, Any]:
        with self._lock:
            if task_id not in self.tasks:
                raise NotFound(f"no task {task_id} is installed (installed: {sorted(self.tasks)})")
            task = self.tasks[task_id]
            return {
                **self._task_summary(task_id),
                "paths": task.paths.to_dict()["paths"],
                "entries": [e.to_dict() for e in task.entries],
            }

    def list_tasks(self) -> list[dict[str, Any]]:
        with self._lock:
            return [self._task_summary(t) for t in sorted(self.tasks)]

    def _task_summary(self, task_id: int) -> dict[str, Any]:
        task = self.tasks[task_id]
        return self._task_summary_of(task_id, task.paths, task.entries, task.reservation)

    def _task_summary_of(
        self, task_id: int, t: TaskPaths, entries: Sequence[FlowEntry], reservation: Reservation
    ) -> dict[str, Any]:
        return {
            "task_id": task_id,
            "label": t.label,
            "sites": t.sites,
            "paths": len(t.paths),
            "reserved_mbps": round(sum(p.reserved_mbps * len(p.links()) for p in t.paths), 6),
            "entries": len(entries),
            "switches": sorted({switch_name(self.plan, e.dpid) for e in entries}),
            "reservation": reservation.to_dict(),
        }

    # -- background --------------------------------------------------------------------------------
    def set_background(self, pairs: Sequence[Sequence[str]]) -> dict[str, Any]:
        """Replace the background host pairs and their shortest-path entries.

        Raises
        ------
        Unprocessable
            On an unknown site, a site without a host or a malformed pair.
        Unavailable
            If a switch is not connected.
        """
        try:
            norm = normalize_pairs(pairs)
            entries = background_entries(self.plan, norm)
        except FlowBuildError as e:
            raise Unprocessable(str(e)) from e
        with self._lock:
            old = self.background
            touched = {e.dpid for e in entries} | {e.dpid for e in old}
            self._require_connected(touched)
            self.background_pairs, self.background = norm, entries
        for dpid in sorted({e.dpid for e in old}):
            self.sender.remove_cookie(dpid, BACKGROUND_COOKIE)
        for dpid, dp_entries in sorted(by_dpid(entries).items()):
            self.sender.install(dpid, dp_entries)
        if self.store is not None:
            self.store.save_background([list(p) for p in norm])
        return self.get_background()

    def get_background(self) -> dict[str, Any]:
        with self._lock:
            return {"pairs": [list(p) for p in self.background_pairs], "entries": len(self.background)}

    # -- reading back ------------------------------------------------------------------------------
    def flows(self, task_id: int | None = None, *, background: bool = False) -> list[dict[str, Any]]:
        """Entries read live from every connected switch (optionally one task's, from the switches
        that hold its entries, or only the background routes', selected by cookie on the switch),
        with counters and ``read_s``, when they were read (`FlowStat.read_s`, else as the read
        returned, on `clock`): a rate divides by two reads' ``read_s`` apart, not by their answers'."""
        if task_id is not None and task_id not in self.tasks:
            raise NotFound(f"no task {task_id} is installed (installed: {sorted(self.tasks)})")
        if task_id is not None and background:
            raise BadRequest("ask for one task's entries or for the background's, not both")
        cookie = BACKGROUND_COOKIE if background else task_id
        dpids = set(self.connected)
        if task_id is not None:  # only the switches holding its entries: one that no longer answers
            with self._lock:     # elsewhere (a lost machine's) does not hold up the task's read
                dpids &= {e.dpid for e in self.tasks[task_id].entries}
        out = []
        for dpid in sorted(dpids):
            stats = self.sender.flow_stats(dpid, cookie)
            returned = self.clock()
            for st in stats:
                d = st.entry.to_dict()
                d.update(
                    switch=switch_name(self.plan, dpid),
                    site=site_name(self.plan, dpid),
                    task=st.entry.cookie if 0 < st.entry.cookie < BACKGROUND_COOKIE else None,
                    kind=entry_kind(st.entry.cookie),
                    packets=st.packets,
                    bytes=st.bytes,
                    duration_s=st.duration_s,
                    read_s=returned if st.read_s is None else st.read_s,
                )
                out.append(d)
        return out

    def link_stats(self, *, read_now: bool = False) -> list[dict[str, Any]]:
        """Per directed link: bytes sent so far (``tx_bytes``, as of ``read_s`` on `clock`), the current
        rate and utilisation of the shaped rate (over the last two polls, `record_port_stats`). With
        `read_now`, the bytes are read from every connected switch first (one that does not answer
        keeps its polled bytes): two such answers give a rate over their reads' time, as `flows`."""
        fresh: dict[tuple[int, int], tuple[int, float]] = {}
        for dpid in sorted(self.connected) if read_now else ():
            try:
                stats = self.sender.port_stats(dpid)
            except ControllerError:  # gone, or no answer in time: as the poller (`controller.app`)
                continue
            read_s = self.clock()
            fresh.update({(dpid, st.port_no): (st.tx_bytes, read_s) for st in stats})
        with self._lock:
            return self.ports.link_stats(fresh)

    def topology(self) -> dict[str, Any]:
        with self._lock:
            return {
                "plan": self.plan.to_dict(),
                "connected": sorted(self.connected),
                "ports_down": self.ports.ports_down(),
                "port_events": list(self.ports.events),
            }

    def health(self) -> dict[str, Any]:
        # Probing the shaper may run tc: not under the lock the event handlers need.
        reservations = self.reservation_status().to_dict()
        with self._lock:
            expected = sorted(self._dpids)
            missing = [d for d in expected if d not in self.connected]
            return {
                "status": "ok" if not missing else "waiting",
                "topology": self.plan.topology,
                "switches_expected": len(expected),
                "switches_connected": len([d for d in expected if d in self.connected]),
                "missing": [switch_name(self.plan, d) for d in missing],
                "tasks": sorted(self.tasks),
                "background_pairs": len(self.background_pairs),
                "connectivity": self.connectivity,
                "port_events": len(self.ports.events),
                "errors": list(self.errors)[-10:],
                "uptime_s": round(self.clock() - self.started_at, 3),
                "restored_tasks": list(self.restored),
                "reservations": reservations,
            }
