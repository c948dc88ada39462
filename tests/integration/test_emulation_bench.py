"""The emulation benchmark (quick mode) and `netai net test` run for real; ratios fall in a loose band.

The target is 0.90-1.05 of the configured line rate; the assertion is looser (0.70-1.05) because
the userspace datapath shares two cores with whatever else the machine runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.root, pytest.mark.slow]

BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_emulation.py"
BAND = (0.70, 1.05)


def test_goodput_over_a_three_hop_shaped_path_follows_the_configured_rate(figures: list[str]) -> None:
    res = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--json"], capture_output=True, text=True, timeout=300
    )

    assert res.returncode == 0, res.stderr
    rows = json.loads(res.stdout)["rows"]
    figures.extend(
        f"iperf3 over 3 shaped links at {r['rate_mbps']:g} Mbit/s: goodput/line rate {r['ratio']:.3f}, "
        f"goodput/TCP ceiling {r['of_ceiling']:.3f}"
        for r in rows
    )
    assert [r["rate_mbps"] for r in rows] == [10.0, 50.0, 100.0]
    assert all(r["hops"] == 3 for r in rows)
    for r in rows:
        assert BAND[0] <= r["ratio"] <= BAND[1], r


#: `netai net test`'s shaped rate here. At its default (100 Mbit/s), NSFNET's 14 bridges on the
#: userspace datapath keep ovs-vswitchd's one forwarding thread at 100 % of a core during the iperf3
#: check: goodput/line rate moved 0.69-0.90 over ten suite runs (0.69 failed its band), with the host's
#: other load. At 50 Mbit/s that thread has headroom: 0.94-0.95. The rates themselves are the
#: benchmark's (the test above).
NET_TEST_MBPS = 50


def test_netai_net_test_passes_on_nsfnet(figures: list[str]) -> None:
    netai = Path(sys.executable).with_name("netai")

    res = subprocess.run([str(netai), "net", "test", "--json", "--max-link-mbps", str(NET_TEST_MBPS)],
                         capture_output=True, text=True, timeout=300)

    summary = json.loads(res.stdout)
    figures.append(f"netai net test --max-link-mbps {NET_TEST_MBPS}: bring-up {summary.get('bringup_s')} s, iperf3 "
                   f"goodput/line rate {summary.get('iperf_ratio')} over {len(summary.get('iperf_path', [])) - 1} "
                   f"shaped links of {summary.get('iperf_configured_mbps')} Mbit/s")
    for key in ("switches_connected", "bringup_s", "paths_ok", "isolation_ok", "flows_match", "iperf_ratio",
                "delay_emulated", "teardown_clean"):
        assert key in summary
    assert res.returncode == 0, json.dumps(summary, indent=1)
    assert summary["ok"] is True
