"""A Mininet `Topo` built from an `EmulationPlan`: pure data, no process is started here.

One switch per site (name and datapath id from the plan), one host per compute site (IP/8 and MAC
from the plan), the host on switch port 1 and every inter-switch link on the ports the plan gives,
so Mininet names the interfaces ``s{i}-eth{port}`` and the controller's port numbers hold without
discovery. Switch-to-switch links carry the shaping parameters of Mininet's `TCIntf` (``bw`` in
Mbit/s = the plan's emulated rate, htb; ``delay`` only when the kernel has netem); host links are
not shaped. With ``checksum_offload=False`` every link turns tx/rx checksum offload off, which the
userspace datapath needs for TCP (what Mininet's `TCULink` does).

This module must not start, configure or probe anything: `orchestrator.emulation.network` does that.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mininet.topo import Topo

from topologies.plan import HOST_PORT, EmulationPlan, HostPlan

#: Extra ``addHost`` parameters: the same for every host, or computed per host from its plan.
HostParams = Mapping[str, Any] | Callable[[HostPlan], Mapping[str, Any]]

#: Port number of the host's single interface (``h{i}-eth0``).
HOST_INTF_PORT = 0


def switch_link_params(
    emulated_mbps: float, delay_ms: float, *, delay_emulated: bool, checksum_offload: bool
) -> dict[str, Any]:
    """Mininet `TCIntf` parameters of one inter-switch link (both ends get the same)."""
    params: dict[str, Any] = {"bw": float(emulated_mbps)}
    if delay_emulated and delay_ms > 0:
        params["delay"] = f"{delay_ms:.3f}ms"
    if not checksum_offload:
        params.update(txo=False, rxo=False)
    return params


def host_link_params(*, checksum_offload: bool) -> dict[str, Any]:
    """Mininet `TCIntf` parameters of a host link (unshaped)."""
    return {} if checksum_offload else {"txo": False, "rxo": False}


class PlanTopo(Topo):
    """The Mininet topology of an `EmulationPlan` (see the module docstring).

    Parameters (passed to the constructor, which calls `build`)
    ----------
    plan
        The emulation plan.
    delay_emulated
        Add each link's propagation delay with netem (only where the kernel has it).
    checksum_offload
        Leave tx/rx checksum offload on (kernel datapath); False for the userspace datapath.
    host_params
        Extra parameters for every host's class (e.g. a container image), or a function of the
        host's `HostPlan` returning them. They cannot override ``ip`` and ``mac``.
    """

    def build(
        self,
        plan: EmulationPlan,
        *,
        delay_emulated: bool = False,
        checksum_offload: bool = True,
        host_params: HostParams | None = None,
    ) -> None:
        self.plan = plan
        self.delay_emulated = delay_emulated
        for sw in plan.switches:
            self.addSwitch(sw.name, dpid=f"{sw.dpid:016x}")
        for h in plan.hosts:
            extra = dict(host_params(h) if callable(host_params) else (host_params or {}))
            clash = {"ip", "mac"} & set(extra)
            if clash:
                raise ValueError(f"host_params must not set {sorted(clash)}: the plan decides them")
            self.addHost(h.name, ip=f"{h.ip}/8", mac=h.mac, **extra)
            self.addLink(
                h.name, h.switch, port1=HOST_INTF_PORT, port2=HOST_PORT,
                **host_link_params(checksum_offload=checksum_offload),
            )
        for ln in plan.links:
            self.addLink(
                plan.switch(ln.a).name,
                plan.switch(ln.b).name,
                port1=ln.port_a,
                port2=ln.port_b,
                **switch_link_params(
                    ln.emulated_mbps, ln.delay_ms, delay_emulated=delay_emulated, checksum_offload=checksum_offload
                ),
            )


def switch_interfaces(plan: EmulationPlan) -> list[str]:
    """Names of the root-namespace interfaces a running emulation of `plan` has (switch ports)."""
    names = [f"{h.switch}-eth{HOST_PORT}" for h in plan.hosts]
    for ln in plan.links:
        names.append(f"{plan.switch(ln.a).name}-eth{ln.port_a}")
        names.append(f"{plan.switch(ln.b).name}-eth{ln.port_b}")
    return names
