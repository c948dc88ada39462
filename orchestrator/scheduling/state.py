"""`NetworkState`: what the schedulers see of the network, and the reservation ledger.

Reservations are kept per directed link and per wavelength (Mbit/s), so that first-fit
wavelength assignment with wavelength continuity can be checked. Background load (measured by
the controller, or configured) reduces a link's residual capacity without occupying a
particular wavelength.

Compute is kept per site, in CPU cores (a site has `Site.cpu` of them): an admitted task loads
the sites of its roles with `compute_demand(schedule)` (a training local `TRAIN_CPU`, an
aggregating node `AGGREGATE_CPU`), and `background_cpu` is load not scheduled by us. Unlike
bandwidth, compute is not a hard limit: a site asked for more than it has shares it out, and the
roles on it slow down (`cpu_share`); schedulers that care (``joint``) weigh that.

`NetworkState` is mutated only through `admit`, `release`, `set_background` and
`set_background_cpu`; schedulers read it and never change it (they work on a `Ledger`, a cheap
overlay of tentative reservations).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orchestrator.errors import ConfigError
from orchestrator.scheduling.schedule import DirectedLink, OverlayEdge, Schedule
from topologies.model import NetworkModel

EPS = 1e-9
#: CPU cores a local role uses while it trains (its agent runs torch on one thread).
TRAIN_CPU = 1.0
#: CPU cores an aggregating role (G, a relay, a local with upload children) uses on average over a
#: round for combining its children's updates: it works only while chunks arrive.
AGGREGATE_CPU = 0.25


def compute_demand(schedule: Schedule) -> dict[str, float]:
    """CPU cores per site that `schedule`'s roles use: `TRAIN_CPU` at every local, plus
    `AGGREGATE_CPU` at every site that aggregates (G, relays, locals with upload children).
    A blocked schedule uses nothing."""
    if schedule.blocked:
        return {}
    demand: dict[str, float] = dict.fromkeys(schedule.local_sites, TRAIN_CPU)
    for site in schedule.aggregation_sites:
        demand[site] = demand.get(site, 0.0) + AGGREGATE_CPU
    return demand


@dataclass
class NetworkState:
    """Reservations of admitted tasks and background load on a `NetworkModel`.

    Attributes
    ----------
    model
        The network.
    background_mbps
        Load not scheduled by us (e.g. measured from port statistics), per directed link.
    """

    model: NetworkModel
    background_mbps: dict[DirectedLink, float] = field(default_factory=dict)
    _wl_used: dict[tuple[str, str, int], float] = field(default_factory=dict, repr=False)
    _ai_mbps: dict[DirectedLink, float] = field(default_factory=dict, repr=False)
    schedules: dict[int, Schedule] = field(default_factory=dict, repr=False)
    #: CPU cores used at a site by what we did not schedule (measured, or configured).
    background_cpu: dict[str, float] = field(default_factory=dict)
    _cpu: dict[str, float] = field(default_factory=dict, repr=False)

    # -- queries -------------------------------------------------------------------------------
    def cpu_capacity(self, site: str) -> float:
        """CPU cores of `site` (0 for a site without compute)."""
        s = self.model.site(site)
        return s.cpu if s.has_compute else 0.0

    def ai_cpu(self, site: str) -> float:
        """CPU cores the admitted tasks' roles use at `site`."""
        return self._cpu.get(site, 0.0)

    def cpu_used(self, site: str) -> float:
        return self.ai_cpu(site) + self.background_cpu.get(site, 0.0)

    def cpu_load(self, site: str) -> float:
        """Used / available CPU at `site` (above 1: oversubscribed; inf for a loaded site without compute)."""
        cap, used = self.cpu_capacity(site), self.cpu_used(site)
        if cap <= 0:
            return float("inf") if used > 0 else 0.0
        return used / cap

    def cpu_share(self, site: str, extra_cpu: float = 0.0) -> float:
        """The fraction of its demand a role at `site` gets when `extra_cpu` more cores are asked
        for there on top of what is used: 1 while the site has enough, else capacity / demand
        (the cores shared out in proportion)."""
        cap, want = self.cpu_capacity(site), self.cpu_used(site) + extra_cpu
        if want <= cap + EPS:
            return 1.0
        return cap / want

    def capacity_mbps(self, u: str, v: str) -> float:
        return self.model.link(u, v).capacity_mbps

    def ai_mbps(self, u: str, v: str) -> float:
        """Mbit/s reserved by admitted AI tasks on directed link u->v."""
        return self._ai_mbps.get((u, v), 0.0)

    def used_mbps(self, u: str, v: str) -> float:
        return self.ai_mbps(u, v) + self.background_mbps.get((u, v), 0.0)

    def residual_mbps(self, u: str, v: str) -> float:
        return self.capacity_mbps(u, v) - self.used_mbps(u, v)

    def wavelength_used_mbps(self, u: str, v: str, w: int) -> float:
        return self._wl_used.get((u, v, w), 0.0)

    def utilisation(self, u: str, v: str) -> float:
        return self.used_mbps(u, v) / self.capacity_mbps(u, v)

    # -- changes ---------------------------------------------------------------------------------
    def admit(self, schedule: Schedule) -> None:
        """Record the reservations of an admitted (not blocked) schedule.

        Raises
        ------
        ConfigError
            If the schedule is blocked, its task is already admitted, or it does not fit.
        """
        if schedule.blocked:
            raise ConfigError(f"task {schedule.task_id} was blocked: nothing to admit")
        if schedule.task_id in self.schedules:
            raise ConfigError(f"task {schedule.task_id} is already admitted")
        ledger = Ledger(self)
        for edge in schedule.edges:
            if edge.wavelength is None:
                raise ConfigError(f"task {schedule.task_id}: edge {edge.src}->{edge.dst} has no wavelength")
            if not ledger.fits(edge.links(), edge.wavelength, schedule.demand_mbps):
                raise ConfigError(f"task {schedule.task_id}: edge {edge.src}->{edge.dst} does not fit")
            ledger.reserve(edge.links(), edge.wavelength, schedule.demand_mbps)
        ledger.commit()
        self.schedules[schedule.task_id] = schedule
        for site, cpu in compute_demand(schedule).items():
            self._cpu[site] = self._cpu.get(site, 0.0) + cpu

    def release(self, task_id: int) -> Schedule:
        """Remove a task's reservations; returns its schedule. Raises KeyError if unknown."""
        schedule = self.schedules.pop(task_id)
        for edge in schedule.edges:
            assert edge.wavelength is not None
            for u, v in edge.links():
                key = (u, v, edge.wavelength)
                self._wl_used[key] = self._wl_used.get(key, 0.0) - schedule.demand_mbps
                if self._wl_used[key] <= EPS:
                    del self._wl_used[key]
                self._ai_mbps[(u, v)] = self._ai_mbps.get((u, v), 0.0) - schedule.demand_mbps
                if self._ai_mbps[(u, v)] <= EPS:
                    del self._ai_mbps[(u, v)]
        for site, cpu in compute_demand(schedule).items():
            self._cpu[site] = self._cpu.get(site, 0.0) - cpu
            if self._cpu[site] <= EPS:
                del self._cpu[site]
        return schedule

    def set_background(self, loads: Mapping[DirectedLink, float]) -> None:
        """Replace the background load (Mbit/s per directed link)."""
        for u, v in loads:
            self.model.link(u, v)
        self.background_mbps = {k: max(0.0, float(x)) for k, x in loads.items()}

    def set_background_cpu(self, loads: Mapping[str, float]) -> None:
        """Replace the background CPU load (cores per site).

        Raises
        ------
        ConfigError
            On an unknown site or a negative or non-finite load.
        """
        for site, cpu in loads.items():
            if site not in self.model.sites:
                raise ConfigError(f"background CPU load on unknown site {site!r}")
            if isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not math.isfinite(cpu) or cpu < 0:
                raise ConfigError(f"background CPU load of site {site!r} must be a number >= 0, got {cpu!r}")
        self.background_cpu = {k: float(x) for k, x in loads.items() if x > 0}

    def without_links(self, down: Iterable[tuple[str, str]], *, around: str | None = None) -> NetworkState:
        """What a scheduler sees while links `down` (site pairs, either order) are cut: a copy on the
        network without them, holding the same reservations and background on the other links.
        If the cut splits the network, the copy is the part that holds site `around` (a task's G;
        a task with a site elsewhere then cannot be placed). Admit the schedule it gives into this
        state (the full network), not into the copy.

        Raises
        ------
        ConfigError
            The cut splits the network and `around` is not given.
        """
        import networkx as nx

        cut = {frozenset(link) for link in down}
        if not cut:
            return self
        links = {k: ln for k, ln in self.model.links.items() if k not in cut}
        g = nx.Graph()
        g.add_nodes_from(self.model.sites)
        g.add_edges_from(tuple(k) for k in links)
        part = set(self.model.sites)
        if not nx.is_connected(g):
            if around is None:
                raise ConfigError("the cut links split the network")
            part = set(nx.node_connected_component(g, around))
        model = NetworkModel(name=self.model.name, sites={n: x for n, x in self.model.sites.items() if n in part},
                             links={k: ln for k, ln in links.items() if k <= part})

        def keep(u: str, v: str) -> bool:
            return frozenset((u, v)) not in cut and u in part and v in part

        copy = NetworkState(model, background_mbps={k: x for k, x in self.background_mbps.items() if keep(*k)})
        copy._wl_used = {k: x for k, x in self._wl_used.items() if keep(k[0], k[1])}
        copy._ai_mbps = {k: x for k, x in self._ai_mbps.items() if keep(*k)}
        copy.schedules = dict(self.schedules)
        copy.background_cpu = {k: x for k, x in self.background_cpu.items() if k in part}
        copy._cpu = {k: x for k, x in self._cpu.items() if k in part}
        return copy


class Ledger:
    """Tentative reservations on top of a `NetworkState` (what a scheduler has taken so far)."""

    def __init__(self, state: NetworkState) -> None:
        self.state = state
        self._wl: dict[tuple[str, str, int], float] = {}
        self._total: dict[DirectedLink, float] = {}

    def residual_mbps(self, u: str, v: str) -> float:
        return self.state.residual_mbps(u, v) - self._total.get((u, v), 0.0)

    def wavelength_residual_mbps(self, u: str, v: str, w: int) -> float:
        link = self.state.model.link(u, v)
        if w >= link.wavelengths:
            return 0.0
        used = self.state.wavelength_used_mbps(u, v, w) + self._wl.get((u, v, w), 0.0)
        return link.wavelength_mbps - used

    def fits(self, links: Iterable[DirectedLink], w: int, demand_mbps: float) -> bool:
        return all(
            self.wavelength_residual_mbps(u, v, w) + EPS >= demand_mbps
            and self.residual_mbps(u, v) + EPS >= demand_mbps
            for u, v in links
        )

    def first_fit(self, links: list[DirectedLink], demand_mbps: float) -> int | None:
        """Lowest wavelength index free for `demand_mbps` on every link (continuity), or None."""
        if not links:
            return None
        max_w = min(self.state.model.link(u, v).wavelengths for u, v in links)
        for w in range(max_w):
            if self.fits(links, w, demand_mbps):
                return w
        return None

    def reserve(self, links: Iterable[DirectedLink], w: int, demand_mbps: float) -> None:
        for u, v in links:
            self._wl[(u, v, w)] = self._wl.get((u, v, w), 0.0) + demand_mbps
            self._total[(u, v)] = self._total.get((u, v), 0.0) + demand_mbps

    def reservations(self) -> dict[DirectedLink, float]:
        return dict(self._total)

    def commit(self) -> None:
        st = self.state
        for key, mbps in self._wl.items():
            st._wl_used[key] = st._wl_used.get(key, 0.0) + mbps
        for link, mbps in self._total.items():
            st._ai_mbps[link] = st._ai_mbps.get(link, 0.0) + mbps
        self._wl.clear()
        self._total.clear()


def assign_wavelengths(
    ledger: Ledger, edges: list[OverlayEdge], demand_mbps: float
) -> tuple[list[OverlayEdge], str]:
    """First-fit a wavelength to every edge in order, reserving on `ledger`.

    Returns the edges with wavelengths, and "" or the reason the first edge that did not fit
    could not be placed.
    """
    out: list[OverlayEdge] = []
    for e in edges:
        links = e.links()
        w = ledger.first_fit(links, demand_mbps)
        if w is None:
            return out, (
                f"no wavelength with {demand_mbps:g} Mbit/s free on every link of "
                f"{e.procedure} path {'-'.join(e.path)}"
            )
        ledger.reserve(links, w, demand_mbps)
        out.append(OverlayEdge(e.procedure, e.src, e.dst, e.path, w))
    return out, ""
