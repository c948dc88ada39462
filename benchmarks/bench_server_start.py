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
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pairs import alternating, summary
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
    times = alternating(args.pairs, lambda: start_once(args.sites, True), lambda: start_once(args.sites, False),
                        lambda i, a, b: print(f"pair {i}: forked {a:.2f} s, own {b:.2f} s, ratio {a / b:.3f}",
                                              flush=True))
    print(f"{args.sites} site servers up: {summary('forked', 'own', *times)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
