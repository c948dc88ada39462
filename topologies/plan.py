"""`EmulationPlan`: how a `NetworkModel` maps onto an emulated network, as pure data.

One OpenFlow switch per site, one host per compute site, explicit port numbers so that the
Mininet topology and the controller agree on them without asking the switches:

- switch of site i (0-based, model order): name ``s{i+1}``, datapath id ``i+1``;
- host of a compute site: name ``h{i+1}``, an IP in 10.0.0.0/8 whose low 24 bits are i+1
  (`host_ip`), a MAC likewise (`host_mac`);
- on every switch, port 1 goes to the site's host (when it has one), ports 2.. go to the
  neighbouring sites' switches in the model's neighbour order.

Link rates are scaled by `bw_scale` into what the machine can emulate (at most `max_emulated_mbps`);
the scale is recorded so that figures can be converted back.

The plan is JSON-serialisable (`to_dict`/`from_dict`): the orchestrator hands it to the
controller, which must not recompute it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from topologies.errors import TopologyError

if TYPE_CHECKING:  # the controller reads plans without the model (nor networkx, which it imports)
    from topologies.model import NetworkModel

HOST_PORT = 1
MAX_EMULATED_MBPS = 1000.0
DEFAULT_MAX_LINK_MBPS = 100.0
IP_PREFIX_LEN = 8


def host_ip(index: int) -> str:
    """IPv4 address of the host of the site with 0-based model index `index` (10.0.0.0/8)."""
    n = index + 1
    return f"10.{(n >> 16) & 0xFF}.{(n >> 8) & 0xFF}.{n & 0xFF}"


def host_mac(index: int) -> str:
    n = index + 1
    return f"00:00:00:{(n >> 16) & 0xFF:02x}:{(n >> 8) & 0xFF:02x}:{n & 0xFF:02x}"


@dataclass(frozen=True)
class SwitchPlan:
    site: str
    name: str
    dpid: int


@dataclass(frozen=True)
class HostPlan:
    site: str
    name: str
    ip: str
    mac: str
    switch: str
    cpu: float
    memory_mb: int


@dataclass(frozen=True)
class LinkPlan:
    a: str  # site
    b: str  # site
    port_a: int  # port on a's switch
    port_b: int  # port on b's switch
    capacity_mbps: float  # the model's capacity, per direction
    emulated_mbps: float  # the rate tc shapes to, per direction
    delay_ms: float  # the model's propagation delay (times the plan's time dilation)


@dataclass(frozen=True)
class EmulationPlan:
    """Names, addresses, ports and shaped rates of an emulated `NetworkModel`."""

    topology: str
    bw_scale: float
    switches: tuple[SwitchPlan, ...]
    hosts: tuple[HostPlan, ...]
    links: tuple[LinkPlan, ...]
    #: Time dilation K: the links run K times slower and their delays last K times as long
    #: (`dilated`); 1 when the emulation runs in real time.
    time_dilation: float = 1.0

    def dilated(self, k: float) -> EmulationPlan:
        """This plan with time dilated by `k` (>= 1): every rate (and `bw_scale`) divided by it, every
        link's delay multiplied by it.

        Raises
        ------
        TopologyError
            If `k` is below 1.
        """
        if not k >= 1:
            raise TopologyError(f"time dilation must be >= 1, got {k}")
        links = tuple(replace(ln, emulated_mbps=ln.emulated_mbps / k, delay_ms=ln.delay_ms * k) for ln in self.links)
        return replace(self, bw_scale=self.bw_scale / k, links=links, time_dilation=self.time_dilation * k)

    @classmethod
    def from_model(
        cls,
        model: NetworkModel,
        *,
        bw_scale: float | None = None,
        max_link_mbps: float = DEFAULT_MAX_LINK_MBPS,
    ) -> EmulationPlan:
        """Plan the emulation of `model`.

        Parameters
        ----------
        bw_scale
            Emulated rate / model capacity. Default: the largest link is emulated at
            `max_link_mbps`.
        max_link_mbps
            Used only when `bw_scale` is None.

        Raises
        ------
        TopologyError
            If a scaled rate would exceed `MAX_EMULATED_MBPS` or be non-positive.
        """
        bw_scale = _checked_bw_scale(model, bw_scale, max_link_mbps)
        index = {s: i for i, s in enumerate(model.site_names)}
        switches = tuple(SwitchPlan(site=s, name=f"s{i + 1}", dpid=i + 1) for s, i in index.items())
        hosts = tuple(
            HostPlan(
                site=s,
                name=f"h{i + 1}",
                ip=host_ip(i),
                mac=host_mac(i),
                switch=f"s{i + 1}",
                cpu=model.sites[s].cpu,
                memory_mb=model.sites[s].memory_mb,
            )
            for s, i in index.items()
            if model.sites[s].has_compute
        )
        next_port = {s: HOST_PORT + 1 for s in index}
        links = []
        for ln in model.iter_links():
            pa, pb = next_port[ln.a], next_port[ln.b]
            next_port[ln.a] += 1
            next_port[ln.b] += 1
            links.append(
                LinkPlan(
                    a=ln.a,
                    b=ln.b,
                    port_a=pa,
                    port_b=pb,
                    capacity_mbps=ln.capacity_mbps,
                    emulated_mbps=ln.capacity_mbps * bw_scale,
                    delay_ms=ln.delay_ms,
                )
            )
        return cls(
            topology=model.name, bw_scale=bw_scale, switches=switches, hosts=hosts, links=tuple(links)
        )

    # -- lookups ---------------------------------------------------------------------------------
    def switch(self, site: str) -> SwitchPlan:
        for sw in self.switches:
            if sw.site == site:
                return sw
        raise TopologyError(f"no switch for site {site!r}")

    def host(self, site: str) -> HostPlan:
        for h in self.hosts:
            if h.site == site:
                return h
        raise TopologyError(f"site {site!r} has no compute host")

    def port_towards(self, site: str, neighbor: str) -> int:
        """Port on `site`'s switch that leads to `neighbor`'s switch."""
        for ln in self.links:
            if ln.a == site and ln.b == neighbor:
                return ln.port_a
            if ln.b == site and ln.a == neighbor:
                return ln.port_b
        raise TopologyError(f"no link {site}-{neighbor}")

    def site_of_dpid(self, dpid: int) -> str:
        for sw in self.switches:
            if sw.dpid == dpid:
                return sw.site
        raise TopologyError(f"no switch with datapath id {dpid}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "topology": self.topology,
            "bw_scale": self.bw_scale,
            "switches": [asdict(s) for s in self.switches],
            "hosts": [asdict(h) for h in self.hosts],
            "links": [asdict(ln) for ln in self.links],
            "time_dilation": self.time_dilation,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EmulationPlan:
        try:
            return cls(
                topology=str(d["topology"]),
                bw_scale=float(d["bw_scale"]),
                switches=tuple(SwitchPlan(**s) for s in d["switches"]),
                hosts=tuple(HostPlan(**h) for h in d["hosts"]),
                links=tuple(LinkPlan(**ln) for ln in d["links"]),
                time_dilation=float(d.get("time_dilation", 1.0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise TopologyError(f"malformed emulation plan: {e}") from e


def _checked_bw_scale(model: NetworkModel, bw_scale: float | None, max_link_mbps: float) -> float:
    """`bw_scale`, or the one that emulates the largest link at `max_link_mbps`; a `TopologyError`
    if it is not positive or would emulate more than `MAX_EMULATED_MBPS` (`EmulationPlan.from_model`)."""
    max_cap = max(ln.capacity_mbps for ln in model.iter_links()) if model.links else 1.0
    if bw_scale is None:
        if not 0 < max_link_mbps <= MAX_EMULATED_MBPS:
            raise TopologyError(
                f"max_link_mbps must be in (0, {MAX_EMULATED_MBPS:g}], got {max_link_mbps}"
            )
        bw_scale = max_link_mbps / max_cap
    if bw_scale <= 0:
        raise TopologyError(f"bw_scale must be positive, got {bw_scale}")
    if max_cap * bw_scale > MAX_EMULATED_MBPS * (1 + 1e-9):
        raise TopologyError(
            f"bw_scale {bw_scale:g} emulates {max_cap * bw_scale:g} Mbit/s on the largest link; "
            f"at most {MAX_EMULATED_MBPS:g} Mbit/s can be emulated"
        )
    return bw_scale
