"""`netai net|flows|links|clean` argument handling and table rendering (no network started)."""

from __future__ import annotations

import os

import pytest

from orchestrator.cli import build_parser, main
from orchestrator.cli.net import render_flows, render_links


def test_subcommands_are_registered_with_their_options() -> None:
    parser = build_parser()

    up = parser.parse_args(["net", "up", "--topology", "triangle", "--no-cli"])
    test = parser.parse_args(["net", "test", "--json", "--locals", "3"])
    slow_test = parser.parse_args(["net", "test", "--timeout", "180"])
    flows = parser.parse_args(["flows", "--task", "4", "--once"])
    links = parser.parse_args(["links", "--once", "--url", "http://127.0.0.1:9"])

    assert (up.topology, up.no_cli) == ("triangle", True)
    assert (test.json, test.locals, test.topology, test.timeout) == (True, 3, "sndlib/nobel-us", 30.0)
    assert slow_test.timeout == 180.0
    assert (flows.task, flows.once) == (4, True)
    assert links.url == "http://127.0.0.1:9"


def test_unknown_topology_is_a_one_line_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    if os.geteuid() != 0:
        pytest.skip("the root check comes first for non-root users")

    status = main(["net", "test", "--topology", "no-such-topology"])

    assert status == 2
    assert "unknown topology" in capsys.readouterr().err


def test_flows_without_a_running_network_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["flows", "--once", "--url", "http://127.0.0.1:9"])

    assert status == 2
    assert "unreachable" in capsys.readouterr().err


def test_tables_render_flows_and_links() -> None:
    flows = [{
        "switch": "s1", "site": "A", "task": 7, "priority": 200, "packets": 3, "bytes": 4500,
        "match": {"eth_type": 2048, "ip_proto": 6, "ipv4_src": "10.0.0.1", "ipv4_dst": "10.0.0.2", "tcp_dst": 20014},
        "actions": [{"type": "OUTPUT", "port": 2}],
    }]
    links = [{"link": ["A", "B"], "switch": "s1", "port": 2, "rate_mbps": 12.5, "emulated_mbps": 100.0,
              "utilisation": 0.125, "tx_bytes": 999, "up": True}]

    flow_text = render_flows(flows)
    link_text = render_links(links)

    assert "tcp_dst=20014" in flow_text and "4500" in flow_text and "1 entries" in flow_text
    assert "A -> B" in link_text and "12.5%" in link_text and "s1-eth2" in link_text


def test_flows_label_background_and_best_effort_entries() -> None:
    base = {"switch": "s2", "site": "B", "task": None, "packets": 1, "bytes": 98}
    flows = [
        {**base, "kind": "best-effort", "priority": 10, "match": {"eth_type": 2048, "ipv4_dst": "10.0.0.3"},
         "actions": [{"type": "SET_FIELD", "field": "ip_dscp", "value": 1}, {"type": "OUTPUT", "port": 3}]},
        {**base, "kind": "background", "priority": 100,
         "match": {"eth_type": 2048, "ipv4_src": "10.0.0.1", "ipv4_dst": "10.0.0.3"},
         "actions": [{"type": "OUTPUT", "port": 4}]},
        {**base, "kind": "table-miss", "priority": 0, "match": {}, "actions": []},
    ]

    rows = render_flows(flows).splitlines()[1:4]

    assert [r.split()[2] for r in rows] == ["be", "bg", "-"]
    assert [r.split()[-3] for r in rows] == ["3", "4", "drop"]
