"""Load a `NetworkModel` from a name or a file.

`load(spec)` accepts:

- a TopoHub key such as ``sndlib/nobel-us`` (the 14-node NSFNET, the default topology) or
  ``topozoo/Abilene``: fiber lengths come from the data, capacities and wavelengths from defaults;
- a generator name: ``ring:N`` or ``spine-leaf:SPINES:LEAVES`` (see `topologies.generators`);
- a built-in data file name (``topologies/data/NAME.yaml``);
- a path to a file: the project's YAML (``.yaml``/``.yml``), NetworkX node-link JSON (``.json``)
  or GraphML (``.graphml``).

The project's YAML format (strict: unknown keys are rejected)::

    name: triangle
    defaults: {wavelengths: 8, wavelength_mbps: 10000}   # optional, applied to every link
    sites:
      - {name: A, has_compute: true, cpu: 1.0, memory_mb: 1024}
      - {name: B}
    links:
      - {a: A, b: B, length_km: 100}          # or capacity_mbps, delay_ms, wavelengths, ...

In node-link JSON and GraphML files (e.g. the Internet Topology Zoo's, as they come) the project's
keys (`has_compute`, `cpu`, `memory_mb` on nodes; `capacity_mbps`, `length_km`, `delay_ms`,
`wavelengths`, `wavelength_mbps` on links) are validated and win over anything else. Then:

- site names come from a node's ``name`` or ``label`` (else its id), made valid (no commas, control
  characters or surrounding blanks: site lists on the command line are comma-separated) and unique
  (a second "Chicago" becomes "Chicago 2");
- a link's length comes from ``dist`` (TopoHub), else from the great-circle (haversine) distance
  between its ends' ``Longitude``/``Latitude`` (or ``pos``), else the default 100 km;
- a link's capacity comes from ``LinkSpeedRaw`` (bit/s) or ``LinkSpeed`` x ``LinkSpeedUnits``,
  else from a rate read in ``LinkType`` or ``LinkLabel`` ("OC-192", "10 Gbps", "GigE", "STM-16",
  ...), else the default (`wavelengths` x `wavelength_mbps`);
- parallel links between two sites (a Zoo multigraph) become one link whose capacity is their sum,
  and a link from a site to itself is dropped;
- any other attribute (the Zoo's ``Country``, ``Internal``, ``Note``, custom ones) is ignored and
  counted, except one that looks like a misspelt project key (``capcity``), which is rejected so
  that a typo is never silently dropped.

`load_with_report` returns what was read and what was defaulted (`LoadReport`): counts, never one
line per link. `load` logs that report's summary once (logger ``topologies.loaders``, a warning)
when a file's lengths or capacities were defaulted.
"""

from __future__ import annotations

import difflib
import json
import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from topologies.errors import TopologyError
from topologies.model import (
    DEFAULT_LENGTH_KM,
    LINK_KEYS,
    SITE_KEYS,
    NetworkModel,
    great_circle_km,
)

log = logging.getLogger(__name__)

DEFAULT_TOPOLOGY = "sndlib/nobel-us"
DATA_DIR = Path(__file__).parent / "data"

#: Metadata keys of foreign formats that carry nothing the model uses.
FOREIGN_KEYS = frozenset(
    {
        "id", "label", "pos", "dist", "ecmp_fwd", "ecmp_bwd", "Latitude", "Longitude", "Country",
        "Internal", "type", "geocode_id", "geocode_country", "geocode_append", "hyperedge",
        "LinkLabel", "LinkType", "LinkSpeed", "LinkNote", "LinkSpeedUnits", "LinkSpeedRaw",
        "key", "source", "target", "weight",
    }
)
TOP_KEYS = frozenset({"name", "defaults", "sites", "links"})
DEFAULT_KEYS = LINK_KEYS - {"a", "b"}


def load(spec: str | Path = DEFAULT_TOPOLOGY, *, compute_sites: list[str] | None = None) -> NetworkModel:
    """Load a topology by TopoHub key, generator, built-in name or file path.

    When a file's link lengths or capacities had to be defaulted, one warning (logger
    ``topologies.loaders``) says how many; `load_with_report` gives the whole `LoadReport`.

    Parameters
    ----------
    spec
        See the module docstring.
    compute_sites
        If given, only these sites have compute (others become pure switching sites).

    Raises
    ------
    TopologyError
        With a one-line message on an unknown name, a malformed file or an invalid model.
    """
    model, report = load_with_report(spec, compute_sites=compute_sites)
    if report.from_file and report.defaulted():
        log.warning("%s", report.summary())
    return model


def load_with_report(
    spec: str | Path = DEFAULT_TOPOLOGY, *, compute_sites: list[str] | None = None
) -> tuple[NetworkModel, LoadReport]:
    """`load`, also returning what was read from the source and what was defaulted (no logging)."""
    report = LoadReport(source=str(spec))
    model = _load(spec, report)
    if compute_sites is not None:
        model = with_compute_sites(model, compute_sites)
    return model, report


def _load(spec: str | Path, report: LoadReport) -> NetworkModel:
    text = str(spec)
    path = Path(text)
    if path.suffix.lower() in {".yaml", ".yml", ".json", ".graphml"} or path.exists():
        report.from_file = True
        return load_file(path, report=report)
    if ":" in text:
        from topologies.generators import from_spec

        return from_spec(text)
    builtin = DATA_DIR / f"{text}.yaml"
    if builtin.exists():
        report.from_file = True
        return load_file(builtin, report=report)
    if "/" in text:
        return load_topohub(text, report=report)
    raise TopologyError(
        f"unknown topology {text!r}: give a TopoHub key (e.g. {DEFAULT_TOPOLOGY}), a generator "
        f"(ring:N, spine-leaf:S:L), a built-in name ({', '.join(builtin_names())}) or a file path"
    )


def builtin_names() -> list[str]:
    return sorted(p.stem for p in DATA_DIR.glob("*.yaml"))


@dataclass
class LoadReport:
    """What a loader read from a foreign file (GraphML, node-link JSON, TopoHub) and what it
    defaulted, as counts. The project's YAML leaves it empty: every value there is the user's.

    `length_from` counts links by where their length came from (``given``, ``dist``,
    ``coordinates``, ``default``); `capacity_from` likewise (``given``, ``LinkSpeed``,
    ``LinkType/LinkLabel``, ``default``).
    """

    source: str
    from_file: bool = False
    length_from: Counter[str] = field(default_factory=Counter)
    capacity_from: Counter[str] = field(default_factory=Counter)
    #: Site name -> the label or id it was made from, for names that had to change.
    renamed_sites: dict[str, str] = field(default_factory=dict)
    #: Sites without a usable position (their links' lengths fall back to `dist` or the default).
    sites_without_position: list[str] = field(default_factory=list)
    #: Ignored attributes of nodes and links: name -> how many carried it.
    ignored: Counter[str] = field(default_factory=Counter)
    merged_links: int = 0
    self_loops: int = 0

    def defaulted(self) -> bool:
        """Whether a link's length or capacity was defaulted."""
        return bool(self.length_from["default"] or self.capacity_from["default"])

    def summary(self) -> str:
        """One line: what was read, what was defaulted and what was ignored, in counts."""
        links = sum(self.length_from.values())
        parts = [f"{self.source}: {links} links"]
        if self.length_from:
            parts.append("length from " + _counts(self.length_from))
        if self.length_from["default"]:
            parts.append(f"{self.length_from['default']} lengths defaulted to {DEFAULT_LENGTH_KM:g} km "
                         f"({len(self.sites_without_position)} sites without coordinates"
                         + (f", e.g. {self.sites_without_position[0]!r}" if self.sites_without_position else "") + ")")
        if self.capacity_from:
            parts.append("capacity from " + _counts(self.capacity_from))
        if self.renamed_sites:
            parts.append(f"{len(self.renamed_sites)} site names made valid or unique")
        if self.merged_links:
            parts.append(f"{self.merged_links} parallel links merged")
        if self.self_loops:
            parts.append(f"{self.self_loops} links from a site to itself dropped")
        if self.ignored:
            parts.append(f"attributes ignored: {', '.join(sorted(self.ignored))}")
        return "; ".join(parts)


def _counts(c: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def load_file(path: Path, *, report: LoadReport | None = None) -> NetworkModel:
    """Load the project's YAML, node-link JSON or GraphML, by file suffix."""
    if not path.is_file():
        raise TopologyError(f"{path}: no such topology file")
    suffix = path.suffix.lower()
    try:
        if suffix in {".yaml", ".yml"}:
            with path.open() as f:
                data = yaml.safe_load(f)
            return from_dict(data, where=str(path))
        if suffix == ".json":
            with path.open() as f:
                data = json.load(f)
            return from_node_link(data, name=path.stem, where=str(path), report=report)
        if suffix == ".graphml":
            g = nx.read_graphml(path)
            return from_graph(g, name=path.stem, where=str(path), report=report)
    except (yaml.YAMLError, json.JSONDecodeError, UnicodeDecodeError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TopologyError(f"{path}: malformed file: {first}") from e
    except Exception as e:
        if isinstance(e, TopologyError):
            raise
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TopologyError(f"{path}: malformed file: {first}") from e
    raise TopologyError(f"{path}: unknown topology file type {suffix!r} (use .yaml, .json or .graphml)")


def from_dict(data: Any, *, where: str = "topology") -> NetworkModel:
    """Build a model from the project's own format (a parsed YAML/JSON mapping)."""
    if not isinstance(data, Mapping):
        raise TopologyError(f"{where}: expected a mapping with 'sites' and 'links'")
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise TopologyError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(TOP_KEYS)}")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, Mapping) or set(defaults) - DEFAULT_KEYS:
        bad = sorted(set(defaults) - DEFAULT_KEYS) if isinstance(defaults, Mapping) else defaults
        raise TopologyError(f"{where}: bad 'defaults' {bad!r}; allowed keys: {sorted(DEFAULT_KEYS)}")
    sites, links = data.get("sites"), data.get("links")
    if not isinstance(sites, list) or not isinstance(links, list):
        raise TopologyError(f"{where}: 'sites' and 'links' must be lists")
    for s in sites:
        if not isinstance(s, Mapping):
            raise TopologyError(f"{where}: every site must be a mapping, got {s!r}")
    for ln in links:
        if not isinstance(ln, Mapping):
            raise TopologyError(f"{where}: every link must be a mapping, got {ln!r}")
    name = data.get("name", Path(where).stem)
    try:
        return NetworkModel.build(str(name), sites, [{**defaults, **ln} for ln in links])
    except TopologyError as e:
        raise TopologyError(f"{where}: {e}") from None


#: Rates of named interfaces (Mbit/s) that Zoo files give as a link's type or label.
_NAMED_RATES_MBPS: tuple[tuple[re.Pattern[str], float], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE), mbps)
    for pattern, mbps in (
        (r"\b(?:100\s*G(?:ig(?:abit)?)?\s*E|100\s*GbE)\b", 100_000.0),
        (r"\b(?:40\s*G(?:ig(?:abit)?)?\s*E|40\s*GbE)\b", 40_000.0),
        (r"\b(?:10\s*G(?:ig(?:abit)?)?\s*E|10\s*GbE|10\s*Gigabit\s+Ethernet)\b", 10_000.0),
        (r"\b(?:G(?:ig)?E|GbE|Gigabit(?:\s+Ethernet)?|1\s*GbE)\b", 1_000.0),
        (r"\bFast\s*Ethernet\b|\bFE\b", 100.0),
        (r"\b(?:T3|DS-?3)\b", 44.736),
        (r"\b(?:E3)\b", 34.368),
        (r"\b(?:T1|DS-?1)\b", 1.544),
        (r"\b(?:E1)\b", 2.048),
    )
)
_SONET = re.compile(r"\b(OC|STM)\s*-?\s*(\d+)", re.IGNORECASE)
_RATE = re.compile(r"(\d+(?:[.,]\d+)?)\s*([kKmMgGtT])(?:bit|b)?(?:ps|/s|its/s)?\b")
_UNIT_MBPS = {"k": 1e-3, "m": 1.0, "g": 1e3, "t": 1e6}


def rate_from_text(text: Any) -> float | None:
    """A link rate in Mbit/s read from a Zoo ``LinkType`` or ``LinkLabel`` ("OC-192",
    "STM-16", "10 Gbps", "2.5G", "GigE", "T3", ...), or None when it names none.

    Where a text gives several rates (e.g. "2 x 10G"), the largest is taken.
    """
    if not isinstance(text, str) or not text.strip():
        return None
    found: list[float] = []
    for kind, n in _SONET.findall(text):
        found.append(int(n) * (51.84 if kind.upper() == "OC" else 155.52))
    for value, unit in _RATE.findall(text):
        found.append(float(value.replace(",", ".")) * _UNIT_MBPS[unit.lower()])
    if not found:
        for pattern, mbps in _NAMED_RATES_MBPS:
            if pattern.search(text):
                found.append(mbps)
                break
    positive = [x for x in found if x > 0]
    return max(positive) if positive else None


def rate_from_speed(attrs: Mapping[str, Any]) -> float | None:
    """A link rate in Mbit/s from a Zoo link's ``LinkSpeedRaw`` (bit/s) or ``LinkSpeed`` and
    ``LinkSpeedUnits`` (k, M, G, T; M when absent), or None."""
    raw = attrs.get("LinkSpeedRaw")
    try:
        if raw is not None and float(raw) > 0:
            return float(raw) / 1e6
    except (TypeError, ValueError):
        pass
    speed = attrs.get("LinkSpeed")
    try:
        value = float(str(speed).replace(",", ".")) if speed is not None else 0.0
    except ValueError:
        return rate_from_text(str(speed))
    if not value > 0:
        return None
    unit = str(attrs.get("LinkSpeedUnits") or "M").strip()[:1].lower()
    return value * _UNIT_MBPS.get(unit, 1.0)


def _check_attrs(attrs: Mapping[str, Any], allowed: frozenset[str], what: str, where: str,
                 report: LoadReport) -> dict[str, Any]:
    """The project's keys of a node's or link's attributes. Other attributes are ignored and
    counted in `report`, except one that looks like a misspelt project key: that is rejected."""
    # A key is matched against the project's keys and their stems ("capacity" of capacity_mbps).
    stems = {k.split("_")[0]: k for k in allowed if k.split("_")[0] not in {"has"}} | {k: k for k in allowed}
    for key in sorted(set(attrs) - allowed - FOREIGN_KEYS):
        close = difflib.get_close_matches(key.lower(), sorted(stems), n=1, cutoff=0.8)
        if close:
            raise TopologyError(
                f"{where}: {what} has unknown attribute {key!r} (did you mean {stems[close[0]]!r}?); "
                f"the model uses {sorted(allowed)}"
            )
        report.ignored[key] += 1
    return {k: v for k, v in attrs.items() if k in allowed}


def _position(attrs: Mapping[str, Any]) -> dict[str, float]:
    """A node's lon/lat from foreign formats: TopoHub's ``pos`` [lon, lat], Topology Zoo's
    Longitude/Latitude. Nothing when absent or not a plausible position."""
    pos = attrs.get("pos")
    if isinstance(pos, (list, tuple)) and len(pos) == 2:
        lon, lat = pos
    else:
        lon, lat = attrs.get("Longitude"), attrs.get("Latitude")
    try:
        lon_f, lat_f = float(lon), float(lat)
    except (TypeError, ValueError):
        return {}
    if not (-180.0 <= lon_f <= 180.0 and -90.0 <= lat_f <= 90.0):
        return {}
    return {"lon": lon_f, "lat": lat_f}


def valid_site_name(text: str) -> str:
    """`text` as a site name: control characters and commas become blanks, runs of blanks one
    blank, no blanks around; "" when nothing is left."""
    cleaned = "".join(" " if c == "," or unicodedata.category(c).startswith("C") else c for c in text)
    return " ".join(cleaned.split())


def site_names(g: nx.Graph, report: LoadReport) -> dict[Any, str]:
    """A valid, unique site name for every node of `g` (see the module docstring), in node order."""
    names: dict[Any, str] = {}
    taken: set[str] = set()
    for node, attrs in g.nodes(data=True):
        given = attrs.get("name") or attrs.get("label")
        raw = str(given) if given not in (None, "") else str(node)
        base = valid_site_name(raw) or f"site {valid_site_name(str(node)) or len(names) + 1}"
        name, k = base, 2
        while name in taken:
            name, k = f"{base} {k}", k + 1
        taken.add(name)
        names[node] = name
        if name != raw:
            report.renamed_sites[name] = raw
    return names


def _merge_parallel(g: nx.Graph, where: str, report: LoadReport) -> nx.Graph:
    """A simple graph from a multigraph: parallel links become one whose capacity is the sum of
    theirs when every one of them gives a rate (else the first one's attributes), self-loops go."""
    if not isinstance(g, nx.MultiGraph):
        loops = list(nx.selfloop_edges(g))
        if loops:
            g = nx.Graph(g)
            g.remove_edges_from(loops)
            report.self_loops += len(loops)
        return g
    out = nx.Graph()
    out.graph.update(g.graph)
    out.add_nodes_from(g.nodes(data=True))
    groups: dict[frozenset[Any], list[tuple[Any, Any, dict[str, Any]]]] = {}
    for u, v, attrs in g.edges(data=True):
        if u == v:
            report.self_loops += 1
            continue
        groups.setdefault(frozenset((u, v)), []).append((u, v, dict(attrs)))
    for group in groups.values():
        u, v, attrs = group[0]
        if len(group) > 1:
            if any(set(a) & (LINK_KEYS - {"a", "b"}) for _, _, a in group):
                raise TopologyError(f"{where}: duplicate link {u}-{v}")
            rates = [rate_from_speed(a) or rate_from_text(a.get("LinkType")) or rate_from_text(a.get("LinkLabel"))
                     for _, _, a in group]
            if all(r is not None for r in rates):
                attrs = {k: x for k, x in attrs.items() if k not in {"LinkSpeedRaw", "LinkSpeed", "LinkSpeedUnits"}}
                attrs["LinkSpeedRaw"] = sum(r for r in rates if r is not None) * 1e6
            report.merged_links += len(group) - 1
        out.add_edge(u, v, **attrs)
    return out


def from_graph(g: nx.Graph, *, name: str, where: str = "graph", report: LoadReport | None = None) -> NetworkModel:
    """Build a model from a networkx graph whose attributes follow the module docstring.

    `report`, when given, receives what was read and what was defaulted.
    """
    report = report if report is not None else LoadReport(source=where)
    if g.is_directed():
        g = g.to_undirected()
    g = _merge_parallel(g, where, report)
    labels = site_names(g, report)
    sites = []
    positions: dict[Any, dict[str, float]] = {}
    for node, attrs in g.nodes(data=True):
        spec = _check_attrs(
            {k: v for k, v in attrs.items() if k != "name"}, SITE_KEYS - {"name"}, f"site {labels[node]!r}", where,
            report,
        )
        spec["name"] = labels[node]
        positions[node] = _position(attrs)
        if not positions[node] and not ({"lon", "lat"} & set(spec)):
            report.sites_without_position.append(labels[node])
        spec = {**positions[node], **spec}
        sites.append(spec)
    links = []
    for u, v, attrs in g.edges(data=True):
        spec = _check_attrs(attrs, LINK_KEYS - {"a", "b"}, f"link {labels[u]}-{labels[v]}", where, report)
        if "length_km" in spec:
            report.length_from["given"] += 1
        elif isinstance(attrs.get("dist"), (int, float)) and attrs["dist"] > 0:
            spec["length_km"] = float(attrs["dist"])
            report.length_from["dist"] += 1
        elif positions[u] and positions[v]:
            pu, pv = positions[u], positions[v]
            # Two sites in one city (same coordinates) are still some fiber apart: 1 km at least.
            spec["length_km"] = max(1.0, great_circle_km(pu["lon"], pu["lat"], pv["lon"], pv["lat"]))
            report.length_from["coordinates"] += 1
        else:
            report.length_from["default"] += 1
        if {"capacity_mbps", "wavelength_mbps"} & set(spec):
            report.capacity_from["given"] += 1
        elif (speed := rate_from_speed(attrs)) is not None:
            spec["capacity_mbps"] = speed
            report.capacity_from["LinkSpeed"] += 1
        elif (rate := rate_from_text(attrs.get("LinkType")) or rate_from_text(attrs.get("LinkLabel"))) is not None:
            spec["capacity_mbps"] = rate
            report.capacity_from["LinkType/LinkLabel"] += 1
        else:
            report.capacity_from["default"] += 1
        spec.update(a=labels[u], b=labels[v])
        links.append(spec)
    try:
        return NetworkModel.build(name, sites, links)
    except TopologyError as e:
        raise TopologyError(f"{where}: {e}") from None


def from_node_link(
    data: Any, *, name: str, where: str = "node-link", report: LoadReport | None = None
) -> NetworkModel:
    """Build a model from a NetworkX node-link mapping (``edges`` or ``links`` key)."""
    if not isinstance(data, Mapping) or "nodes" not in data:
        raise TopologyError(f"{where}: not a node-link document (no 'nodes')")
    edges_key = "edges" if "edges" in data else "links"
    if edges_key not in data:
        raise TopologyError(f"{where}: not a node-link document (no 'edges' or 'links')")
    for e in data[edges_key]:
        if not isinstance(e, Mapping) or "source" not in e or "target" not in e:
            raise TopologyError(f"{where}: every edge needs 'source' and 'target'")
    seen: set[frozenset[Any]] = set()
    for e in data[edges_key]:
        key = frozenset((e["source"], e["target"]))
        if key in seen:
            raise TopologyError(f"{where}: duplicate link {e['source']}-{e['target']}")
        seen.add(key)
    node_ids = {n.get("id") for n in data["nodes"] if isinstance(n, Mapping)}
    for e in data[edges_key]:
        for end in (e["source"], e["target"]):
            if end not in node_ids:
                raise TopologyError(f"{where}: link {e['source']}-{e['target']} names unknown site {end!r}")
    try:
        g = nx.node_link_graph(dict(data), edges=edges_key)
    except Exception as e:
        raise TopologyError(f"{where}: malformed node-link document: {e}") from e
    graph_name = data.get("graph", {}).get("name") if isinstance(data.get("graph"), Mapping) else None
    return from_graph(g, name=str(graph_name or name), where=where, report=report)


def load_topohub(key: str, *, report: LoadReport | None = None) -> NetworkModel:
    """Load a TopoHub topology (offline data shipped with the `topohub` package)."""
    import topohub

    try:
        data = topohub.get(key)
    except (KeyError, OSError):
        raise TopologyError(
            f"unknown topology {key!r}: not a TopoHub key (e.g. sndlib/nobel-us, topozoo/Abilene)"
        ) from None
    data = dict(data)
    data["graph"] = {"name": key}
    return from_node_link(data, name=key, where=key, report=report)


def with_compute_sites(model: NetworkModel, compute_sites: list[str]) -> NetworkModel:
    """A copy of `model` where exactly `compute_sites` have compute."""
    for s in compute_sites:
        model.site(s)
    chosen = set(compute_sites)
    sites = [
        {"name": s.name, "has_compute": s.name in chosen, "cpu": s.cpu, "memory_mb": s.memory_mb}
        for s in model.sites.values()
    ]
    return NetworkModel.build(model.name, sites, list(model.iter_links()))
