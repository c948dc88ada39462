"""The hosts' TCP minimum retransmission timeout is the emulated network's 10 ms at every time
dilation (`orchestrator.emulation.mininet_nodes.rto_min_ms`): a timeout fixed in wall time would
shrink in emulated time as K grows, and with it the silence after which a receiver acknowledges
every segment (docs/fidelity.md, "Shaping")."""

from __future__ import annotations

import pytest

from orchestrator.emulation.mininet_nodes import RTO_MIN_MS, rto_min_ms, set_rto_min


def test_the_timeout_is_the_emulated_networks_at_every_k() -> None:
    assert rto_min_ms(1) == RTO_MIN_MS == 10
    assert rto_min_ms(64) == 640
    assert rto_min_ms(2.5) == 25


def test_a_time_dilation_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="time dilation"):
        rto_min_ms(0.5)


class _Host:
    """A host whose route command is recorded, not run."""

    name = "h1"

    def __init__(self) -> None:
        self.argv: list[str] = []

    def defaultIntf(self) -> str:
        return "h1-eth0"

    def IP(self) -> str:
        return "10.0.0.1"

    def popen(self, argv: list[str], **_kw: object) -> object:
        self.argv = list(argv)

        class _Proc:
            returncode = 0

            def communicate(self, timeout: float) -> tuple[bytes, bytes]:
                return b"", b""

        return _Proc()


def test_the_route_carries_the_dilated_timeout_as_one_argument_list() -> None:
    host = _Host()
    set_rto_min(host, rto_min_ms(32))
    assert host.argv[:3] == ["ip", "route", "replace"]
    assert host.argv[-2:] == ["rto_min", "320ms"]
