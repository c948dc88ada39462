"""`NetworkModel`: a validated, undirected networkx graph of sites and optical-like links.

Every link is full duplex: its capacity applies in each direction separately. A link has
`wavelengths` channels of `wavelength_mbps` each, so `capacity_mbps = wavelengths * wavelength_mbps`,
and a propagation delay `delay_ms` of about 5 us per km of fiber unless given.

The model does not know about Mininet, the controller or reservations; those live elsewhere.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import networkx as nx

from topologies.errors import TopologyError

#: Propagation delay in fiber, ms per km (light at about 2/3 c: 5 us/km).
FIBER_DELAY_MS_PER_KM = 0.005

SITE_KEYS = frozenset({"name", "has_compute", "cpu", "memory_mb", "lon", "lat"})
LINK_KEYS = frozenset(
    {"a", "b", "capacity_mbps", "length_km", "delay_ms", "wavelengths", "wavelength_mbps"}
)
DEFAULT_WAVELENGTHS = 8
DEFAULT_WAVELENGTH_MBPS = 10_000.0
DEFAULT_LENGTH_KM = 100.0
DEFAULT_CPU = 1.0
DEFAULT_MEMORY_MB = 1024
#: Mean Earth radius (IUGG), km: the sphere of `great_circle_km`.
EARTH_RADIUS_KM = 6371.0088


def great_circle_km(lon_a: float, lat_a: float, lon_b: float, lat_b: float) -> float:
    """Great-circle distance in km between two points given in degrees (haversine formula on a
    sphere of `EARTH_RADIUS_KM`; within 0.5% of the ellipsoid's distance)."""
    phi_a, phi_b = math.radians(lat_a), math.radians(lat_b)
    h = (math.sin((phi_b - phi_a) / 2) ** 2
         + math.cos(phi_a) * math.cos(phi_b) * math.sin(math.radians(lon_b - lon_a) / 2) ** 2)
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


@dataclass(frozen=True)
class Site:
    """A network node: a switching site, optionally with a compute server."""

    name: str
    has_compute: bool = True
    #: Compute: the number of emulated cores, each of the experiment's ``compute.core_gflops``
    #: (host-independent: a round's modelled training lasts its cost / min(threads, cpu),
    #: `workers.compute`); the Docker backend also limits the site's container to this many host cores.
    cpu: float = DEFAULT_CPU
    memory_mb: int = DEFAULT_MEMORY_MB
    #: Geographic position in degrees, where the topology gives one. Distances come from the links'
    #: lengths; a loader derives a length from the two ends' positions when the file gives none.
    lon: float | None = None
    lat: float | None = None


@dataclass(frozen=True)
class Link:
    """An undirected optical-like link between sites `a` and `b` (full duplex)."""

    a: str
    b: str
    wavelengths: int
    wavelength_mbps: float
    length_km: float
    delay_ms: float

    @property
    def capacity_mbps(self) -> float:
        """Capacity in each direction, Mbit/s."""
        return self.wavelengths * self.wavelength_mbps

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["capacity_mbps"] = self.capacity_mbps
        return d


def _positive_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TopologyError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise TopologyError(f"{what} must be positive, got {value!r}")
    return float(value)


def _nonnegative_number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TopologyError(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0:
        raise TopologyError(f"{what} must not be negative, got {value!r}")
    return float(value)


def make_site(spec: Mapping[str, Any], *, where: str = "site") -> Site:
    """Build a `Site` from a mapping, rejecting unknown keys and bad values."""
    unknown = set(spec) - SITE_KEYS
    if unknown:
        raise TopologyError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(SITE_KEYS)}")
    name = spec.get("name")
    if not isinstance(name, str) or not name:
        raise TopologyError(f"{where}: 'name' must be a non-empty string, got {name!r}")
    has_compute = spec.get("has_compute", True)
    if not isinstance(has_compute, bool):
        raise TopologyError(f"site {name!r}: has_compute must be true or false, got {has_compute!r}")
    cpu = _positive_number(spec.get("cpu", DEFAULT_CPU), f"site {name!r}: cpu")
    memory = spec.get("memory_mb", DEFAULT_MEMORY_MB)
    if isinstance(memory, bool) or not isinstance(memory, int) or memory <= 0:
        raise TopologyError(f"site {name!r}: memory_mb must be a positive integer, got {memory!r}")
    position = {}
    for key, bound in (("lon", 180.0), ("lat", 90.0)):
        value = spec.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not -bound <= value <= bound:
            raise TopologyError(f"site {name!r}: {key} must be a number in [-{bound:g}, {bound:g}], got {value!r}")
        position[key] = float(value)
    return Site(name=name, has_compute=has_compute, cpu=cpu, memory_mb=memory, **position)


def make_link(spec: Mapping[str, Any], *, where: str = "link") -> Link:
    """Build a `Link` from a mapping, rejecting unknown keys and bad values.

    `capacity_mbps` may be given instead of `wavelength_mbps`; it is split evenly over the
    wavelengths. `delay_ms` defaults to the fiber delay of `length_km`.
    """
    unknown = set(spec) - LINK_KEYS
    if unknown:
        raise TopologyError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(LINK_KEYS)}")
    a, b = spec.get("a"), spec.get("b")
    if not isinstance(a, str) or not isinstance(b, str) or not a or not b:
        raise TopologyError(f"{where}: 'a' and 'b' must name two sites, got {a!r} and {b!r}")
    if a == b:
        raise TopologyError(f"link {a}-{b}: a link must join two different sites")
    label = f"link {a}-{b}"
    wl = spec.get("wavelengths", DEFAULT_WAVELENGTHS)
    if isinstance(wl, bool) or not isinstance(wl, int) or wl <= 0:
        raise TopologyError(f"{label}: wavelengths must be a positive integer, got {wl!r}")
    if "capacity_mbps" in spec and "wavelength_mbps" in spec:
        cap = _positive_number(spec["capacity_mbps"], f"{label}: capacity_mbps")
        per = _positive_number(spec["wavelength_mbps"], f"{label}: wavelength_mbps")
        if not math.isclose(cap, per * wl, rel_tol=1e-9):
            raise TopologyError(
                f"{label}: capacity_mbps {cap} != wavelengths {wl} x wavelength_mbps {per}"
            )
    elif "capacity_mbps" in spec:
        per = _positive_number(spec["capacity_mbps"], f"{label}: capacity_mbps") / wl
    else:
        per = _positive_number(
            spec.get("wavelength_mbps", DEFAULT_WAVELENGTH_MBPS), f"{label}: wavelength_mbps"
        )
    length = _positive_number(spec.get("length_km", DEFAULT_LENGTH_KM), f"{label}: length_km")
    if "delay_ms" in spec:
        delay = _nonnegative_number(spec["delay_ms"], f"{label}: delay_ms")
    else:
        delay = length * FIBER_DELAY_MS_PER_KM
    return Link(a=a, b=b, wavelengths=wl, wavelength_mbps=per, length_km=length, delay_ms=delay)


@dataclass
class NetworkModel:
    """A validated network: sites joined by full-duplex optical-like links.

    Build one with `NetworkModel.build(name, sites, links)` or a loader in
    `topologies.loaders`; the constructor validates. The underlying graph is available as
    `graph` (node attributes: those of `Site`; edge attributes: those of `Link` plus
    `capacity_mbps`), and must not be mutated.

    Raises
    ------
    TopologyError
        On duplicate sites or links, links to unknown sites, or a disconnected graph.
    """

    name: str
    sites: dict[str, Site]
    links: dict[frozenset[str], Link]
    graph: nx.Graph = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.sites:
            raise TopologyError(f"topology {self.name!r}: it has no sites")
        g: nx.Graph = nx.Graph(name=self.name)
        for site in self.sites.values():
            g.add_node(site.name, **asdict(site))
        for link in self.links.values():
            for end in (link.a, link.b):
                if end not in self.sites:
                    raise TopologyError(f"link {link.a}-{link.b}: unknown site {end!r}")
            g.add_edge(link.a, link.b, **link.as_dict())
        if not nx.is_connected(g):
            parts = sorted((sorted(c) for c in nx.connected_components(g)), key=len)
            raise TopologyError(
                f"topology {self.name!r} is disconnected: {len(parts)} parts, e.g. {parts[0][:5]}"
            )
        self.graph = g

    @classmethod
    def build(
        cls,
        name: str,
        sites: Iterable[Site | Mapping[str, Any]],
        links: Iterable[Link | Mapping[str, Any]],
    ) -> NetworkModel:
        """Validate and build a model from sites and links (objects or mappings)."""
        site_map: dict[str, Site] = {}
        for i, s in enumerate(sites):
            site = s if isinstance(s, Site) else make_site(s, where=f"site #{i + 1}")
            if site.name in site_map:
                raise TopologyError(f"duplicate site {site.name!r}")
            site_map[site.name] = site
        link_map: dict[frozenset[str], Link] = {}
        for i, spec in enumerate(links):
            link = spec if isinstance(spec, Link) else make_link(spec, where=f"link #{i + 1}")
            key = frozenset((link.a, link.b))
            if key in link_map:
                raise TopologyError(f"duplicate link {link.a}-{link.b}")
            link_map[key] = link
        return cls(name=name, sites=site_map, links=link_map)

    # -- queries -------------------------------------------------------------------------------
    def site(self, name: str) -> Site:
        try:
            return self.sites[name]
        except KeyError:
            raise TopologyError(f"topology {self.name!r} has no site {name!r}") from None

    def link(self, a: str, b: str) -> Link:
        try:
            return self.links[frozenset((a, b))]
        except KeyError:
            raise TopologyError(f"topology {self.name!r} has no link {a}-{b}") from None

    def has_link(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self.links

    @property
    def site_names(self) -> list[str]:
        """Site names in a stable order (the order they were given)."""
        return list(self.sites)

    @property
    def compute_sites(self) -> list[str]:
        return [s.name for s in self.sites.values() if s.has_compute]

    def iter_links(self) -> Iterator[Link]:
        return iter(self.links.values())

    def neighbors(self, site: str) -> list[str]:
        return list(self.graph.neighbors(site))

    def path_delay_ms(self, path: Iterable[str]) -> float:
        nodes = list(path)
        return sum(self.link(u, v).delay_ms for u, v in itertools.pairwise(nodes))

    def to_dict(self) -> dict[str, Any]:
        """The project's YAML/JSON form (round-trips through `topologies.loaders.from_dict`)."""
        return {
            "name": self.name,
            "sites": [asdict(s) for s in self.sites.values()],
            "links": [
                {
                    "a": ln.a,
                    "b": ln.b,
                    "wavelengths": ln.wavelengths,
                    "wavelength_mbps": ln.wavelength_mbps,
                    "length_km": ln.length_km,
                    "delay_ms": ln.delay_ms,
                }
                for ln in self.links.values()
            ],
        }

    def summary(self) -> dict[str, Any]:
        caps = [ln.capacity_mbps for ln in self.links.values()]
        lengths = [ln.length_km for ln in self.links.values()]
        return {
            "name": self.name,
            "sites": len(self.sites),
            "compute_sites": len(self.compute_sites),
            "links": len(self.links),
            "capacity_mbps": [min(caps), max(caps)] if caps else [],
            "length_km": [min(lengths), max(lengths)] if lengths else [],
            "diameter_hops": nx.diameter(self.graph) if len(self.sites) > 1 else 0,
        }
