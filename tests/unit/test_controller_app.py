"""The app's message builders against the real OpenFlow 1.3 parser (no switch, no event loop)."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("os_ken")

from os_ken.ofproto import ofproto_v1_3, ofproto_v1_3_parser
from os_ken.ofproto.ofproto_protocol import ProtocolDesc

from controller.app import entry_from_stats, flow_add, flow_delete
from controller.flows import (
    BEST_EFFORT_COOKIE,
    BEST_EFFORT_PRIORITY,
    COOKIE_MASK_ALL,
    LOWER_EFFORT_DSCP,
    FlowEntry,
    make_match,
    table_miss_entry,
    tcp_match,
)


def _datapath() -> ProtocolDesc:
    return ProtocolDesc(ofproto_v1_3.OFP_VERSION)


def _round_trip(entry: FlowEntry) -> tuple[Any, FlowEntry]:
    """`entry` as a FlowMod on the wire, parsed back: the message and the entry read from it."""
    msg = flow_add(_datapath(), entry)
    msg.xid = 1
    msg.serialize()
    parsed = ofproto_v1_3_parser.OFPFlowMod.parser(_datapath(), *_header(msg.buf), msg.buf)
    stats = ofproto_v1_3_parser.OFPFlowStats(
        table_id=parsed.table_id, priority=parsed.priority, cookie=parsed.cookie,
        match=parsed.match, instructions=parsed.instructions,
    )
    return parsed, entry_from_stats(entry.dpid, stats)


def test_flow_add_round_trips_through_the_wire_format() -> None:
    entry = FlowEntry(3, 200, 42, tcp_match("10.0.0.1", "10.0.0.2", tcp_dst=20084), 4)

    _, back = _round_trip(entry)

    assert back == entry


def test_table_miss_has_no_instructions_and_delete_selects_by_cookie() -> None:
    dp = _datapath()

    miss = flow_add(dp, table_miss_entry(5))
    delete = flow_delete(dp, 42)
    delete_all = flow_delete(dp, None)

    assert miss.instructions == [] and miss.priority == 0
    assert (delete.cookie, delete.cookie_mask, delete.command) == (42, COOKIE_MASK_ALL, ofproto_v1_3.OFPFC_DELETE)
    assert delete.table_id == ofproto_v1_3.OFPTT_ALL
    assert (delete_all.cookie, delete_all.cookie_mask) == (0, 0)


def _header(buf: bytes) -> tuple[int, int, int, int]:
    from os_ken.ofproto import ofproto_parser

    version, msg_type, msg_len, xid = ofproto_parser.header(buf)
    return version, msg_type, msg_len, xid


def test_a_best_effort_entry_sets_the_dscp_before_its_output_and_round_trips() -> None:
    entry = FlowEntry(2, BEST_EFFORT_PRIORITY, BEST_EFFORT_COOKIE, make_match(eth_type=0x0800, ipv4_dst="10.0.0.3"),
                      3, set_dscp=LOWER_EFFORT_DSCP)

    parsed, back = _round_trip(entry)

    actions = parsed.instructions[0].actions
    assert [type(a).__name__ for a in actions] == ["OFPActionSetField", "OFPActionOutput"]
    assert back == entry
