"""Reading Open vSwitch's packet socket budget from ``ss`` and the warning when it is short."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.emulation.ovs_socket import (
    RECEIVE_TARGET_BYTES,
    TARGET_BYTES,
    parse_port_receive_buffers,
    parse_send_buffer,
    raise_receive_default,
    receive_shortfall_warning,
    shortfall_warning,
)

SS = """\
Netid State  Recv-Q Send-Q Local Address:Port Peer Address:PortProcess
p_raw UNCONN 0      0      [ETH_P_ALL]:s1-eth2 *     users:(("ovs-vswitchd",pid=5616,fd=140)) ino:1 sk:1
\tver:0 cpy_thresh:0 flags( 0 ) skmem:(r0,rb212992,t0,tb65536,f0,w0,o0,bl0,d0)
p_raw 0      0                [0]:*                *     users:(("tcpdump",pid=7,fd=3)) ino:2 sk:2
\tver:0 cpy_thresh:0 flags( 0 ) skmem:(r0,rb212992,t0,tb999,f0,w0,o0,bl0,d0)
p_raw 0      0                [0]:*                *     users:(("ovs-vswitchd",pid=5616,fd=138)) ino:3 sk:3
\tver:0 cpy_thresh:0 flags( 0 ) skmem:(r0,rb212992,t0,tb212992,f0,w0,o0,bl0,d0)
p_raw 0      0                  *:s2-eth1          *     users:(("ovs-vswitchd",pid=5616,fd=43)) ino:4 sk:4
\tver:0 cpy_thresh:0 flags(  auxdata ) skmem:(r0,rb4194304,t0,tb4194304,f0,w0,o176,bl0,d3)
p_raw 0      0                  *:tcpd0            *     users:(("tcpdump",pid=7,fd=4)) ino:5 sk:5
\tver:0 cpy_thresh:0 flags( 0 ) skmem:(r0,rb1,t0,tb1,f0,w0,o0,bl0,d0)
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


def test_port_receive_buffers_are_those_of_ovs_vswitchds_bound_sockets() -> None:
    assert parse_port_receive_buffers(SS) == {"s1-eth2": 212992, "s2-eth1": 4194304}
    assert parse_port_receive_buffers("") == {}


def test_the_receive_default_is_raised_but_never_lowered(tmp_path: Path) -> None:
    f = tmp_path / "rmem_default"
    f.write_text("212992\n")
    done = raise_receive_default(path=f)
    assert done is not None and "212992" in done
    assert int(f.read_text()) == RECEIVE_TARGET_BYTES
    assert raise_receive_default(path=f) is None, "already there: nothing to do"
    f.write_text(f"{RECEIVE_TARGET_BYTES * 4}\n")
    assert raise_receive_default(path=f) is None
    assert int(f.read_text()) == RECEIVE_TARGET_BYTES * 4, "a larger default is kept"
    with pytest.raises(OSError):
        raise_receive_default(path=tmp_path / "missing")


def test_ports_with_a_short_receive_buffer_are_named_in_the_warning() -> None:
    warning = receive_shortfall_warning({"s1-eth2": 212992, "s2-eth1": RECEIVE_TARGET_BYTES})
    assert warning is not None and "s1-eth2" in warning and "s2-eth1" not in warning and "212992" in warning
    assert receive_shortfall_warning({"s2-eth1": RECEIVE_TARGET_BYTES}) is None
    assert receive_shortfall_warning({}) is None
