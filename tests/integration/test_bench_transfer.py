"""The transfer benchmark in quick mode: it measures, and it leaves no namespace or bridge behind."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.bench_transfer import run

pytestmark = [pytest.mark.root, pytest.mark.slow]


def test_bench_transfer_quick_through_ovs(tmp_path: Path) -> None:
    res = run(rounds=2, iperf_s=1, model="large", hidden=3200, chunk_mb=1.0, log_dir=tmp_path, link="ovs")

    print(f"\nagent/iperf3 through a userspace OVS bridge: {res['ratio']}")
    assert res["model_bytes"] >= 40 * 10**6
    assert len(res["agent_mbps"]["G->L"]) == 2 and len(res["agent_mbps"]["L->G"]) == 2
    assert min(res["ratio"].values()) > 0.5
    left_ns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left_br = subprocess.run(["ovs-vsctl", "list-br"], capture_output=True, text=True).stdout
    assert "netai-bt" not in left_ns and "nbtbr" not in left_br
