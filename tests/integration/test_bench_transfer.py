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


def test_bench_transfer_one_core_per_side_pins_both_iperf3_and_the_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(cmd: list[str], *args: object, **kw: object) -> subprocess.Popen[bytes]:
        started.append(list(cmd))
        return real_popen(cmd, *args, **kw)  # type: ignore[call-overload,no-any-return]

    monkeypatch.setattr(subprocess, "Popen", popen)
    res = run(rounds=2, iperf_s=1, model="large", hidden=3200, chunk_mb=1.0, log_dir=tmp_path, link="veth", pin=True)

    assert res["pinned"] and len(res["agent_mbps"]["G->L"]) == 2
    iperf = [c for c in started if "iperf3" in c]
    assert {"-s", "-c"} <= {flag for c in iperf for flag in c}, "both iperf3 ends were started"
    assert all(c[c.index("-A") + 1] == ("1" if "-s" in c else "0") for c in iperf), "server on core 1, client on 0"
    site_servers = [c for c in started if any("site_server" in part for part in c)]
    assert sorted(c[:3] == ["taskset", "-c", c[2]] and c[2] for c in site_servers) == ["0", "1"]
