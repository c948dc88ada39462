"""Fault benchmark: N faults of each kind injected into a running online experiment (real emulation).

On NSFNET, a few tasks run side by side (policy ``on_failure``) while the benchmark's events cut
links under running tasks (and restore them), kill local models' site servers (restarted a few
seconds later), restart the controller and step the background load. It prints: faults injected
(and how many could not be), tasks completed, tasks lost (must be 0), moves and rounds retried,
the mean interruption of a move, and what the teardown left behind (must be 0).

    sudo .venv/bin/python benchmarks/bench_faults.py [--faults N] [--keep]

Wrap it in ``flock /tmp/netai-mininet.lock`` (``make benchmark`` does).
"""

from __future__ import annotations

import argparse
import random
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from orchestrator.experiment.config import parse_config  # noqa: E402
from orchestrator.experiment.faults import NOT_APPLIED  # noqa: E402
from orchestrator.experiment.online import arrival_trace  # noqa: E402
from orchestrator.experiment.runner import run_experiment  # noqa: E402


def leftovers() -> dict[str, int]:
    bridges = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True, text=True).stdout.split()
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    ctl = subprocess.run(["pgrep", "-f", "osken-manager"], capture_output=True, text=True).stdout.split()
    servers = subprocess.run(["pgrep", "-f", "workers.site_server"], capture_output=True, text=True).stdout.split()
    iperf = subprocess.run(["pgrep", "-x", "iperf3"], capture_output=True, text=True).stdout.split()
    return {"bridges": len([b for b in bridges if re.fullmatch(r"s\d+", b)]),
            "veths": len(re.findall(r"^\d+: s\d+-eth\d+", links, flags=re.M)),
            "controllers": len(ctl), "site servers": len(servers), "iperf3": len(iperf)}


def config(n: int, seed: int) -> dict[str, Any]:
    tasks = 4
    raw: dict[str, Any] = {
        "name": "bench-faults", "topology": "sndlib/nobel-us", "mode": "online", "schedulers": ["mst"],
        "locals": [3, 4], "seed": seed,
        "online": {"tasks": tasks, "arrival": "all", "seed": seed},
        "task": {"model": "mlp", "model_args": {"hidden": 100}, "rounds": 60 * n + 120, "demand_mbps": 1000},
        "emulation": {"max_link_mbps": 100, "backend": "process"},
        "background": {"enabled": True, "load": 0.2, "pairs": 4},
        "reschedule": {"policies": ["on_failure"]},
    }
    cfg = parse_config(raw)
    trace = arrival_trace(cfg, cfg.network(), 1)
    gs = {t.global_site for _, t in trace}
    leaves = sorted({s for _, t in trace for s in t.local_sites} - gs)
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    t = 4.0
    for k in range(n):
        events.append({"at_s": t, "action": "link_down", "on_task": 1 + k % tasks})
        events.append({"at_s": t + 3, "action": "link_up", "on_task": 1 + k % tasks})
        events.append({"at_s": t + 5, "action": "server_kill", "site": rng.choice(leaves), "restart_after_s": 2})
        events.append({"at_s": t + 9, "action": "controller_restart"})
        events.append({"at_s": t + 12, "action": "background", "load": 0.4 if k % 2 == 0 else 0.1})
        t += 15.0
    raw["events"] = events
    return raw


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--faults", type=int, default=2, help="faults of each kind (default 2)")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--keep", action="store_true", help="keep the run folder")
    args = ap.parse_args()
    cfg = parse_config(config(args.faults, args.seed))
    out = Path(tempfile.mkdtemp(prefix="netai-bench-faults-"))
    t0 = time.monotonic()
    outcome = run_experiment(cfg, out_root=out, progress=False)
    wall = time.monotonic() - t0
    time.sleep(1.0)
    left = leftovers()
    conn = sqlite3.connect(outcome.run_dir / "results.db")
    q = lambda sql: conn.execute(sql).fetchall()  # noqa: E731
    # events the trace ended before are recorded as not applied (not ok): counted apart, not as injected
    late = f"(detail LIKE '{NOT_APPLIED}%')"
    injected = q(f"SELECT action, COUNT(*) - SUM({late}), SUM(ok), SUM({late}) FROM faults GROUP BY action ORDER BY action")
    states = dict(q("SELECT state, COUNT(*) FROM tasks GROUP BY state"))
    moves = q("SELECT reason, interruption_s FROM moves")
    gaps = [g for _, g in moves if g is not None]
    print(f"fault benchmark: NSFNET, {len(arrival_trace(cfg, cfg.network(), 1))} tasks, {args.faults} faults of each "
          f"kind, policy on_failure; run {outcome.status} in {wall:.0f} s")
    for action, count, ok, late in injected:
        print(f"  injected {action:<18} {count:>3}  ({count - (ok or 0)} could not be"
              f"{f'; {late} not applied: the trace had ended' if late else ''})")
    print(f"  faults injected         {sum(c for _, c, _, _ in injected)}")
    print(f"  tasks completed         {states.get('done', 0)}")
    print(f"  tasks lost              {states.get('failed', 0)} (blocked {states.get('blocked', 0)})")
    print(f"  moves (rounds retried)  {len(moves)}: "
          + ", ".join(sorted({r.split(' ')[0] for r, _ in moves})))
    print(f"  mean interruption       {sum(gaps) / len(gaps):.3f} s over {len(gaps)} moves" if gaps
          else "  mean interruption       - (no move)")
    print(f"  leftovers after teardown {sum(left.values())} {left}")
    if not args.keep:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    else:
        print(f"  run folder: {outcome.run_dir}")
    return 0 if states.get("failed", 0) == 0 and sum(left.values()) == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
