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

In node-link JSON and GraphML files the project's keys (`has_compute`, `cpu`, `memory_mb` on
nodes; `capacity_mbps`, `length_km`, `delay_ms`, `wavelengths`, `wavelength_mbps` on links) are
validated; a few metadata keys of TopoHub and the Topology Zoo (`FOREIGN_KEYS`) are accepted and
ignored; anything else is rejected so that a misspelt key is never silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from topologies.errors import TopologyError
from topologies.model import LINK_KEYS, SITE_KEYS, NetworkModel

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
    model = _load(spec)
    if compute_sites is not None:
        model = with_compute_sites(model, compute_sites)
    return model


def _load(spec: str | Path) -> NetworkModel:
    text = str(spec)
    path = Path(text)
    if path.suffix.lower() in {".yaml", ".yml", ".json", ".graphml"} or path.exists():
        return load_file(path)
    if ":" in text:
        from topologies.generators import from_spec

        return from_spec(text)
    builtin = DATA_DIR / f"{text}.yaml"
    if builtin.exists():
        return load_file(builtin)
    if "/" in text:
        return load_topohub(text)
    raise TopologyError(
        f"unknown topology {text!r}: give a TopoHub key (e.g. {DEFAULT_TOPOLOGY}), a generator "
        f"(ring:N, spine-leaf:S:L), a built-in name ({', '.join(builtin_names())}) or a file path"
    )


def builtin_names() -> list[str]:
    return sorted(p.stem for p in DATA_DIR.glob("*.yaml"))


def load_file(path: Path) -> NetworkModel:
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
            return from_node_link(data, name=path.stem, where=str(path))
        if suffix == ".graphml":
            g = nx.read_graphml(path)
            return from_graph(g, name=path.stem, where=str(path))
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


def _split_attrs(attrs: Mapping[str, Any], allowed: frozenset[str], what: str, where: str) -> dict[str, Any]:
    unknown = set(attrs) - allowed - FOREIGN_KEYS
    if unknown:
        raise TopologyError(
            f"{where}: {what} has unknown attribute(s) {sorted(unknown)}; "
            f"the model uses {sorted(allowed)}"
        )
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


def from_graph(g: nx.Graph, *, name: str, where: str = "graph") -> NetworkModel:
    """Build a model from a networkx graph whose attributes follow the module docstring."""
    if g.is_directed():
        g = g.to_undirected()
    if isinstance(g, nx.MultiGraph):
        seen: set[frozenset[Any]] = set()
        for u, v in g.edges():
            key = frozenset((u, v))
            if key in seen:
                raise TopologyError(f"{where}: duplicate link {u}-{v}")
            seen.add(key)
        g = nx.Graph(g)
    labels: dict[Any, str] = {}
    for node, attrs in g.nodes(data=True):
        label = attrs.get("name") or attrs.get("label") or str(node)
        labels[node] = str(label)
    if len(set(labels.values())) != len(labels):
        labels = {n: str(n) for n in g.nodes}
    sites = []
    for node, attrs in g.nodes(data=True):
        spec = _split_attrs(
            {k: v for k, v in attrs.items() if k != "name"}, SITE_KEYS - {"name"}, f"site {labels[node]!r}", where
        )
        spec["name"] = labels[node]
        spec.update(_position(attrs))
        sites.append(spec)
    links = []
    for u, v, attrs in g.edges(data=True):
        spec = _split_attrs(attrs, LINK_KEYS - {"a", "b"}, f"link {labels[u]}-{labels[v]}", where)
        if "length_km" not in spec and isinstance(attrs.get("dist"), (int, float)) and attrs["dist"] > 0:
            spec["length_km"] = float(attrs["dist"])
        spec.update(a=labels[u], b=labels[v])
        links.append(spec)
    try:
        return NetworkModel.build(name, sites, links)
    except TopologyError as e:
        raise TopologyError(f"{where}: {e}") from None


def from_node_link(data: Any, *, name: str, where: str = "node-link") -> NetworkModel:
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
    return from_graph(g, name=str(graph_name or name), where=where)


def load_topohub(key: str) -> NetworkModel:
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
    return from_node_link(data, name=key, where=key)


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
