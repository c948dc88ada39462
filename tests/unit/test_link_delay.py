"""The emulation's interface class puts the link's netem delay under every base class (no root needed).

Mininet builds the tc commands of an interface from `bwCmds` and `delayCmds` (strings with ``%s``
for tc and the interface); the emulation's class must give the background, best-effort and ACK
leaves the same delay where the kernel has netem, and the background its short pfifo where it has not.
"""

from __future__ import annotations

import pytest

from controller.htb import BACKGROUND_QUEUE_PACKETS
from orchestrator.emulation.mininet_nodes import mininet_classes

pytest.importorskip("mininet.link")  # mininet_classes imports Mininet when called


def delay_commands(delay: str | None) -> list[str]:
    _switch, _controller, link = mininet_classes("run-x")
    intf_cls = link.keywords["cls1"]
    cmds, _parent = intf_cls.delayCmds(" parent 5:2 ", delay=delay)
    return [c % ("tc", "s1-eth2") for c in cmds]


def test_with_a_delay_every_base_leaf_gets_netem() -> None:
    cmds = delay_commands("1.500ms")

    assert [c.split() for c in cmds] == [
        "tc qdisc add dev s1-eth2 parent 5:2 handle 10: netem delay 1.500ms".split(),
        "tc qdisc add dev s1-eth2 parent 5:3 handle 11: netem delay 1.500ms".split(),
        "tc qdisc add dev s1-eth2 parent 5:4 handle 12: netem delay 1.500ms".split(),
    ]


def test_without_a_delay_the_background_gets_its_short_queue_and_nothing_else() -> None:
    cmds = delay_commands(None)

    assert [c.split() for c in cmds] == [
        f"tc qdisc add dev s1-eth2 parent 5:2 handle 6: pfifo limit {BACKGROUND_QUEUE_PACKETS}".split()]
