"""Benchmark: a paced small copy through a shaped link, with and without background beside it.

One link as the emulation shapes it (`tests/integration/shaping_chain.py`: a sender, a forwarding
namespace whose egress carries the emulation's htb tree, a receiver): a task class guaranteed a
tenth of the link and borrowing the rest at the tasks' priority, as a small model's task on
paper.yaml's links, and an iperf3 flow at a share of the link in the background class (htb's
default), paced as the emulation's background is. The sender paces a 19 KB copy at the link's
rate (`workers.pacing`, as the agents do) every 0.2 s; printed per time dilation K (the link at
100 Mbit/s / K) and background load: the median copy time over its frames' time at the rate, and
the ratio of the loaded medians to the unloaded one.

What it shows: a copy sent one segment at a time leaves its class empty a moment before each
segment, and a backlogged background takes the gap; where htb's bucket holds one frame the pacer
sends a segment behind another half its serialization early (`workers.pacing.LEAD_SHARE`), so it
already waits in the class, and what is left is mostly the copy's first segment. The flow-level
model (`orchestrator.simulation`) leaves the background only its guaranteed share while a task
wants the rest (docs/simulation.md, "Calibration and validation").

Usage: ``sudo .venv/bin/python benchmarks/bench_shaping.py [--copies N]``. Needs root and iperf3;
everything it makes is removed on every exit path.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.integration.shaping_chain import WIRE_BYTES, background, chain, copy_times, shape, unshape  # noqa: E402

KS = (16, 64, 256)
LOADS = (0.0, 0.3, 0.6)
LINK_MBPS = 100.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--copies", type=int, default=8, help="copies per case (default 8)")
    args = parser.parse_args()
    with chain(), tempfile.TemporaryDirectory(prefix="netai-bench-shaping-") as tmp:
        for k in KS:
            rate = LINK_MBPS / k
            unshape()
            shape(rate, rate / 10)
            wire_s = WIRE_BYTES * 8 / (rate * 1e6)
            medians = {}
            for load in LOADS:
                with background(load, rate):
                    times = copy_times(Path(tmp), copies=args.copies, pace_mbps=rate)
                medians[load] = statistics.median(times) / wire_s
            print(f"shaping (one link at {LINK_MBPS:.0f} Mbit/s / K = {k}, a paced 19 KB copy, task class "
                  f"guaranteed a tenth): copy / its frames at the rate, median of {args.copies}: "
                  + ", ".join(f"background {load:.0%} {m:.3f}" for load, m in medians.items())
                  + "; with background over without: "
                  + ", ".join(f"{medians[load] / medians[0.0]:.3f}" for load in LOADS if load), flush=True)


if __name__ == "__main__":
    main()
