"""The network model and its loaders: real topologies, user files, generators, validation."""

from __future__ import annotations

import json
from pathlib import Path

import networkx as nx
import pytest

from topologies.errors import TopologyError
from topologies.generators import random_connected, ring, spine_leaf
from topologies.loaders import load
from topologies.model import FIBER_DELAY_MS_PER_KM, NetworkModel


def test_nsfnet_from_topohub_has_14_sites_21_links_and_fiber_delays() -> None:
    model = load("sndlib/nobel-us")

    assert len(model.sites) == 14
    assert len(model.links) == 21
    link = model.link("Palo-Alto", "San-Diego")
    assert link.length_km == pytest.approx(704.13)
    assert link.delay_ms == pytest.approx(704.13 * FIBER_DELAY_MS_PER_KM)
    assert link.capacity_mbps == link.wavelengths * link.wavelength_mbps
    assert nx.is_connected(model.graph)


def test_yaml_roundtrip(tmp_path: Path) -> None:
    model = load("triangle")
    import yaml

    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(model.to_dict()))

    again = load(str(path))

    assert again.to_dict() == model.to_dict()


def test_capacity_given_instead_of_wavelength_rate(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "sites: [{name: A}, {name: B, has_compute: false}]\n"
        "links: [{a: A, b: B, capacity_mbps: 400, wavelengths: 4, delay_ms: 2}]\n"
    )

    model = load(str(path))

    link = model.link("B", "A")
    assert (link.wavelength_mbps, link.capacity_mbps, link.delay_ms) == (100.0, 400.0, 2.0)
    assert model.compute_sites == ["A"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("sites: [{name: A}, {name: B}]\nlinks: [{a: A, b: B, colour: red}]\n", "unknown key"),
        ("sites: [{name: A}, {name: B}]\nlinks: [{a: A, b: B, capacity_mbps: -5}]\n", "must be positive"),
        ("sites: [{name: A}, {name: B}]\nlinks: [{a: A, b: B, capacity_mbps: 0}]\n", "must be positive"),
        ("sites: [{name: A}, {name: B}, {name: C}]\nlinks: [{a: A, b: B}]\n", "disconnected"),
        ("sites: [{name: A}, {name: B}]\nlinks: [{a: A, b: B}, {a: B, b: A}]\n", "duplicate link"),
        ("sites: [{name: A}, {name: A}]\nlinks: []\n", "duplicate site"),
        ("sites: [{name: A}, {name: B}]\nlinks: [{a: A, b: Z}]\n", "unknown site 'Z'"),
        ("sites: [{name: A, gpu: 2}]\nlinks: []\n", "unknown key"),
        ("nodes: []\n", "unknown key"),
        ("sites: [{name: A}\n", "malformed file"),
    ],
)
def test_bad_yaml_is_rejected_with_one_clear_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)

    with pytest.raises(TopologyError) as info:
        load(str(path))

    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_node_link_json_with_project_and_foreign_keys(tmp_path: Path) -> None:
    doc = {
        "directed": False, "multigraph": False, "graph": {"name": "j"},
        "nodes": [{"id": 0, "name": "X", "pos": [0, 0]}, {"id": 1, "name": "Y", "has_compute": False}],
        "edges": [{"source": 0, "target": 1, "dist": 250.0, "wavelengths": 2}],
    }
    path = tmp_path / "j.json"
    path.write_text(json.dumps(doc))

    model = load(str(path))

    assert model.link("X", "Y").length_km == 250.0
    assert model.link("X", "Y").wavelengths == 2
    assert model.compute_sites == ["X"]


def test_node_link_json_rejects_unknown_attribute_and_unknown_site(tmp_path: Path) -> None:
    path = tmp_path / "j.json"
    path.write_text(json.dumps({"nodes": [{"id": 0}, {"id": 1}],
                                "edges": [{"source": 0, "target": 1, "capcity": 5}]}))
    with pytest.raises(TopologyError, match="unknown attribute"):
        load(str(path))
    path.write_text(json.dumps({"nodes": [{"id": 0}], "edges": [{"source": 0, "target": 7}]}))
    with pytest.raises(TopologyError, match="unknown site"):
        load(str(path))


def test_graphml(tmp_path: Path) -> None:
    g = nx.Graph()
    g.add_node("a", has_compute=True)
    g.add_node("b", has_compute=False)
    g.add_node("c")
    g.add_edge("a", "b", length_km=10.0)
    g.add_edge("b", "c", capacity_mbps=1000.0, wavelengths=4)
    path = tmp_path / "g.graphml"
    nx.write_graphml(g, path)

    model = load(str(path))

    assert model.link("b", "c").wavelength_mbps == 250.0
    assert sorted(model.compute_sites) == ["a", "c"]


def test_unknown_names_and_missing_files() -> None:
    with pytest.raises(TopologyError, match="unknown topology 'sndlib/nope'"):
        load("sndlib/nope")
    with pytest.raises(TopologyError, match="unknown topology"):
        load("nosuchname")
    with pytest.raises(TopologyError, match="no such topology file"):
        load("/nonexistent/t.yaml")


def test_generators() -> None:
    r = ring(6)
    sl = spine_leaf(2, 4)
    rnd = random_connected(200, seed=3)

    assert len(r.links) == 6 and all(r.graph.degree[n] == 2 for n in r.sites)
    assert len(sl.links) == 8 and sl.compute_sites == ["leaf1", "leaf2", "leaf3", "leaf4"]
    assert nx.is_connected(rnd.graph) and len(rnd.sites) == 200
    assert random_connected(200, seed=3).to_dict() == rnd.to_dict()
    assert load("ring:4").name == "ring:4"
    with pytest.raises(TopologyError, match="bad generator spec"):
        load("ring:x")


def test_model_rejects_link_to_itself() -> None:
    with pytest.raises(TopologyError, match="two different sites"):
        NetworkModel.build("x", [{"name": "A"}], [{"a": "A", "b": "A"}])
