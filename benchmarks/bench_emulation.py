"""Benchmark: iperf3 goodput over a shaped multi-hop path vs the configured (shaped) rate.

A chain of ``--hops`` shaped switch-to-switch links (``--hops + 1`` switches, a host at each end)
is brought up once per rate (default 10, 50 and 100 Mbit/s); iperf3 runs between the end hosts over
a background route. Two ratios are printed for each rate:

- ``ratio``: goodput / configured line rate (the target band is 0.90 to 1.05);
- ``of_ceiling``: goodput / (line rate x 1448/1514), the most TCP can carry over a shaped
  Ethernet line (payload per full frame with TCP timestamps), about 0.957 of the line rate.

Run as root, serialised with other Mininet users::

    flock /tmp/netai-mininet.lock .venv/bin/python benchmarks/bench_emulation.py [--quick] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from orchestrator.emulation.network import Emulation
from orchestrator.emulation.selftest import GOODPUT_CEILING, iperf
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan

DEFAULT_RATES_MBPS = (10.0, 50.0, 100.0)


def chain_plan(rate_mbps: float, hops: int) -> EmulationPlan:
    """A chain of `hops` links at `rate_mbps` (emulated 1:1), sites C0..C{hops}."""
    sites = [{"name": f"C{i}"} for i in range(hops + 1)]
    links = [
        {"a": f"C{i}", "b": f"C{i + 1}", "capacity_mbps": rate_mbps, "wavelengths": 1, "length_km": 10}
        for i in range(hops)
    ]
    model = NetworkModel.build(f"chain-{hops}", sites, links)
    return EmulationPlan.from_model(model, bw_scale=1.0)


def measure(rate_mbps: float, *, hops: int, seconds: float) -> dict[str, Any]:
    """Bring the chain up, route its end hosts, run iperf3 for `seconds`, tear down."""
    plan = chain_plan(rate_mbps, hops)
    first, last = plan.hosts[0].site, plan.hosts[-1].site
    with Emulation(plan) as emu:
        emu.client.set_background([[first, last]])
        result = iperf(emu.host(first), emu.host(last), 5201, seconds=seconds)
    if not result.ok:
        raise RuntimeError(f"iperf3 over the {hops}-hop chain at {rate_mbps:g} Mbit/s failed: {result.error}")
    return {
        "rate_mbps": rate_mbps,
        "hops": hops,
        "goodput_mbps": round(result.mbps, 3),
        "ratio": round(result.mbps / rate_mbps, 4),
        "of_ceiling": round(result.mbps / (rate_mbps * GOODPUT_CEILING), 4),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", type=float, nargs="+", default=list(DEFAULT_RATES_MBPS), help="Mbit/s")
    parser.add_argument("--hops", type=int, default=3, help="shaped switch-to-switch links on the path")
    parser.add_argument("--seconds", type=float, default=5.0, help="iperf3 duration per rate")
    parser.add_argument("--quick", action="store_true", help="2 s per rate")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    seconds = 2.0 if args.quick else args.seconds
    rows = []
    t0 = time.monotonic()
    for rate in args.rates:
        rows.append(measure(rate, hops=args.hops, seconds=seconds))
    if args.json:
        print(json.dumps({"rows": rows, "goodput_ceiling": GOODPUT_CEILING, "elapsed_s": time.monotonic() - t0}))
        return 0
    print(f"iperf3 over {args.hops} shaped links ({args.hops + 1} switches), {seconds:g} s per rate")
    print(f"{'rate Mbit/s':>12} {'goodput':>10} {'ratio':>7} {'of ceiling':>11}")
    for r in rows:
        print(f"{r['rate_mbps']:>12g} {r['goodput_mbps']:>10.2f} {r['ratio']:>7.3f} {r['of_ceiling']:>11.3f}")
    print(f"ratio = goodput / configured line rate (target 0.90-1.05); "
          f"of ceiling = goodput / ({GOODPUT_CEILING:.3f} x line rate), the TCP goodput ceiling")
    return 0


if __name__ == "__main__":
    sys.exit(main())
