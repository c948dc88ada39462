"""Reading Open vSwitch's packet socket budget from ``ss`` and the warning when it is short."""

from __future__ import annotations

from orchestrator.emulation.ovs_socket import TARGET_BYTES, parse_send_buffer, shortfall_warning

SS = """\
Netid State  Recv-Q Send-Q Local Address:Port Peer Address:PortProcess
p_raw UNCONN 0      0      [ETH_P_ALL]:s1-eth2 *     users:(("ovs-vswitchd",pid=5616,fd=140)) ino:1 sk:1
\tver:0 cpy_thresh:0 flags( 0 ) skmem:(r0,rb212992,t0,tb65536,f0,w0,o0,bl0,d0)
p_raw 0      0                [0]:*                *     users:(("tcpdump",pid=7,fd=3)) ino:2 sk:2
\tver:0 cpy_thresh:0 flags( 0 ) skmem:(r0,rb212992,t0,tb999,f0,w0,o0,bl0,d0)
p_raw 0      0                [0]:*                *     users:(("ovs-vswitchd",pid=5616,fd=138)) ino:3 sk:3
\tver:0 cpy_thresh:0 flags( 0 ) skmem:(r0,rb212992,t0,tb212992,f0,w0,o0,bl0,d0)
"""


def test_the_budget_is_the_one_of_ovs_vswitchds_unbound_packet_socket() -> None:
    assert parse_send_buffer(SS) == 212992
    assert parse_send_buffer(SS.replace('"ovs-vswitchd",pid=5616,fd=138', '"other",pid=1,fd=1')) is None
    assert parse_send_buffer("") is None


def test_a_short_budget_is_warned_about_and_a_sufficient_one_is_not() -> None:
    warning = shortfall_warning(212992, "ovs-vswitchd's packet socket")
    assert warning is not None and "212992-byte budget" in warning and "make setup" in warning
    assert shortfall_warning(TARGET_BYTES, "x") is None
    assert shortfall_warning(None, "x") is None, "unknown is not called short"
