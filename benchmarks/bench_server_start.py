"""Site servers' start: forked from one warmed fork server against each importing torch itself.

Starts N loopback site servers (no root, no Mininet) with the fork server on and off
(``NETAI_FORKSERVER``), alternating, and prints the median time until every server answered, and
the paired ratio forked / own per pair (the machine is shared: compare within a pair, not across
runs)::

    python benchmarks/bench_server_start.py [--sites 14] [--pairs 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.runtime.backends import ENV_FORKSERVER, LoopbackBackend
from orchestrator.runtime.compute import ComputeManager


def start_once(n: int, forked: bool) -> float:
    """Seconds until `n` loopback servers answered (`ComputeManager.start`)."""
    os.environ[ENV_FORKSERVER] = "1" if forked else "0"
    sites = [f"site{i}" for i in range(n)]
    with tempfile.TemporaryDirectory(prefix="netai-bench-start-") as d:
        cm = ComputeManager(LoopbackBackend(sites, log_root=Path(d), first_octet=160), sites)
        try:
            return cm.start()
        finally:
            cm.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sites", type=int, default=14)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    own, forked, ratios = [], [], []
    for i in range(args.pairs):
        pair = {}
        for mode in ((True, False) if i % 2 == 0 else (False, True)):  # alternate which goes first
            pair[mode] = start_once(args.sites, mode)
        forked.append(pair[True])
        own.append(pair[False])
        ratios.append(pair[True] / pair[False])
        print(f"pair {i + 1}: forked {pair[True]:.2f} s, own {pair[False]:.2f} s, ratio {ratios[-1]:.3f}", flush=True)
    print(f"{args.sites} site servers up: forked median {statistics.median(forked):.2f} s, own median "
          f"{statistics.median(own):.2f} s; forked / own (paired) median {statistics.median(ratios):.3f} "
          f"[{min(ratios):.3f}, {max(ratios):.3f}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
