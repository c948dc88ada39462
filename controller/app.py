"""The SDN app run by ``osken-manager`` (or ``ryu-manager``): a thin shim over the event framework.

Start it with::

    NETAI_PLAN_FILE=plan.json NETAI_REST_PORT=8181 NETAI_CONNECTIVITY=best-effort \\
        osken-manager --ofp-listen-host 127.0.0.1 --ofp-tcp-listen-port 6653 controller.app

It reads the `EmulationPlan` (JSON) named by ``NETAI_PLAN_FILE``, serves the REST API
(`controller.rest`) on 127.0.0.1:``NETAI_REST_PORT``, and drives the switches proactively: on
connection a switch is cleared and given the entries the core expects (table-miss drop, best-effort
connectivity unless ``NETAI_CONNECTIVITY=strict``, background, tasks); `install`/`remove_cookie`
send flow mods followed by a barrier and wait for it; port counters are polled every
`PORT_POLL_INTERVAL_S`; port-status messages are recorded.

Reserved rates are enforced with ``tc`` on the switch interfaces (`controller.shaping.TcShaper`
through `SubprocessTc`): the app runs as root in the namespace the switch interfaces live in. When
the links carry a netem delay the emulation sets ``NETAI_LINK_DELAY=1`` and task classes get it too.

All decisions live in `controller.core` and `controller.flows`; this module only converts
`FlowEntry` values into OpenFlow 1.3 messages (the small builders below) and sends them through
one helper (`_send_and_wait`). It must not compute paths.
"""

from __future__ import annotations

import ipaddress
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from controller.compat import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    FRAMEWORK,
    MAIN_DISPATCHER,
    BaseApp,
    hub,
    ofp_event,
    ofproto_v1_3,
    set_ev_cls,
)
from controller.core import ControllerCore
from controller.errors import ControllerError, Unavailable
from controller.flows import (
    BEST_EFFORT,
    CONNECTIVITY_MODES,
    COOKIE_MASK_ALL,
    ENV_CONNECTIVITY,
    FlowEntry,
    make_match,
)
from controller.htb import BACKGROUND_CLASS, BEST_EFFORT_CLASS
from controller.rest import RestApi
from controller.shaping import ENV_LINK_DELAY, TcShaper
from controller.southbound import FlowStat, PortStat
from controller.state_store import ENV_STATE_DB, StateStore
from controller.tc import runner_from_env
from controller.tc_datapath import TcFlowSender
from controller.tc_flows import ENV_DATAPATH, OPENFLOW, SOUTHBOUNDS, TC
from topologies.plan import EmulationPlan

ENV_PLAN_FILE = "NETAI_PLAN_FILE"
ENV_REST_PORT = "NETAI_REST_PORT"
DEFAULT_REST_PORT = 8181
REST_HOST = "127.0.0.1"
REPLY_TIMEOUT_S = 5.0
PORT_POLL_INTERVAL_S = 1.0
#: How often the tc datapath's switches and port carriers are looked at once all are connected.
TC_WATCH_INTERVAL_S = 0.2


class SwitchError(ControllerError):
    """A switch rejected a message (OpenFlow error) or did not answer in time."""

    status = 502


# -- small pure builders: FlowEntry -> OpenFlow 1.3 messages ----------------------------------------
def build_match(parser: Any, entry: FlowEntry) -> Any:
    return parser.OFPMatch(**entry.match_dict)


def build_instructions(ofp: Any, parser: Any, entry: FlowEntry) -> list[Any]:
    """Apply-actions: a DSCP rewrite (if any), then output to one port; or nothing (drop)."""
    if entry.out_port is None:
        return []
    actions = [] if entry.set_dscp is None else [parser.OFPActionSetField(ip_dscp=entry.set_dscp)]
    actions.append(parser.OFPActionOutput(entry.out_port))
    return [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]


def flow_add(datapath: Any, entry: FlowEntry) -> Any:
    ofp, parser = datapath.ofproto, datapath.ofproto_parser
    return parser.OFPFlowMod(
        datapath=datapath,
        cookie=entry.cookie,
        table_id=entry.table_id,
        command=ofp.OFPFC_ADD,
        priority=entry.priority,
        match=build_match(parser, entry),
        instructions=build_instructions(ofp, parser, entry),
    )


def flow_delete(datapath: Any, cookie: int | None) -> Any:
    """Delete every entry with `cookie` (all entries when None) in all tables."""
    ofp, parser = datapath.ofproto, datapath.ofproto_parser
    return parser.OFPFlowMod(
        datapath=datapath,
        cookie=0 if cookie is None else cookie,
        cookie_mask=0 if cookie is None else COOKIE_MASK_ALL,
        table_id=ofp.OFPTT_ALL,
        command=ofp.OFPFC_DELETE,
        out_port=ofp.OFPP_ANY,
        out_group=ofp.OFPG_ANY,
        match=parser.OFPMatch(),
    )


def entry_from_stats(dpid: int, stat: Any) -> FlowEntry:
    """A `FlowEntry` from an OFPFlowStats body item (drop, or an output after an optional DSCP rewrite)."""
    out_port = set_dscp = None
    for inst in stat.instructions:
        for action in getattr(inst, "actions", []):
            if hasattr(action, "port"):
                out_port = int(action.port)
            elif getattr(action, "key", None) == "ip_dscp":
                set_dscp = int(action.value)
    fields = {k: v for k, v in stat.match.items()}
    return FlowEntry(
        dpid=dpid,
        priority=int(stat.priority),
        cookie=int(stat.cookie),
        match=make_match(**fields),
        out_port=out_port,
        table_id=int(stat.table_id),
        set_dscp=set_dscp,
    )


@dataclass
class _Pending:
    """Replies awaited for one request (by xid), completed by the barrier or the last multipart."""

    done: Any
    barrier: bool
    replies: list[Any] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


class NetaiController(BaseApp):
    """Proactive path installer with a northbound REST API (see the module docstring)."""

    OFP_VERSIONS: ClassVar[list[int]] = [ofproto_v1_3.OFP_VERSION]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plan_file = os.environ.get(ENV_PLAN_FILE)
        if not plan_file:
            raise RuntimeError(f"{ENV_PLAN_FILE} must name the emulation plan JSON file")
        with open(plan_file) as f:
            self.plan = EmulationPlan.from_dict(json.load(f))
        connectivity = os.environ.get(ENV_CONNECTIVITY) or BEST_EFFORT
        if connectivity not in CONNECTIVITY_MODES:
            raise RuntimeError(f"{ENV_CONNECTIVITY} must be one of {', '.join(CONNECTIVITY_MODES)}, got {connectivity!r}")
        southbound = os.environ.get(ENV_DATAPATH) or OPENFLOW
        if southbound not in SOUTHBOUNDS:
            raise RuntimeError(f"{ENV_DATAPATH} must be one of {', '.join(SOUTHBOUNDS)}, got {southbound!r}")
        runner = runner_from_env(BEST_EFFORT_CLASS if southbound == TC else BACKGROUND_CLASS)
        shaper = TcShaper(self.plan, runner, delay=os.environ.get(ENV_LINK_DELAY) == "1")
        state_db = os.environ.get(ENV_STATE_DB)
        store = StateStore(Path(state_db)) if state_db else None
        #: The southbound the core drives: this app over OpenFlow, or tc filters (the tc datapath).
        self.tc_sender = TcFlowSender(self.plan) if southbound == TC else None
        sender = self.tc_sender if self.tc_sender is not None else self
        self.core = ControllerCore(self.plan, sender, shaper=shaper, connectivity=connectivity, store=store)
        restored = self.core.restore()
        if restored:
            self.logger.info("restored %d installed tasks from %s: %s", len(restored), state_db, restored)
        self.datapaths: dict[int, Any] = {}
        self._pending: dict[tuple[int, int], _Pending] = {}
        rest_port = int(os.environ.get(ENV_REST_PORT, DEFAULT_REST_PORT))
        if not ipaddress.ip_address(REST_HOST).is_loopback:
            raise RuntimeError("the REST API binds to loopback only")
        # Bind now, so that a taken port stops the manager at once with a clear error.
        self._server = hub.WSGIServer((REST_HOST, rest_port), RestApi(self.core))
        self.logger.info(
            "netai controller (%s, %s southbound): topology %s, %d switches, connectivity %s, REST on %s:%d",
            FRAMEWORK, southbound, self.plan.topology, len(self.plan.switches), connectivity, REST_HOST, rest_port,
        )
        self.threads.append(hub.spawn(self._server.serve_forever))
        self.threads.append(hub.spawn(self._poll_ports))
        if self.tc_sender is not None:
            self.threads.append(hub.spawn(self._watch_tc_switches, self.tc_sender))

    # -- the one sending helper --------------------------------------------------------------------
    def _datapath(self, dpid: int) -> Any:
        dp = self.datapaths.get(dpid)
        if dp is None:
            raise Unavailable(f"switch dpid {dpid} is not connected")
        return dp

    def _send_and_wait(self, dpid: int, msgs: Sequence[Any], *, reply_to: Any = None) -> list[Any]:
        """Send `msgs`, then wait for a barrier (or for the multipart replies to `reply_to`).

        Raises
        ------
        SwitchError
            If the switch answers with an OpenFlow error or not within `REPLY_TIMEOUT_S`.
        """
        dp = self._datapath(dpid)
        parser = dp.ofproto_parser
        pending = _Pending(done=hub.Event(), barrier=reply_to is None)
        xids = []
        for msg in msgs:
            dp.set_xid(msg)
            xids.append(msg.xid)
            self._pending[(dpid, msg.xid)] = pending
            dp.send_msg(msg)
        if reply_to is None:
            barrier = parser.OFPBarrierRequest(dp)
            dp.set_xid(barrier)
            xids.append(barrier.xid)
            self._pending[(dpid, barrier.xid)] = pending
            dp.send_msg(barrier)
        try:
            if not pending.done.wait(timeout=REPLY_TIMEOUT_S):
                raise SwitchError(f"switch dpid {dpid} did not answer within {REPLY_TIMEOUT_S:g} s")
        finally:
            for xid in xids:
                self._pending.pop((dpid, xid), None)
        if pending.errors:
            raise SwitchError(f"switch dpid {dpid} rejected a message: {'; '.join(pending.errors)}")
        return pending.replies

    # -- FlowSender --------------------------------------------------------------------------------
    def install(self, dpid: int, entries: Sequence[FlowEntry]) -> None:
        dp = self._datapath(dpid)
        self._send_and_wait(dpid, [flow_add(dp, e) for e in entries])

    def remove_cookie(self, dpid: int, cookie: int) -> None:
        self._send_and_wait(dpid, [flow_delete(self._datapath(dpid), cookie)])

    def flow_stats(self, dpid: int, cookie: int | None) -> list[FlowStat]:
        dp = self._datapath(dpid)
        parser = dp.ofproto_parser
        req = parser.OFPFlowStatsRequest(
            dp, cookie=cookie or 0, cookie_mask=COOKIE_MASK_ALL if cookie is not None else 0
        )
        stats = []
        replies = self._send_and_wait(dpid, [req], reply_to=req)
        read_s = time.monotonic()  # the counters' moment: as the switch's replies came in
        for reply in replies:
            for st in reply.body:
                stats.append(
                    FlowStat(
                        entry=entry_from_stats(dpid, st),
                        packets=int(st.packet_count),
                        bytes=int(st.byte_count),
                        duration_s=st.duration_sec + st.duration_nsec / 1e9,
                        read_s=read_s,
                    )
                )
        return stats

    def port_stats(self, dpid: int) -> list[PortStat]:
        dp = self._datapath(dpid)
        req = dp.ofproto_parser.OFPPortStatsRequest(dp, 0, dp.ofproto.OFPP_ANY)
        out = []
        for reply in self._send_and_wait(dpid, [req], reply_to=req):
            for st in reply.body:
                if st.port_no > dp.ofproto.OFPP_MAX:
                    continue  # the LOCAL port
                out.append(
                    PortStat(
                        port_no=int(st.port_no),
                        rx_bytes=int(st.rx_bytes),
                        tx_bytes=int(st.tx_bytes),
                        rx_packets=int(st.rx_packets),
                        tx_packets=int(st.tx_packets),
                    )
                )
        return out

    # -- switch life cycle -------------------------------------------------------------------------
    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev: Any) -> None:
        dp = ev.msg.datapath
        self.datapaths[dp.id] = dp
        # Waiting for the barrier must not block the event loop that delivers it.
        hub.spawn(self._init_switch, dp)

    def _init_switch(self, dp: Any) -> None:
        entries = self.core.expected_entries(dp.id)
        try:
            self._send_and_wait(dp.id, [flow_delete(dp, None), *(flow_add(dp, e) for e in entries)])
        except ControllerError as e:
            self.logger.error("switch dpid %s: initial entries failed: %s", dp.id, e)
            self.core.record_error(dp.id, f"initial entries failed: {e}")
            return
        self.core.switch_connected(dp.id)
        self.logger.info("switch dpid %s connected, %d entries", dp.id, len(entries))

    @set_ev_cls(ofp_event.EventOFPStateChange, [MAIN_DISPATCHER, DEAD_DISPATCHER])
    def _state_change(self, ev: Any) -> None:
        dpid = ev.datapath.id
        if ev.state != DEAD_DISPATCHER or dpid is None:
            return
        if self.datapaths.get(dpid) is ev.datapath:  # not a stale connection of a reconnected switch
            del self.datapaths[dpid]
            self.core.switch_disconnected(dpid)
            self.logger.info("switch dpid %s disconnected", dpid)

    @set_ev_cls(ofp_event.EventOFPPortStatus, MAIN_DISPATCHER)
    def _port_status(self, ev: Any) -> None:
        msg = ev.msg
        ofp = msg.datapath.ofproto
        reason = {ofp.OFPPR_ADD: "add", ofp.OFPPR_DELETE: "delete", ofp.OFPPR_MODIFY: "modify"}.get(
            msg.reason, str(msg.reason)
        )
        link_down = bool(msg.desc.state & ofp.OFPPS_LINK_DOWN)
        self.core.record_port_status(msg.datapath.id, int(msg.desc.port_no), reason, link_down)
        self.logger.info("port status dpid %s port %s: %s%s", msg.datapath.id, msg.desc.port_no,
                         reason, " (link down)" if link_down else "")

    # -- replies -----------------------------------------------------------------------------------
    def _complete(self, ev: Any, *, last: bool, keep: bool) -> None:
        msg = ev.msg
        pending = self._pending.get((msg.datapath.id, msg.xid))
        if pending is None:
            return
        if keep:
            pending.replies.append(msg)
        if last:
            pending.done.set()

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier_reply(self, ev: Any) -> None:
        self._complete(ev, last=True, keep=False)

    @set_ev_cls([ofp_event.EventOFPFlowStatsReply, ofp_event.EventOFPPortStatsReply], MAIN_DISPATCHER)
    def _stats_reply(self, ev: Any) -> None:
        more = bool(ev.msg.flags & ev.msg.datapath.ofproto.OFPMPF_REPLY_MORE)
        self._complete(ev, last=not more, keep=True)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error(self, ev: Any) -> None:
        msg = ev.msg
        text = f"OpenFlow error type={msg.type} code={msg.code} (xid {msg.xid})"
        self.logger.error("switch dpid %s: %s", msg.datapath.id, text)
        self.core.record_error(msg.datapath.id, text)
        pending = self._pending.get((msg.datapath.id, msg.xid))
        if pending is not None:
            pending.errors.append(text)
            if not pending.barrier:
                # A failed stats request gets no reply: complete it now.
                pending.done.set()

    # -- the tc datapath's switches -----------------------------------------------------------------
    def _watch_tc_switches(self, sender: TcFlowSender) -> None:
        """Connect each tc switch once its ports carry its block (clear it, install what the core
        expects), disconnect it when they no longer do, and report its ports' carrier changes as
        port-status events, as an OpenFlow switch's messages would."""
        carrier: dict[int, dict[int, bool]] = {}
        while True:
            if len(self.core.connected) < len(self.plan.switches):
                ready = sender.ready_switches()
                for sw in self.plan.switches:
                    if sw.dpid in ready and sw.dpid not in self.core.connected:
                        self._init_tc_switch(sender, sw.dpid)
                        carrier[sw.dpid] = sender.link_down(sw.dpid)
            for dpid in sorted(self.core.connected):
                now = sender.link_down(dpid)
                if not now:  # every port gone: the switch was taken down
                    self.core.switch_disconnected(dpid)
                    self.logger.info("tc switch dpid %s gone", dpid)
                else:
                    self._tc_port_changes(dpid, carrier, now)
            hub.sleep(TC_WATCH_INTERVAL_S if len(self.core.connected) == len(self.plan.switches) else 0.05)

    def _init_tc_switch(self, sender: TcFlowSender, dpid: int) -> None:
        entries = self.core.expected_entries(dpid)
        try:
            sender.reset(dpid)
            sender.install(dpid, entries)
        except ControllerError as e:
            self.logger.error("tc switch dpid %s: initial filters failed: %s", dpid, e)
            self.core.record_error(dpid, f"initial filters failed: {e}")
            return
        self.core.switch_connected(dpid)
        self.logger.info("tc switch dpid %s ready, %d entries", dpid, len(entries))

    def _tc_port_changes(self, dpid: int, carrier: dict[int, dict[int, bool]], now: dict[int, bool]) -> None:
        before = carrier.setdefault(dpid, {})
        for port, down in now.items():
            if before.get(port) is not None and before[port] != down:
                self.core.record_port_status(dpid, port, "modify", down)
                self.logger.info("port status dpid %s port %s: modify%s", dpid, port, " (link down)" if down else "")
        carrier[dpid] = now

    # -- port counters -----------------------------------------------------------------------------
    def _poll_ports(self) -> None:
        sender = self.core.sender
        while True:
            for dpid in sorted(self.core.connected):
                try:
                    self.core.record_port_stats(dpid, sender.port_stats(dpid))
                except ControllerError as e:
                    self.logger.debug("port stats of dpid %s: %s", dpid, e)
            hub.sleep(PORT_POLL_INTERVAL_S)
