"""The send budget of Open vSwitch's userspace datapath, which every emulated link shares.

In the userspace datapath (`netdev-linux`), ovs-vswitchd sends every packet, on every port, through
one AF_PACKET socket (``af_packet_sock()`` in OVS's ``lib/netdev-linux.c``). A packet waiting in a
port's qdisc (the htb classes that shape the links) still counts against that one socket's send
buffer, which the kernel sets from ``net.core.wmem_default`` when the socket is made (212992
bytes by default, about 90 full frames). So when the queues of all shaped links together hold more
than that, ovs-vswitchd's sends fail and the packet is lost, on whatever port it was meant for.

Measured here (`benchmarks/bench_dataplane.py`, one run each, same commit): with the default budget,
mst's broadcast over a 5-deep relay chain took 1.70 x S/B, with 4 MiB 1.15; latency over the
round's lower bound went from 1.38 to 1.19 for mst and from 1.82 to 1.27 for steiner.

`scripts/provision.sh` (``make setup``) raises ``net.core.wmem_default`` to `TARGET_BYTES` and
restarts ovs-vswitchd when its socket has less (only when no bridge exists). The emulation records
the budget it ran with (`send_buffer`) and warns when it is below the target.

The receive side: ovs-vswitchd reads each port through a packet socket of its own, bound to the
port when the port is added, whose receive buffer is ``net.core.rmem_default`` at that moment
(212992 bytes by default). A host that sends a burst into its switch port (a cwnd's worth of a
model copy, several copies at once at G under spff) overflows it while ovs-vswitchd is busy with
other ports, and the kernel drops what does not fit: TCP loss, recovered by retransmission or a
timeout, on the emulation's instrument rather than on a shaped link. Measured here
(`benchmarks/bench_dataplane.py` stalls, spff, NSFNET, background on, same commit): 1123 drops on
these sockets in 200 rounds and a largest round of 5.2 x the median with 212992 bytes, none and
2.3 x with `RECEIVE_TARGET_BYTES`. As no restart is needed (the sockets are made with the ports),
the emulation raises the default itself before it adds its ports (`raise_receive_default`: only
upwards, as Mininet's ``fixLimits`` raises other socket limits), then records the smallest
receive buffer its ports got (`port_receive_buffers`).
"""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

LOG = logging.getLogger(__name__)

#: The send budget the testbed wants for ovs-vswitchd's packet socket (bytes).
TARGET_BYTES = 4 * 1024 * 1024
WMEM_DEFAULT = Path("/proc/sys/net/core/wmem_default")
_SOCKET = re.compile(r"^p_raw\s.*\[0\]:\*.*\"ovs-vswitchd\".*\n\s+.*skmem:\([^)]*\btb(?P<tb>\d+)", re.M)
#: The receive buffer the testbed wants for each port's packet socket (bytes).
RECEIVE_TARGET_BYTES = 4 * 1024 * 1024
RMEM_DEFAULT = Path("/proc/sys/net/core/rmem_default")
_PORT_SOCKET = re.compile(
    r"^p_raw\s.*\s\S*:(?P<dev>[^\s*]\S*)\s.*\"ovs-vswitchd\".*\n\s+.*skmem:\([^)]*\brb(?P<rb>\d+)", re.M
)


def parse_send_buffer(ss_output: str) -> int | None:
    """The send buffer (bytes) of ovs-vswitchd's unbound packet socket in ``ss -0 -e -m -p`` output."""
    m = _SOCKET.search(ss_output)
    return int(m["tb"]) if m else None


def send_buffer() -> int | None:
    """ovs-vswitchd's packet socket send buffer now; None when it has not sent yet (or ss fails)."""
    try:
        res = subprocess.run(["ss", "-0", "-e", "-m", "-p"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_send_buffer(res.stdout)


def wmem_default() -> int | None:
    try:
        return int(WMEM_DEFAULT.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def expected_send_buffer() -> tuple[int | None, str]:
    """(the budget the datapath has or will have, where the figure comes from)."""
    now = send_buffer()
    if now is not None:
        return now, "ovs-vswitchd's packet socket"
    return wmem_default(), "net.core.wmem_default (ovs-vswitchd has not made its packet socket yet)"


def shortfall_warning(budget: int | None, source: str) -> str | None:
    """The warning to give when `budget` is below `TARGET_BYTES` (None when it is not)."""
    if budget is None or budget >= TARGET_BYTES:
        return None
    return (f"netai: warning: Open vSwitch's userspace datapath sends every link's packets through one socket "
            f"with a {budget}-byte budget ({source}); queued packets beyond it are lost on any link. "
            f"Run `make setup` (it raises the budget to {TARGET_BYTES} bytes and restarts ovs-vswitchd)")


def parse_port_receive_buffers(ss_output: str) -> dict[str, int]:
    """Interface -> receive buffer (bytes) of ovs-vswitchd's packet socket bound to it, from
    ``ss -0 -e -m -p`` output."""
    return {m["dev"]: int(m["rb"]) for m in _PORT_SOCKET.finditer(ss_output)}


def port_receive_buffers() -> dict[str, int]:
    """`parse_port_receive_buffers` of ``ss`` now (empty when ss fails)."""
    try:
        res = subprocess.run(["ss", "-0", "-e", "-m", "-p"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return parse_port_receive_buffers(res.stdout)


def raise_receive_default(target: int = RECEIVE_TARGET_BYTES, path: Path = RMEM_DEFAULT) -> str | None:
    """Raise ``net.core.rmem_default`` to `target` if it is lower (never lower it).

    Returns what was done, for the log (None when nothing was needed); raises OSError when the
    value cannot be read or written (not root, no such file).
    """
    now = int(path.read_text().split()[0])
    if now >= target:
        return None
    path.write_text(f"{target}\n")
    return f"net.core.rmem_default raised from {now} to {target} (the receive buffer of Open vSwitch's port sockets)"


def receive_shortfall_warning(buffers: dict[str, int]) -> str | None:
    """The warning to give when a port's receive buffer is below `RECEIVE_TARGET_BYTES`."""
    short = sorted(dev for dev, rb in buffers.items() if rb < RECEIVE_TARGET_BYTES)
    if not short:
        return None
    return (f"netai: warning: {len(short)} Open vSwitch port socket(s) ({', '.join(short[:3])}"
            f"{', ...' if len(short) > 3 else ''}) have a receive buffer below {RECEIVE_TARGET_BYTES} bytes "
            f"(smallest {min(buffers[d] for d in short)}): bursts into those ports are dropped before any "
            f"shaped link (net.core.rmem_default could not be raised)")


def prepare_userspace_datapath() -> int | None:
    """Before a run adds its ports: warn when the send budget is short, and raise the receive
    default (the ports' sockets take it when they are made). Returns the expected send budget
    (bytes), None when unknown."""
    budget, source = expected_send_buffer()
    warning = shortfall_warning(budget, source)
    if warning:
        print(warning, file=sys.stderr)
    try:
        raised = raise_receive_default()
    except (OSError, ValueError, IndexError) as e:
        raised = f"net.core.rmem_default could not be raised: {e}"
    if raised:
        LOG.info("%s", raised)
    return budget


def smallest_receive_buffer(interfaces: list[str]) -> int | None:
    """The smallest receive buffer (bytes) of the packet sockets of `interfaces`, warned about when
    short; None when none of them has one (the kernel datapath, or not found)."""
    buffers = {dev: rb for dev, rb in port_receive_buffers().items() if dev in set(interfaces)}
    warning = receive_shortfall_warning(buffers)
    if warning:
        print(warning, file=sys.stderr)
    return min(buffers.values()) if buffers else None
