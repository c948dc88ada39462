"""`NetworkState`: what the schedulers see of the network, and the reservation ledger.

Reservations are kept per directed link and per wavelength (Mbit/s), so that first-fit
wavelength assignment with wavelength continuity can be checked. Background load (measured by
the controller, or configured) reduces a link's residual capacity without occupying a
particular wavelength.

`NetworkState` is mutated only through `admit` and `release`; schedulers read it and never
change it (they work on a `Ledger`, a cheap overlay of tentative reservations).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from orchestrator.errors import ConfigError
from orchestrator.scheduling.schedule import DirectedLink, OverlayEdge, Schedule
from topologies.model import NetworkModel

EPS = 1e-9


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

    # -- queries -------------------------------------------------------------------------------
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
        return schedule

    def set_background(self, loads: Mapping[DirectedLink, float]) -> None:
        """Replace the background load (Mbit/s per directed link)."""
        for u, v in loads:
            self.model.link(u, v)
        self.background_mbps = {k: max(0.0, float(x)) for k, x in loads.items()}

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
