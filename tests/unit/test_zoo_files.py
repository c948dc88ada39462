"""Topology files as they come: the Internet Topology Zoo's GraphML (the vendored Abilene and
Zoo-like files with the format's quirks), read through the loaders and the `netai` CLI."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from topologies.errors import TopologyError
from topologies.loaders import DATA_DIR, load, load_with_report, rate_from_text, valid_site_name
from topologies.model import DEFAULT_LENGTH_KM, DEFAULT_WAVELENGTH_MBPS, DEFAULT_WAVELENGTHS, great_circle_km

ABILENE = DATA_DIR / "Abilene.graphml"


def test_abilene_from_the_zoo_has_its_sites_distances_and_oc192_links(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="topologies.loaders"):
        model = load(str(ABILENE))

    assert len(model.sites) == 11 and len(model.links) == 14
    assert {"New York", "Chicago", "Washington DC", "Kansas City", "Los Angeles"} <= set(model.sites)
    ny_chicago = model.link("New York", "Chicago")
    assert ny_chicago.length_km == pytest.approx(1145, abs=5)
    assert ny_chicago.delay_ms == pytest.approx(ny_chicago.length_km * 0.005)
    assert all(ln.capacity_mbps == pytest.approx(192 * 51.84) for ln in model.iter_links())  # OC-192
    assert model.site("Seattle").lat == pytest.approx(47.60621)
    assert not caplog.records  # nothing was defaulted: nothing to say


def test_abilene_lengths_agree_with_topohubs_copy_of_the_zoo() -> None:
    ours = load(str(ABILENE))
    topohub = load("topozoo/Abilene")
    for link in topohub.iter_links():
        assert ours.link(link.a, link.b).length_km == pytest.approx(link.length_km, rel=0.01)


def test_load_report_counts_what_came_from_where() -> None:
    _, report = load_with_report(str(ABILENE))

    assert report.length_from == {"coordinates": 14}
    assert report.capacity_from == {"LinkType/LinkLabel": 14}
    assert not report.defaulted() and not report.renamed_sites and not report.sites_without_position
    assert "Country" not in report.ignored  # a known Zoo key: understood, not "ignored"


def zoo_like(tmp_path: Path) -> Path:
    """A Zoo-style multigraph: a repeated label, a label with a comma, a node without coordinates,
    speeds in each of the Zoo's forms, parallel links, a self-loop and attributes of its own."""
    g = nx.MultiGraph(Network="Zooish")
    g.add_node("0", label="Chicago", Latitude=41.85003, Longitude=-87.65005, Country="US")
    g.add_node("1", label="Chicago", Latitude=41.9, Longitude=-87.7, Internal=1)
    g.add_node("2", label="Denver, CO", Latitude=39.73915, Longitude=-104.9847, Ownership="leased")
    g.add_node("3", label="Somewhere")  # no coordinates
    g.add_edge("0", "1", LinkSpeed="10", LinkSpeedUnits="G", LinkNote="metro")
    g.add_edge("1", "2", LinkLabel="2 x 10 Gbps")
    g.add_edge("2", "3", LinkType="OC-48")
    g.add_edge("2", "3", LinkType="OC-48")  # parallel: one link of twice the rate
    g.add_edge("3", "0")  # nothing known: default rate, default length
    g.add_edge("3", "3")  # a self-loop
    path = tmp_path / "zooish.graphml"
    nx.write_graphml(g, path)
    return path


def test_zoo_like_file_loads_with_valid_unique_names_and_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="topologies.loaders"):
        model = load(str(zoo_like(tmp_path)))

    assert model.site_names == ["Chicago", "Chicago 2", "Denver CO", "Somewhere"]
    assert model.link("Chicago", "Chicago 2").capacity_mbps == pytest.approx(10_000)
    assert model.link("Chicago 2", "Denver CO").capacity_mbps == pytest.approx(10_000)
    assert model.link("Denver CO", "Somewhere").capacity_mbps == pytest.approx(2 * 48 * 51.84)
    assert model.link("Somewhere", "Chicago").capacity_mbps == DEFAULT_WAVELENGTHS * DEFAULT_WAVELENGTH_MBPS
    assert model.link("Chicago 2", "Denver CO").length_km == pytest.approx(
        great_circle_km(-87.7, 41.9, -104.9847, 39.73915))
    # The clear fallback: a site without coordinates gives its links the default length.
    assert model.link("Denver CO", "Somewhere").length_km == DEFAULT_LENGTH_KM
    assert model.site("Somewhere").lon is None
    assert len(model.links) == 4

    assert len(caplog.records) == 1  # said once, in counts, not per link
    message = caplog.records[0].getMessage()
    assert "2 lengths defaulted to 100 km (1 sites without coordinates, e.g. 'Somewhere')" in message
    assert "capacity from" in message and "default 1" in message
    assert "1 parallel links merged" in message and "1 links from a site to itself dropped" in message
    assert "Ownership" in message and "LinkNote" not in message


def test_zoo_like_report_keeps_the_renames_and_ignored_attributes(tmp_path: Path) -> None:
    _, report = load_with_report(str(zoo_like(tmp_path)))

    assert report.renamed_sites == {"Chicago 2": "Chicago", "Denver CO": "Denver, CO"}
    assert report.ignored == {"Ownership": 1}
    assert report.sites_without_position == ["Somewhere"]
    assert report.length_from == {"coordinates": 2, "default": 2}
    assert report.capacity_from == {"LinkSpeed": 2, "LinkType/LinkLabel": 1, "default": 1}


def test_a_misspelt_project_key_in_a_graphml_is_still_rejected(tmp_path: Path) -> None:
    g = nx.Graph()
    g.add_edge("a", "b", capcity=5.0)
    path = tmp_path / "typo.graphml"
    nx.write_graphml(g, path)

    with pytest.raises(TopologyError, match=r"unknown attribute 'capcity' \(did you mean 'capacity_mbps'\?\)"):
        load(str(path))


def test_the_projects_yaml_stays_strict_about_zoo_keys(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("sites: [{name: A, Latitude: 1.0}, {name: B}]\nlinks: [{a: A, b: B}]\n")
    with pytest.raises(TopologyError, match="unknown key"):
        load(str(path))


@pytest.mark.parametrize(
    ("text", "mbps"),
    [
        ("OC-192", 9953.28), ("OC-192c", 9953.28), ("OC48", 2488.32), ("STM-16", 2488.32),
        ("10 Gbps", 10_000.0), ("2.5G", 2500.0), ("155 Mb/s", 155.0), ("100Mbps", 100.0),
        ("2 x 10 Gbps", 10_000.0), ("GigE", 1000.0), ("10GE", 10_000.0), ("T3", 44.736),
        ("Fast Ethernet", 100.0), ("fibre", None), ("", None), (None, None),
    ],
)
def test_rates_read_from_link_types_and_labels(text: str | None, mbps: float | None) -> None:
    got = rate_from_text(text)
    assert got == (pytest.approx(mbps) if mbps is not None else None)


def test_site_names_are_made_valid() -> None:
    assert valid_site_name("  Denver,\tCO \n") == "Denver CO"
    assert valid_site_name("\x00,") == ""


def test_great_circle_distance() -> None:
    assert great_circle_km(0, 0, 0, 0) == 0
    assert great_circle_km(0, 0, 180, 0) == pytest.approx(20015, rel=1e-3)  # half the equator
    assert great_circle_km(-74.0, 40.7, -87.6, 41.8) == pytest.approx(great_circle_km(-87.6, 41.8, -74.0, 40.7))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_cli_topo_commands_accept_the_zoo_file() -> None:
    show = run("topo", "show", str(ABILENE), "--json")
    assert show.returncode == 0, show.stderr
    doc = json.loads(show.stdout)
    assert doc["summary"]["sites"] == 11 and doc["summary"]["links"] == 14

    sched = run("schedule", "--topology", str(ABILENE), "--scheduler", "mst", "--global", "New York",
                "--local-sites", "Seattle,Los Angeles,Houston", "--json")
    assert sched.returncode == 0, sched.stderr
    assert json.loads(sched.stdout)["blocked"] is False

    cmp_ = run("compare", "--topology", str(ABILENE), "--locals", "2", "--tasks", "3", "--schedulers", "spff,mst")
    assert cmp_.returncode == 0, cmp_.stderr


def test_cli_says_once_what_a_zoo_file_left_to_defaults(tmp_path: Path) -> None:
    out = run("topo", "show", str(zoo_like(tmp_path)))

    assert out.returncode == 0, out.stderr
    assert out.stderr.count("defaulted") == 1
    assert "Chicago 2" in out.stdout
