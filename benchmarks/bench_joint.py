"""Benchmark: the ``joint`` scheduler against network-only ``mst``, by predicted round time.

No emulation: both schedulers place the same seeded tasks on NSFNET (sndlib/nobel-us), and each
schedule's round is predicted with `orchestrator.scheduling.joint.predict_round` (training on the
sites given their CPU load, from a task profile measured on this machine with the workers' model
code, plus cost.py's communication). Printed per scenario: the ratio joint / mst of the predicted
round (below 1: joint is faster), as mean, min and max over the tasks, and how many tasks joint
makes at least 1% faster; then joint / joint blind to the sites' load (``site_load=False``: the
best tree for the network alone, by the same prediction), which isolates what weighing the sites'
CPU load adds to picking a low-latency tree.

Scenarios (every site of NSFNET has 1 core):

- ``idle``: no other load; each task alone on the network;
- ``loaded``: every site carries a seeded background CPU load of 0 to 2 cores;
- ``hot-spot``: three seeded sites carry 4 cores each (a role there gets a fifth of a core),
  the others are idle; split by whether a local of the task is on a hot site (no tree can make
  that local train faster: locals are the task's, not the scheduler's);
- ``running``: the tasks arrive one after another and stay: each scheduler admits them on its
  own state, so earlier tasks' training, aggregation and reservations load the later ones.
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable
from pathlib import Path

from orchestrator.runtime.profiles import load_profile, training_profile
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.joint import TrainingProfile, predict_round
from orchestrator.scheduling.tasks import Task, generate_tasks
from topologies.loaders import load
from topologies.model import NetworkModel


def background(model: NetworkModel, scenario: str, seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    if scenario == "loaded":
        return {s: round(rng.uniform(0.0, 2.0), 3) for s in model.sites}
    if scenario == "hot-spot":
        return dict.fromkeys(rng.sample(model.site_names, 3), 4.0)
    return {}


NAMES = ("mst", "blind", "joint")


def rounds(model: NetworkModel, tasks: list[Task], scenario: str, profile: TrainingProfile) -> list[dict[str, float]]:
    """Predicted round seconds per task and scheduler (mst, joint blind to site load, joint),
    always on the true load."""
    schedulers = {
        "mst": get_scheduler("mst"),
        "blind": get_scheduler("joint", profile=profile, site_load=False),
        "joint": get_scheduler("joint", profile=profile),
    }
    out: list[dict[str, float]] = []
    if scenario == "running":
        states = {name: NetworkState(model) for name in NAMES}
        for task in tasks:
            got: dict[str, float] = {}
            for name, sch in schedulers.items():
                s = sch.schedule(states[name], task)
                if s.blocked:
                    continue
                got[name] = predict_round(states[name], task, s, profile).round_s
                states[name].admit(s)
            if len(got) == len(NAMES):
                out.append(got)
        return out
    for k, task in enumerate(tasks):
        state = NetworkState(model)
        state.set_background_cpu(background(model, scenario, seed=k))
        row = {name: predict_round(state, task, sch.schedule(state, task), profile).round_s
               for name, sch in schedulers.items()}
        row["hot_local"] = float(any(state.cpu_share(site, 1.0) < 0.5 for site in task.local_sites))
        out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="cnn", help="model whose training is profiled (default cnn)")
    ap.add_argument("--model-bytes", type=int, default=10_000_000, help="model size on the wire (default 10 MB)")
    ap.add_argument("--tasks", type=int, default=30)
    ap.add_argument("--locals", type=int, default=5)
    ap.add_argument("--cache", type=Path, default=None, help="profile cache file (default: the user's cache)")
    args = ap.parse_args()

    measured = load_profile(args.model, cache=args.cache)
    profile = training_profile(measured)
    nsfnet = load("sndlib/nobel-us")
    tasks = generate_tasks(nsfnet, count=args.tasks, locals_per_task=args.locals, seed=7,
                           model_name=args.model, model_bytes=args.model_bytes)
    print(f"profile of {args.model} (measured on this machine): {measured.train_cpu_s_per_round * 1e3:.2f} "
          f"CPU ms per round + {measured.train_cpu_s_per_example * 1e6:.1f} "
          f"CPU us per example, {measured.aggregate_cpu_s_per_mb * 1e3:.2f} CPU ms per MB aggregated; "
          f"{profile.examples_per_round} examples per round, {args.model_bytes / 1e6:g} MB on the wire")
    print(f"{args.tasks} tasks with {args.locals} locals on NSFNET; ratio = joint / mst predicted round time")
    print(f"{'':<10}{'':>6}{'':>9}{'':>10}{'joint / mst':^30}{'joint / blind joint':^30}")
    print(f"{'scenario':<10}{'tasks':>6}{'mst ms':>9}{'joint ms':>10}"
          + f"{'mean':>7}{'min':>7}{'max':>7}{'faster':>9}" * 2)
    mean: Callable[[list[float]], float] = statistics.fmean
    for scenario in ("idle", "loaded", "hot-spot", "running"):
        rows = rounds(nsfnet, tasks, scenario, profile)
        line = (f"{scenario:<10}{len(rows):>6}{mean([r['mst'] for r in rows]) * 1e3:>9.1f}"
                f"{mean([r['joint'] for r in rows]) * 1e3:>10.1f}")
        for base in ("mst", "blind"):
            ratio = [r["joint"] / r[base] for r in rows]
            faster = sum(1 for x in ratio if x < 0.99)
            line += f"{mean(ratio):>7.3f}{min(ratio):>7.3f}{max(ratio):>7.3f}{f'{faster}/{len(rows)}':>9}"
        print(line)
        if scenario == "hot-spot":
            for hot, what in ((1.0, "a hot local"), (0.0, "no hot local")):
                ratio = [r["joint"] / r["mst"] for r in rows if r["hot_local"] == hot]
                if ratio:
                    print(f"  {len(ratio)} tasks with {what}: joint / mst mean {mean(ratio):.3f}, "
                          f"max {max(ratio):.3f}")


if __name__ == "__main__":
    main()
