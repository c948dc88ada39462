"""Cutting and restoring an emulated link, as a fibre cut does: both directions at once.

A link between sites A and B is a veth pair between their switches; `set_link` sets both ends
administratively down (or up) with ``ip link``, in the root namespace where the switch ports live.
Open vSwitch sees the carrier go and sends the controller a port-status message for each end, so
the controller (``/topology``'s ``ports_down``, ``/links``' ``up``) and everything that watches it
learn of the cut as they would of a real one. Used by the experiment's fault events and by
``netai net link A B down|up`` on a running network.
"""

from __future__ import annotations

import subprocess

from topologies.errors import TopologyError
from topologies.plan import EmulationPlan


def link_interfaces(plan: EmulationPlan, a: str, b: str) -> tuple[str, str]:
    """The two switch ports of the link between sites `a` and `b`.

    Raises
    ------
    TopologyError
        If either site is unknown or the two are not linked.
    """
    for ln in plan.links:
        if {ln.a, ln.b} == {a, b} and a != b:
            ends = {ln.a: f"{plan.switch(ln.a).name}-eth{ln.port_a}", ln.b: f"{plan.switch(ln.b).name}-eth{ln.port_b}"}
            return ends[a], ends[b]
    known = sorted({s for ln in plan.links for s in (ln.a, ln.b)})
    for s in (a, b):
        if s not in known:
            raise TopologyError(f"no site {s!r} in {plan.topology} (sites: {', '.join(known)})")
    raise TopologyError(f"{a!r} and {b!r} are not linked in {plan.topology}")


def set_link(plan: EmulationPlan, a: str, b: str, up: bool) -> tuple[str, str]:
    """Set both ends of the A-B link up or down; the interfaces changed.

    Raises
    ------
    TopologyError
        Unknown or unlinked sites, or ``ip`` failed (its message included).
    """
    ends = link_interfaces(plan, a, b)
    for dev in ends:
        done = subprocess.run(["ip", "link", "set", "dev", dev, "up" if up else "down"],
                              capture_output=True, text=True, timeout=10, check=False)
        if done.returncode != 0:
            raise TopologyError(f"ip link set {dev} {'up' if up else 'down'} failed: "
                                f"{done.stderr.strip() or done.returncode}")
    return ends
