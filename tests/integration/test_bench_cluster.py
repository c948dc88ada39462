"""The cluster benchmark runs for real in the suite (issue "beyond one machine": the per-link-kind
figures and the isolation of a reservation across tunnels, in `make test`): a test machine holds B's
switch, so A - B and B - C are VXLAN tunnels; the benchmark prints throughput over the link rate and
the ping round trip per link kind, and a task's broadcast across both tunnels with iperf3 saturating
its path over the same without. Nothing of the run stays: no bridge, switch veth or controller here,
no test machine or test network.

Behaviour only: every figure is measured and printed, none is compared with a target here (the
machine is shared; docs/measurements/cluster.md, "Measured on the test machines", gives runs of it).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_experiment import leftovers

pytestmark = [pytest.mark.root, pytest.mark.docker, pytest.mark.slow]

BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_cluster.py"
NOTHING = {"bridges": [], "veths": [], "controller": [], "containers": []}
NUMBER = r"([0-9]+\.[0-9]+)"


def _test_docker_objects() -> list[str]:
    """The test machines and test networks that exist (`tests.integration.machines` labels them)."""
    out = []
    for kind in ("ps", "network"):
        argv = ["docker", kind, "ls", "-q"] if kind == "network" else ["docker", "ps", "-aq"]
        for role in ("test-machine", "test-network"):
            res = subprocess.run([*argv, "--filter", f"label=org.netai.role={role}"], capture_output=True,
                                 text=True, check=True)
            out += res.stdout.split()
    return out


def test_cluster_benchmark_measures_each_link_kind_and_the_isolation_across_tunnels(figures: list[str]) -> None:
    assert leftovers() == NOTHING and _test_docker_objects() == []  # else what follows is not this run's

    res = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, timeout=900)

    assert res.returncode == 0, res.stderr[-3000:]
    links = re.search(rf"throughput / link rate: tunnel {NUMBER}, local {NUMBER}; median ping round trip: "
                      rf"A -> C \(two tunnel hops\) {NUMBER} ms, {NUMBER} ms per hop; C -> D \(one local hop\) "
                      rf"{NUMBER} ms \(per hop, tunnel / local {NUMBER};", res.stdout)
    isolation = re.search(rf"broadcast with saturating iperf3 / without: {NUMBER} \(target <= 1.15\)", res.stdout)
    assert links is not None and isolation is not None, res.stdout
    tunnel, local, rtt_two, per_hop, rtt_local, hop_ratio = (float(x) for x in links.groups())
    assert tunnel > 0 and local > 0 and rtt_two > 0 and rtt_local > 0
    assert per_hop == pytest.approx(rtt_two / 2, abs=0.01)
    # the printed ratio is the unrounded round trips' (to 2 decimals): within what the rounded ones allow
    # (a fixed 0.02 failed in CI: printed 0.98, 1.00 from the rounded figures)
    half = 0.005  # half the last printed digit
    lowest, highest = (rtt_two - half) / 2 / (rtt_local + half), (rtt_two + half) / 2 / (rtt_local - half)
    assert lowest - half <= hop_ratio <= highest + half, (hop_ratio, rtt_two, rtt_local)
    assert 0 < float(isolation.group(1)) <= 1.15, res.stdout  # the target the benchmark prints
    figures.extend(line for line in res.stdout.splitlines() if line.startswith(("cluster links", "isolation")))
    assert leftovers() == NOTHING
    assert _test_docker_objects() == []
