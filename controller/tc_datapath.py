"""The tc datapath's `FlowSender`: flow entries as ``tc`` filters on the switches' ingress blocks.

`TcFlowSender` implements `controller.southbound.FlowSender` for switches that forward in the kernel
(`controller.tc_flows` says how an entry becomes a filter and what differs from OpenFlow). It runs
``tc`` (root, in the namespace the switch ports live in: the controller's) with argument lists,
batched through a `controller.tc.TcRunner`; it reads the filters and their counters back with
``tc -s filter show`` and the ports' counters and carrier from sysfs.

A switch is there when every one of its ports carries its ingress block (`switch_ready`): Mininet's
switch class (`orchestrator.emulation.mininet_nodes`) makes the ports and blocks, the controller
(`controller.app`, ``NETAI_DATAPATH=tc``) then clears the block and installs what the core expects,
as it does for an OpenFlow switch that connects.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from controller.errors import ControllerError, Unavailable
from controller.flows import (
    BACKGROUND_COOKIE,
    BACKGROUND_PRIORITY,
    BEST_EFFORT_COOKIE,
    BEST_EFFORT_PRIORITY,
    FlowEntry,
)
from controller.southbound import FlowStat, PortStat
from controller.tc import ShapingError, SubprocessTc, TcRunner, batch_text
from controller.tc_flows import (
    PrefBook,
    TcFlowError,
    background_class_del,
    background_class_filter,
    block_flush,
    filter_add,
    filter_del,
    fixed_pref,
    installable,
    parse_blocks,
    port_device,
)
from topologies.plan import HOST_PORT, EmulationPlan

SYSFS_NET = Path("/sys/class/net")
#: How long one read of every switch's filters serves the core's per-switch calls that follow it.
READ_REUSE_S = 0.05


class TcDatapathError(ControllerError):
    """``tc`` refused a switch's filters, or could not be run."""

    status = 502


class TcFlowSender:
    """`FlowSender` on the tc datapath (see the module docstring).

    Parameters
    ----------
    plan
        The emulation plan: switch names, datapath ids (the block numbers) and ports.
    runner
        Runs tc batches (default: the local ``tc`` binary).
    sysfs
        Where the interfaces' counters and carrier are read (``/sys/class/net``).
    """

    def __init__(self, plan: EmulationPlan, runner: TcRunner | None = None, *, tc: str = "tc",
                 sysfs: Path = SYSFS_NET, timeout_s: float = 20.0) -> None:
        self.plan = plan
        self.runner = runner or SubprocessTc(tc)
        self.tc = tc
        self.sysfs = sysfs
        self.timeout_s = timeout_s
        self._prefs = PrefBook()
        self._held: dict[int, set[int]] = {}  # dpid -> preferences with filters there
        self._background_devices: dict[int, set[str]] = {}  # dpid -> links given background filters
        self._lock = threading.Lock()
        self._reads: dict[int | None, tuple[float, dict[int, list[FlowStat]]]] = {}  # cookie -> (when, unread parts)

    # -- the plan --------------------------------------------------------------------------------
    def switch_name(self, dpid: int) -> str:
        try:
            return next(sw.name for sw in self.plan.switches if sw.dpid == dpid)
        except StopIteration:
            raise Unavailable(f"no switch with datapath id {dpid}") from None

    def ports(self, dpid: int) -> list[int]:
        """The switch's port numbers: its host's (if it has one) and one per link."""
        site = self.plan.site_of_dpid(dpid)
        ports = [HOST_PORT] if any(h.site == site for h in self.plan.hosts) else []
        for ln in self.plan.links:
            if ln.a == site:
                ports.append(ln.port_a)
            if ln.b == site:
                ports.append(ln.port_b)
        return sorted(ports)

    def devices(self, dpid: int) -> list[str]:
        name = self.switch_name(dpid)
        return [port_device(name, p) for p in self.ports(dpid)]

    # -- running tc ------------------------------------------------------------------------------
    def _run(self, commands: Sequence[Sequence[str]], what: str, *, force: bool = False) -> None:
        try:
            self.runner.run(commands, force=force)
        except (ShapingError, ValueError) as e:
            raise TcDatapathError(f"{what}: {e}") from e

    def _show(self, argv: Sequence[str], stdin: str | None = None) -> str:
        try:
            res = subprocess.run([self.tc, *argv], input=stdin, capture_output=True, text=True,
                                 timeout=self.timeout_s, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            raise TcDatapathError(f"tc {' '.join(argv)} failed: {e}") from e
        if res.returncode != 0:
            raise Unavailable(f"tc {' '.join(argv)}: {res.stderr.strip()[:300]}")
        return res.stdout

    # -- FlowSender ------------------------------------------------------------------------------
    def install(self, dpid: int, entries: Sequence[FlowEntry]) -> None:
        name = self.switch_name(dpid)
        commands: list[list[str]] = []
        with self._lock:
            try:
                prefs = {e: self._prefs.pref(e) for e in entries if installable(e)}
            except TcFlowError as e:
                raise TcDatapathError(f"{name}: {e}") from e
            background: set[str] = set()
            for entry, pref in prefs.items():
                device = port_device(name, int(entry.out_port or 0))
                try:
                    commands.append(filter_add(dpid, pref, entry, device))
                except TcFlowError as e:
                    raise TcDatapathError(f"{name}: {e}") from e
                if entry.cookie == BACKGROUND_COOKIE and entry.out_port != HOST_PORT:
                    commands.append(background_class_filter(device, entry))
                    background.add(device)
            try:
                self._run(commands, f"installing {len(prefs)} filter(s) on {name}")
            except TcDatapathError:
                self._undo(dpid, prefs)
                raise
            self._held.setdefault(dpid, set()).update(prefs.values())
            self._background_devices.setdefault(dpid, set()).update(background)

    def _undo(self, dpid: int, prefs: dict[FlowEntry, int]) -> None:
        """After a refused batch (tc stops at the first error): remove what of it went in, of the
        preferences it added (those already held stay), and release them."""
        new = sorted(set(prefs.values()) - self._held.get(dpid, set()))
        try:
            self.runner.run([filter_del(dpid, p) for p in new], force=True)
        except ShapingError:
            pass  # a preference none of whose filters went in cannot be deleted: nothing to undo
        for entry in {e for e, p in prefs.items() if p in new}:
            self._prefs.release(dpid, entry.cookie)

    def remove_cookie(self, dpid: int, cookie: int) -> None:
        name = self.switch_name(dpid)
        with self._lock:
            pref = self._pref_of_cookie(cookie)
            if pref is None or pref not in self._held.get(dpid, set()):
                return
            commands = [filter_del(dpid, pref)]
            devices = self._background_devices.pop(dpid, set()) if cookie == BACKGROUND_COOKIE else set()
            commands += [background_class_del(dev) for dev in sorted(devices)]
            self._run(commands, f"removing cookie {cookie:#x} from {name}")
            self._held[dpid].discard(pref)
            self._prefs.release(dpid, cookie)

    def _pref_of_cookie(self, cookie: int) -> int | None:
        if cookie == BACKGROUND_COOKIE:
            return fixed_pref(BACKGROUND_PRIORITY)
        if cookie == BEST_EFFORT_COOKIE:
            return fixed_pref(BEST_EFFORT_PRIORITY)
        return self._prefs.task_pref(cookie)

    def flow_stats(self, dpid: int, cookie: int | None) -> list[FlowStat]:
        """Switch `dpid`'s filters (of `cookie`). The core asks switch by switch, at once: the first
        call reads every switch holding them in one ``tc -batch`` (one process, one moment), and the
        others within `READ_REUSE_S` take their part of that read."""
        pref = None if cookie is None else self._pref_of_cookie(cookie)
        with self._lock:
            holders = {sw.name: sw.dpid for sw in self.plan.switches
                       if pref is None or pref in self._held.get(sw.dpid, set())}
        if dpid not in holders.values():
            return []  # nothing of it on this switch: not worth a tc process
        now = time.monotonic()
        cached = self._reads.get(cookie)
        if cached is not None and now - cached[0] <= READ_REUSE_S and dpid in cached[1]:
            return cached[1].pop(dpid)  # each switch's part is handed out once
        shows = [["filter", "show", "block", str(d), *([] if pref is None else ["pref", str(pref)])]
                 for d in holders.values()]
        before = time.monotonic()
        text = self._show(["-s", "-batch", "-"], stdin=batch_text(shows))
        read_s = (before + time.monotonic()) / 2  # the counters' moment: within the dump, taken as its middle
        try:
            got = parse_blocks(holders, text, cookie, pref=pref, read_s=read_s)
        except TcFlowError as e:
            raise TcDatapathError(f"reading the switches' filters: {e}") from e
        mine = got.pop(dpid)
        self._reads[cookie] = (now, got)
        return mine

    def port_stats(self, dpid: int) -> list[PortStat]:
        name = self.switch_name(dpid)
        out = []
        for port in self.ports(dpid):
            stats = self.sysfs / port_device(name, port) / "statistics"
            try:
                values = {k: int((stats / k).read_text()) for k in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")}
            except (OSError, ValueError):
                continue  # a port gone (teardown): the others still count
            out.append(PortStat(port_no=port, **values))
        return out

    # -- switches and ports ----------------------------------------------------------------------
    def reset(self, dpid: int) -> None:
        """Clear switch `dpid`: every filter of its block and the background filters on its links."""
        name = self.switch_name(dpid)
        with self._lock:
            self._run([block_flush(dpid)], f"clearing {name}")
            links = [port_device(name, p) for p in self.ports(dpid) if p != HOST_PORT]
            try:  # a link without background filters makes its command fail: that is no error
                self.runner.run([background_class_del(dev) for dev in links], force=True)
            except ShapingError:
                pass
            self._held.pop(dpid, None)
            self._background_devices.pop(dpid, None)
            self._prefs.release_switch(dpid)

    def ready_switches(self) -> set[int]:
        """The switches every port of which carries the switch's ingress block now."""
        try:
            qdiscs = json.loads(self._show(["-j", "qdisc", "show"]) or "[]")
        except (ControllerError, ValueError):
            return set()
        blocks = {q.get("dev"): q.get("ingress_block") for q in qdiscs if q.get("kind") in ("ingress", "clsact")}
        return {sw.dpid for sw in self.plan.switches
                if all(blocks.get(dev) == sw.dpid for dev in self.devices(sw.dpid))}

    def link_down(self, dpid: int) -> dict[int, bool]:
        """{port: carrier down?} of switch `dpid`'s ports that exist."""
        name = self.switch_name(dpid)
        out = {}
        for port in self.ports(dpid):
            try:
                state = (self.sysfs / port_device(name, port) / "operstate").read_text().strip()
            except OSError:
                continue
            out[port] = state != "up"
        return out
