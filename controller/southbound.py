"""What the controller's core needs from the OpenFlow side: the `FlowSender` port and what it reads back.

The os-ken app implements `FlowSender` in production (`controller.app`), a fake flow table in the
tests (`tests/unit/controller_fakes.py`). This module must not import the OpenFlow framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from controller.flows import FlowEntry


@dataclass(frozen=True)
class FlowStat:
    """A flow entry as the switch reports it, with its counters. `read_s`: when the counters were
    read, on the controller's monotonic clock (None: the core stamps them as the read returns)."""

    entry: FlowEntry
    packets: int
    bytes: int
    duration_s: float
    read_s: float | None = None


@dataclass(frozen=True)
class PortStat:
    port_no: int
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int


class FlowSender(Protocol):
    """What the core needs from the OpenFlow side. Every call may raise `Unavailable`.

    `install` and `remove_cookie` return only once the switch has processed the messages (a
    barrier), and raise `ControllerError` if the switch rejected one of them.
    """

    def install(self, dpid: int, entries: Sequence[FlowEntry]) -> None: ...

    def remove_cookie(self, dpid: int, cookie: int) -> None: ...

    def flow_stats(self, dpid: int, cookie: int | None) -> list[FlowStat]: ...

    def port_stats(self, dpid: int) -> list[PortStat]: ...
