"""Data-plane figures, measured in one run on this machine and printed as ratios.

- pipelining: ring:14, 8 locals, a ~2.8 MB model, links shaped at 20 Mbit/s, mst: the broadcast
  (round start to the last local holding the model) and the upload (the last training's end to
  G holding the aggregate), each over S/B; store-and-forward would give about the tree's depth;
- bound: NSFNET, 8 locals, a transfer-dominated model: round latency over the round's lower bound
  (`orchestrator.scheduling.cost`), median per scheduler, with the links at 25 and at 50 Mbit/s at
  K = 1 and at 50 Mbit/s at time dilation K = 2, and the host's CPU busy share over each run (at
  K = 1 a 2-core host does not keep up with 50: the figure there is the host's, and K = 2 gives the
  configured network's; docs/measurements/index.md, "The data plane at K = 1 and 2");
- stalls: NSFNET, 8 locals, spff and mst, background traffic on, many rounds of a small model:
  the largest round over the median round of its task;
- isolation: a task's broadcast time with iperf3 saturating the links it uses, over the same
  without (the task's reservation is its own htb class on every link).

Usage: ``sudo .venv/bin/python benchmarks/bench_dataplane.py [--only NAME] [--rounds-stall N] [--bound RATE[@K] ...]``.
Runs one Mininet at a time; needs root, Open vSwitch and the project's venv.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.emulation.background import wait_listening  # noqa: E402
from orchestrator.emulation.cpu_use import host_busy  # noqa: E402
from orchestrator.emulation.network import Emulation  # noqa: E402
from orchestrator.lifecycle.recorder import round_bound  # noqa: E402
from orchestrator.runtime.backends import open_compute  # noqa: E402
from orchestrator.runtime.compute import ComputeManager, check_model  # noqa: E402
from orchestrator.runtime.summaries import TaskResult  # noqa: E402
from orchestrator.runtime.task_runner import FLOptions, run_task  # noqa: E402
from orchestrator.runtime.timing import task_timing  # noqa: E402
from orchestrator.scheduling import NetworkState, Schedule, get_scheduler  # noqa: E402
from orchestrator.scheduling.cost import emulated_rate, round_figures  # noqa: E402
from orchestrator.scheduling.tasks import generate_tasks  # noqa: E402
from topologies.loaders import load  # noqa: E402
from topologies.model import NetworkModel  # noqa: E402
from topologies.plan import EmulationPlan  # noqa: E402

MODEL_ARGS = {"hidden": 800, "layers": 2}  # 2.8 MB of float32 weights


def _model_bytes(model_args: dict[str, Any]) -> int:
    return check_model("mlp", model_args)


_MANAGERS: dict[int, ComputeManager] = {}


@contextlib.contextmanager
def _emulation(plan: EmulationPlan, log_root: Path) -> Iterator[Emulation]:
    """The emulation with a site server on every host (the process backend)."""
    with Emulation(plan) as emu, open_compute("process", emu, log_root=log_root) as manager:
        _MANAGERS[id(emu)] = manager
        try:
            yield emu
        finally:
            _MANAGERS.pop(id(emu), None)


def _run(emu: Emulation, model: NetworkModel, schedule: Schedule, *, rounds: int, model_args: dict[str, Any],
         model_bytes: int, log_dir: Path) -> TaskResult:
    rate = emulated_rate(emu.plan)
    timing = task_timing(model, schedule, model_bytes, rate=rate, train_allowance_s=30.0,
                         time_dilation=emu.plan.time_dilation)
    manager = _MANAGERS[id(emu)]
    emu.install_task(schedule)
    try:
        return run_task(schedule, manager=manager, log_dir=manager.task_dir(log_dir.name), timing=timing,
                        options=FLOptions(model="mlp", model_args=model_args, rounds=rounds, local_epochs=1))
    finally:
        emu.client.remove_task(schedule.task_id)


def _schedule(model: NetworkModel, name: str, locals_: int, seed: int, model_bytes: int,
              demand_mbps: float = 1000.0) -> Schedule:
    task = generate_tasks(model, count=1, locals_per_task=locals_, seed=seed, model_bytes=model_bytes,
                          demand_mbps=demand_mbps)[0]
    s = get_scheduler(name).schedule(NetworkState(model), task)
    if s.blocked:
        raise SystemExit(f"{name} blocked the benchmark task: {s.reason}")
    return s


def pipelining(tmp: Path) -> None:
    model = load("ring:14")
    plan = EmulationPlan.from_model(model, max_link_mbps=20)
    s_bytes = _model_bytes(MODEL_ARGS)
    sched = _schedule(model, "mst", 8, 3, s_bytes)
    sb = s_bytes * 8 / (min(ln.emulated_mbps for ln in plan.links) * 1e6)
    with _emulation(plan, tmp / "servers") as emu:
        res = _run(emu, model, sched, rounds=4, model_args=MODEL_ARGS, model_bytes=s_bytes, log_dir=tmp / "pipe")
    bc = statistics.median(r.broadcast_all_s for r in res.rounds) / sb
    up = statistics.median(r.upload_tail_s for r in res.rounds) / sb
    print(f"pipelining (ring:14, 8 locals, mst, {s_bytes / 1e6:.1f} MB, 20 Mbit/s, tree depth "
          f"{sched.depth('broadcast')}/{sched.depth('upload')}, chunks of {res.chunk_bytes} B): "
          f"broadcast / (S/B) median {bc:.2f}, upload / (S/B) median {up:.2f} (target <= 1.3)")


#: Rounds per scheduler in the bound run: enough for a median that one slow round cannot move.
BOUND_ROUNDS = 8


#: The bound runs (``--bound``): the links' largest configured rate, Mbit/s, and the time dilation K
#: it runs at (the links carry rate / K in wall time, `EmulationPlan.dilated`).
BOUND_RUNS = ((25.0, 1.0), (50.0, 1.0), (50.0, 2.0))


def bound_run(text: str) -> tuple[float, float]:
    """One ``--bound`` value, ``RATE`` or ``RATE@K`` (K defaults to 1), checked before anything starts."""
    rate_s, at, k_s = text.partition("@")
    try:
        rate, k = float(rate_s), float(k_s) if at else 1.0
    except ValueError:
        raise argparse.ArgumentTypeError(f"not RATE or RATE@K: {text!r}") from None
    if not (0 < rate < math.inf and 1 <= k < math.inf):
        raise argparse.ArgumentTypeError(f"the rate must be finite and > 0, K finite and >= 1: {text!r}")
    return rate, k


def _busy_ticks() -> tuple[int, int]:
    """(busy, all) CPU ticks of the host since boot."""
    ticks = host_busy()
    if ticks is None:
        raise SystemExit("bench_dataplane: cannot read the host's CPU ticks (/proc/stat)")
    return ticks


def bound(tmp: Path, link_mbps: float, k: float = 1.0) -> None:
    model = load("sndlib/nobel-us")
    plan = EmulationPlan.from_model(model, max_link_mbps=link_mbps).dilated(k)
    args = {"hidden": 1200, "layers": 2}
    s_bytes = _model_bytes(args)
    with _emulation(plan, tmp / "servers") as emu:
        for name in ("spff", "mst", "steiner"):
            sched = _schedule(model, name, 8, 5, s_bytes)
            busy0, all0 = _busy_ticks()
            res = _run(emu, model, sched, rounds=BOUND_ROUNDS, model_args=args, model_bytes=s_bytes,
                       log_dir=tmp / f"b-{name}-{link_mbps:g}-k{k:g}")
            busy1, all1 = _busy_ticks()
            fig = round_figures(model, sched, s_bytes, rate=emulated_rate(plan), propagation=False)
            lb = fig.lower_bound
            bounds = [round_bound(fig, sched, r) for r in res.rounds]
            ratios = [r.latency_s / b.lower_s for r, b in zip(res.rounds, bounds, strict=True)]
            alone = [r.latency_s / replace(b, joint_s=0.0).lower_s for r, b in zip(res.rounds, bounds, strict=True)]
            bc = [r.broadcast_all_s / lb.broadcast_s for r in res.rounds]
            # the ratio is of two wall times at the same K (the bound at the links' wall rates): K cancels
            print(f"bound (NSFNET, 8 locals, {s_bytes / 1e6:.1f} MB at {link_mbps:g} Mbit/s, K = {k:g}): {name} "
                  f"latency / lower bound "
                  f"median {statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f}; over the "
                  f"procedures' bounds alone "
                  f"{statistics.median(alone):.2f}), broadcast / its bound median {statistics.median(bc):.2f} "
                  f"over {len(ratios)} rounds, {sum(b.joint_s > 0 for b in bounds)} with every local trained, "
                  f"host CPU busy {(busy1 - busy0) / max(1, all1 - all0):.0%} (target <= 1.25)")


def stalls(tmp: Path, rounds: int) -> None:
    from orchestrator.emulation.background import BackgroundConfig, BackgroundTraffic, plan_background

    model = load("sndlib/nobel-us")
    plan = EmulationPlan.from_model(model, max_link_mbps=100)
    args = {"hidden": 64}
    s_bytes = _model_bytes(args)
    cfg = BackgroundConfig(load=0.3, pairs=6)
    worst = []
    with _emulation(plan, tmp / "servers") as emu:
        flows = plan_background(model, plan, cfg, topology="sndlib/nobel-us", seed=1)
        emu.client.set_background([[f.src, f.dst] for f in flows])
        traffic = BackgroundTraffic(emu.host, flows, cfg, seed=1, log_dir=tmp / "bg")
        traffic.start()
        try:
            for name in ("spff", "mst"):
                sched = _schedule(model, name, 8, 7, s_bytes)
                res = _run(emu, model, sched, rounds=rounds, model_args=args, model_bytes=s_bytes,
                           log_dir=tmp / f"s-{name}")
                lat = [r.latency_s for r in res.rounds]
                worst.append(max(lat) / statistics.median(lat))
                print(f"stalls (NSFNET, 8 locals, {name}, background on): {len(lat)} rounds, largest / median round "
                      f"{worst[-1]:.2f} (target < 3), median {statistics.median(lat) * 1e3:.1f} ms")
        finally:
            traffic.stop()


def isolation(tmp: Path) -> None:
    model = load("ring:6")
    plan = EmulationPlan.from_model(model, max_link_mbps=30)
    s_bytes = _model_bytes(MODEL_ARGS)
    # each path reserves one whole lightpath (a demand fits one wavelength) on every link it crosses
    lightpath = min(ln.wavelength_mbps for ln in model.iter_links())
    sched = _schedule(model, "mst", 3, 11, s_bytes, demand_mbps=lightpath)
    reserved = sched.demand_mbps * plan.bw_scale
    with _emulation(plan, tmp / "servers") as emu:
        quiet = _run(emu, model, sched, rounds=3, model_args=MODEL_ARGS, model_bytes=s_bytes, log_dir=tmp / "i0")
        # saturate every directed link the task's broadcast uses, with iperf3 between its end hosts
        pairs = sorted({(e.path[0], e.path[-1]) for e in sched.edges_of("broadcast")})
        emu.client.set_background([list(p) for p in pairs])
        servers, clients = [], []
        for i, (_a, b) in enumerate(pairs):
            port = str(5300 + i)
            servers.append(emu.host(b).popen(["iperf3", "-s", "-1", "-p", port, "-B", emu.host(b).IP()]))
        # every server listening before its client starts (a refused client would leave a link idle)
        wait_listening([(p, emu.host(b).IP(), 5300 + i, b) for i, (p, (_a, b)) in enumerate(zip(servers, pairs,
                                                                                               strict=True))])
        for i, (a, b) in enumerate(pairs):
            clients.append(emu.host(a).popen(["iperf3", "-c", emu.host(b).IP(), "-p", str(5300 + i), "-t", "60",
                                              "-P", "4"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        try:
            busy = _run(emu, model, sched, rounds=3, model_args=MODEL_ARGS, model_bytes=s_bytes, log_dir=tmp / "i1")
        finally:
            for p in clients + servers:
                p.kill()
                p.wait()
    quiet_s = statistics.median(r.broadcast_all_s for r in quiet.rounds)
    busy_s = statistics.median(r.broadcast_all_s for r in busy.rounds)
    print(f"isolation (ring:6, 30 Mbit/s links, reserved {reserved:.1f} Mbit/s per path): broadcast with saturating "
          f"background / without: {busy_s / quiet_s:.2f} (target <= 1.15)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=("pipelining", "bound", "stalls", "isolation"))
    parser.add_argument("--rounds-stall", type=int, default=250, help="rounds per scheduler in the stall run")
    parser.add_argument("--bound", type=bound_run, nargs="+", default=list(BOUND_RUNS), metavar="RATE[@K]",
                        help="the bound runs: the links' largest rate, Mbit/s, each at time dilation K (default 1)")
    parser.add_argument("--keep", type=Path, help="keep the agents' logs in this directory")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_dataplane: run as root (it starts Mininet)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="netai-bench-dp-") as d:
        tmp = args.keep or Path(d)
        def bounds(t: Path) -> None:
            for mbps, k in args.bound:
                bound(t, mbps, k)

        for name, fn in (("pipelining", pipelining), ("bound", bounds), ("isolation", isolation)):
            if args.only in (None, name):
                fn(tmp)
        if args.only in (None, "stalls"):
            stalls(tmp, args.rounds_stall)
    return 0


if __name__ == "__main__":
    sys.exit(main())
