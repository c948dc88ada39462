"""A run folder's figures: `draw_figures` with its summary plots drawn in a forked child beside the others
(as every run draws them, `orchestrator.results.forked`) against all of them drawn in this process.

Runs the tutorial's first experiment once (experiments/tutorial.yaml: NSFNET, spff and mst at 2 and
4 locals, background on; root, Mininet), then draws its figures both ways into fresh folders,
alternating, and prints each pair, the medians, and the paired ratio forked / in-process (the machine
is shared: compare within a pair)::

    sudo flock /tmp/netai-mininet.lock .venv/bin/python benchmarks/bench_figures.py [--pairs 8]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.pairs import alternating, summary
from orchestrator.results import forked
from orchestrator.results.db import ResultsDB
from orchestrator.results.summary_figures import draw_figures

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "experiments" / "tutorial.yaml"


def draw_once(db: ResultsDB, out: Path, *, fork: bool) -> float:
    """Seconds `draw_figures` takes into the fresh folder `out`, forking (as runs do) or not."""
    real = forked.start
    if not fork:
        forked.start = lambda fn: forked.Forked(fn, None, None)  # type: ignore[assignment]
    try:
        t0 = time.monotonic()
        figures = draw_figures(db, 1, out)
        took = time.monotonic() - t0
    finally:
        forked.start = real  # type: ignore[assignment]
    if sum(f.ok for f in figures) < 6:  # the summary plots, latency, trade-off, timeline, link load
        raise SystemExit(f"only {[f.name for f in figures if f.ok]} drawn: {[f.skipped for f in figures]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=8)
    args = parser.parse_args()
    if args.pairs < 1:
        parser.error("--pairs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="netai-bench-figures-") as d:
        root = Path(d)
        subprocess.run([sys.executable, "-m", "orchestrator.cli", "experiment", str(CONFIG), "--out",
                        str(root / "runs"), "--no-progress", "--no-figures"], check=True, stdout=subprocess.DEVNULL)
        (db_path,) = (root / "runs").glob("*/results.db")
        with ResultsDB(db_path) as db:
            draw_once(db, root / "warm-up", fork=False)  # matplotlib imported and its caches filled
            n = iter(range(2 * args.pairs))
            a, b, ratios = alternating(
                args.pairs, lambda: draw_once(db, root / f"f{next(n)}", fork=True),
                lambda: draw_once(db, root / f"f{next(n)}", fork=False),
                lambda i, x, y: print(f"pair {i}: forked {x:.2f} s, in-process {y:.2f} s, {x / y:.3f}", flush=True))
    print(summary("forked", "in-process", a, b, ratios))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
