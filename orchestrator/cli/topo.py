"""`netai topo show`, `netai schedule` and `netai compare`: the network model and the schedulers,
analytically (no emulation, no root).

``netai schedule --install`` also installs the schedule's paths on the running network (``netai net
up``, found like ``netai flows`` finds it): scheduled on that network's topology and on what its
installed tasks reserve, under a task id no installed task has; ``netai schedule --remove TASK_ID``
removes a task's paths from it. Both talk to its controller only (loopback), no root needed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Sequence
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.scheduling import (
    SCHEDULERS,
    NetworkState,
    Schedule,
    SchedulerSpec,
    get_scheduler,
    resolve_scheduler,
    resolve_schedulers,
)
from orchestrator.scheduling.cost import round_lower_bound
from orchestrator.scheduling.tasks import (
    DEFAULT_DEMAND_MBPS,
    DEFAULT_MODEL_BYTES,
    Task,
    generate_tasks,
    validate_task,
)
from topologies.loaders import DEFAULT_TOPOLOGY, load
from topologies.model import NetworkModel


def parse_range(text: str) -> list[int]:
    """``"1..13"``, ``"2,4,8"`` or ``"5"`` -> a list of positive integers."""
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split("..", 1))
            values = list(range(lo, hi + 1))
        else:
            values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"bad range {text!r}: use A..B, A,B,C or N") from None
    if not values or min(values) < 1:
        raise ConfigError(f"bad range {text!r}: needs positive integers")
    return values


def _csv(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _schedulers(text: str) -> list[SchedulerSpec]:
    """Comma-separated scheduler specs (names, module:Class, path/file.py:Class from the working
    directory), resolved and checked; labels must be unique."""
    return list(resolve_schedulers(_csv(text)))


# -- topo show ------------------------------------------------------------------------------------
def cmd_topo_show(args: argparse.Namespace) -> int:
    model = load(args.name)
    if args.json:
        print(json.dumps({"summary": model.summary(), **model.to_dict()}, indent=2))
        return 0
    s = model.summary()
    print(f"topology {s['name']}: {s['sites']} sites ({s['compute_sites']} with compute), "
          f"{s['links']} links, diameter {s['diameter_hops']} hops")
    print(f"{'site':<22}{'compute':>8}{'cpu':>6}{'degree':>8}")
    for site in model.sites.values():
        print(f"{site.name:<22}{'yes' if site.has_compute else 'no':>8}{site.cpu:>6g}"
              f"{model.graph.degree[site.name]:>8}")
    print(f"{'link':<36}{'km':>9}{'delay ms':>10}{'wl':>4}{'Gbit/s':>8}")
    for ln in model.iter_links():
        print(f"{ln.a + ' - ' + ln.b:<36}{ln.length_km:>9.1f}{ln.delay_ms:>10.3f}{ln.wavelengths:>4}"
              f"{ln.capacity_mbps / 1000:>8g}")
    return 0


# -- schedule -------------------------------------------------------------------------------------
def _task_from_args(model: NetworkModel, args: argparse.Namespace) -> Task:
    if args.global_site or args.local_sites:
        if not (args.global_site and args.local_sites):
            raise ConfigError("--global and --local-sites go together")
        if args.locals is not None:
            raise ConfigError("give either --locals/--seed or --global/--local-sites, not both")
        task = Task(
            id=args.task_id,
            global_site=args.global_site,
            local_sites=tuple(_csv(args.local_sites)),
            demand_mbps=args.demand_mbps,
            model_bytes=args.model_bytes,
        )
        validate_task(model, task)
        return task
    if args.locals is None:
        raise ConfigError("give --locals N (with --seed K) or --global SITE --local-sites A,B,...")
    return generate_tasks(
        model, count=1, locals_per_task=args.locals, seed=args.seed, first_id=args.task_id,
        demand_mbps=args.demand_mbps, model_bytes=args.model_bytes,
    )[0]


def schedule_report(model: NetworkModel, schedule: Schedule, model_bytes: int) -> dict[str, Any]:
    out = schedule.to_dict()
    if not schedule.blocked:
        for name, pipelined in (("lower_bound", True), ("store_and_forward_bound", False)):
            b = round_lower_bound(model, schedule, model_bytes, pipelined=pipelined)
            # a lower bound overlaps the procedures (RoundBound.lower_s); store-and-forward runs them in turn
            out[name] = {"broadcast_s": b.broadcast_s, "upload_s": b.upload_s,
                         "total_s": b.lower_s if pipelined else b.total_s}
    return out


def cmd_schedule(args: argparse.Namespace) -> int:
    if args.remove is not None:
        return _remove_installed(args)
    if args.install:
        return _schedule_and_install(args)
    model = load(args.topology or DEFAULT_TOPOLOGY)
    args.task_id = 1 if args.task_id is None else args.task_id
    scheduler = get_scheduler(args.scheduler, **({"weight": "hops"} if args.hops else {}))
    task = _task_from_args(model, args)
    schedule = scheduler.schedule(NetworkState(model), task)
    report = schedule_report(model, schedule, task.model_bytes)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    _print_schedule(model, task, schedule, report)
    return 0


def _print_schedule(model: NetworkModel, task: Task, schedule: Schedule, report: dict[str, Any]) -> None:
    print(f"task {task.id} on {model.name}: G={task.global_site}, locals={', '.join(task.local_sites)}")
    if schedule.blocked:
        print(f"BLOCKED by {schedule.scheduler}: {schedule.reason}")
        return
    print(f"scheduler {schedule.scheduler}: reserved {schedule.reserved_mbps_total:g} Mbit/s, "
          f"aggregation at {', '.join(sorted(schedule.aggregation_sites))}")
    for e in schedule.edges:
        print(f"  {e.procedure:<9} {e.src:>18} -> {e.dst:<18} wl {e.wavelength}  via {'-'.join(e.path)}")
    lb = report["lower_bound"]
    print(f"round lower bound (pipelined): {lb['total_s'] * 1e3:.3f} ms "
          f"(broadcast {lb['broadcast_s'] * 1e3:.3f}, upload {lb['upload_s'] * 1e3:.3f}); "
          f"store-and-forward {report['store_and_forward_bound']['total_s'] * 1e3:.3f} ms")


def _controller_error(e: Exception) -> int:
    """A controller that refused or did not answer: one line, exit status 1 (nothing was changed by us)."""
    print(f"netai: error: {getattr(e, 'message', None) or e}", file=sys.stderr)
    return 1


def _schedule_and_install(args: argparse.Namespace) -> int:
    """``--install``: schedule on the running network's topology and reservations, install the paths."""
    from orchestrator.emulation.controller_client import ControllerHTTPError, ControllerUnreachable
    from orchestrator.emulation.running import find_running
    from orchestrator.emulation.task_paths import task_paths

    net = find_running(args.url)
    model = net.model(args.topology)
    scheduler = get_scheduler(args.scheduler, **({"weight": "hops"} if args.hops else {}))
    try:
        with net.install_lock():
            installed_ids = {int(t["task_id"]) for t in net.installed()}
            if args.task_id is None:
                args.task_id = net.free_task_id()
            elif args.task_id in installed_ids:
                raise ConfigError(f"task {args.task_id} is already installed on {net.name}: remove it first "
                                  f"(netai schedule --remove {args.task_id}) or leave --task-id out")
            task = _task_from_args(model, args)
            schedule = scheduler.schedule(net.network_state(model), task)
            report = schedule_report(model, schedule, task.model_bytes)
            summary = None if schedule.blocked else \
                net.client.install_task(task_paths(schedule, bw_scale=net.plan.bw_scale))
    except (ControllerHTTPError, ControllerUnreachable) as e:
        return _controller_error(e)
    if args.json:
        print(json.dumps({**report, "run": net.name, "installed": summary}, indent=2))
    else:
        _print_schedule(model, task, schedule, report)
        if summary is not None:
            res = summary.get("reservation", {})
            print(f"installed as task {task.id} on {net.name}: {summary['entries']} entries on "
                  f"{len(summary['switches'])} switches; reservation "
                  f"{'enforced' if res.get('enforced') else 'NOT enforced'} ({res.get('reason', '')}); "
                  f"remove with: netai schedule --remove {task.id}")
    return 1 if summary is None else 0


def _remove_installed(args: argparse.Namespace) -> int:
    """``--remove TASK_ID``: remove an installed task's paths (entries and classes) from the running network."""
    from orchestrator.emulation.controller_client import ControllerHTTPError, ControllerUnreachable
    from orchestrator.emulation.running import find_running

    net = find_running(args.url)
    try:
        summary = net.client.remove_task(args.remove)
    except ControllerHTTPError as e:
        if e.status == 404:
            raise ConfigError(e.message) from e
        return _controller_error(e)
    except ControllerUnreachable as e:
        return _controller_error(e)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"removed task {args.remove} from {net.name}: {summary['entries']} entries on "
              f"{len(summary['switches'])} switches")
    return 0


# -- compare --------------------------------------------------------------------------------------
def compare(
    model: NetworkModel,
    *,
    schedulers: Sequence[str | SchedulerSpec],
    locals_range: list[int],
    tasks: int,
    seed: int,
    demand_mbps: float,
    model_bytes: int,
    optimum: bool = False,
    time_limit_s: float = 60.0,
) -> list[dict[str, Any]]:
    """For each scheduler and number of locals, schedule `tasks` seeded tasks one after another
    on one network state (reservations accumulate, as in the paper's 30-task evaluation).

    `schedulers` are specs (see `orchestrator.scheduling.plugins`), resolved or not. Returns one row
    per (scheduler label, locals) with the mean and spread over admitted tasks of the
    reserved bandwidth and the pipelined round lower bound, and the number of blocked tasks.

    With `optimum`, each admitted task is also solved exactly on the same state the scheduler saw
    (`orchestrator.scheduling.ilp.pareto_front`, HiGHS, `time_limit_s` per solve), and the row adds
    the mean over those tasks of the scheduler's reserved bandwidth over the optimum's
    (``optimum_ratio_mean``, 1 = optimal), of its bandwidth over the front's bandwidth at its own
    chain latency (``front_ratio_mean``: 1 = on the front, above = a tree as fast and cheaper
    exists), its mean chain latency, and how many of the tasks' solves proved optimality.
    """
    specs = [s if isinstance(s, SchedulerSpec) else resolve_scheduler(s) for s in schedulers]
    rows = []
    for n in locals_range:
        task_set = generate_tasks(
            model, count=tasks, locals_per_task=n, seed=seed + n, demand_mbps=demand_mbps,
            model_bytes=model_bytes,
        )
        for spec in specs:
            row: dict[str, Any] = {"scheduler": spec.label, "locals": n, "tasks": tasks}
            row |= _compare_one(model, spec, task_set, model_bytes, optimum=optimum, time_limit_s=time_limit_s)
            rows.append(row)
    return rows


def _compare_one(model: NetworkModel, spec: SchedulerSpec, task_set: list[Task], model_bytes: int, *,
                 optimum: bool, time_limit_s: float) -> dict[str, Any]:
    """One scheduler over one task set on a fresh network state: the figures of a `compare` row."""
    from orchestrator.scheduling.ilp import chain_latency_ms, front_bandwidth_at, pareto_front

    scheduler = spec.build()
    state = NetworkState(model)
    reserved, bounds, blocked = [], [], 0
    opt_ratio: list[float] = []
    front_ratio: list[float] = []
    latency: list[float] = []
    proven = 0
    for task in task_set:
        s = scheduler.schedule(state, task)
        if s.blocked:
            blocked += 1
            continue
        if optimum:
            front = pareto_front(state, task, time_limit_s=time_limit_s)
            lat = chain_latency_ms(model, s)
            latency.append(lat)
            if front:
                opt_ratio.append(s.reserved_mbps_total / min(p.reserved_mbps for p in front))
                proven += all(p.proven_optimal for p in front)
                at = front_bandwidth_at(front, lat)
                if at is not None:
                    front_ratio.append(s.reserved_mbps_total / at)
        state.admit(s)
        reserved.append(s.reserved_mbps_total)
        bounds.append(round_lower_bound(model, s, model_bytes).lower_s)
    row: dict[str, Any] = {
        "blocked": blocked,
        "reserved_mbps_mean": statistics.fmean(reserved) if reserved else None,
        "reserved_mbps_stdev": statistics.pstdev(reserved) if reserved else None,
        "lower_bound_ms_mean": statistics.fmean(bounds) * 1e3 if bounds else None,
        "lower_bound_ms_stdev": statistics.pstdev(bounds) * 1e3 if bounds else None,
    }
    if optimum:
        row.update({
            "optimum_ratio_mean": statistics.fmean(opt_ratio) if opt_ratio else None,
            "front_ratio_mean": statistics.fmean(front_ratio) if front_ratio else None,
            "chain_latency_ms_mean": statistics.fmean(latency) if latency else None,
            "optimum_proven": proven,
        })
    return row


def cmd_compare(args: argparse.Namespace) -> int:
    model = load(args.topology)
    specs = _schedulers(args.schedulers)
    names = [s.label for s in specs]
    rows = compare(
        model, schedulers=specs, locals_range=parse_range(args.locals), tasks=args.tasks,
        seed=args.seed, demand_mbps=args.demand_mbps, model_bytes=args.model_bytes,
        optimum=args.optimum, time_limit_s=args.time_limit,
    )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{model.name}: {args.tasks} tasks per point, demand {args.demand_mbps:g} Mbit/s, "
          f"model {args.model_bytes / 1e6:g} MB; reserved Gbit/s and pipelined round lower bound (ms) "
          f"per admitted task, mean (blocked tasks)")
    header = f"{'locals':>6}" + "".join(f"{n + ' Gbit/s':>16}{n + ' ms':>14}" for n in names)
    print(header)
    by = {(r["scheduler"], r["locals"]): r for r in rows}
    for n in parse_range(args.locals):
        line = f"{n:>6}"
        for name in names:
            r = by[(name, n)]
            if r["reserved_mbps_mean"] is None:
                line += f"{'-':>16}{'-':>14}"
                continue
            b = f" ({r['blocked']})" if r["blocked"] else ""
            line += f"{r['reserved_mbps_mean'] / 1000:>16.2f}{r['lower_bound_ms_mean']:>10.3f}{b:>4}"
        print(line)
    if args.optimum:
        _print_optimum(names, parse_range(args.locals), by)
    return 0


def _print_optimum(names: list[str], locals_range: list[int], by: dict[tuple[str, int], dict[str, Any]]) -> None:
    print("\nagainst the exact optimum (ILP, HiGHS), per admitted task, mean: reserved bandwidth / the "
          "optimum's, and / the Pareto front's at the scheduler's chain latency (1 = on the front); "
          "[tasks whose solves were not all proven optimal]")
    print(f"{'locals':>6}" + "".join(f"{n + ' x opt':>14}{n + ' x front':>16}" for n in names))
    for n in locals_range:
        line = f"{n:>6}"
        for name in names:
            r = by[(name, n)]
            if r["optimum_ratio_mean"] is None:
                line += f"{'-':>14}{'-':>16}"
                continue
            admitted = r["tasks"] - r["blocked"]
            unproven = f" [{admitted - r['optimum_proven']}]" if r["optimum_proven"] < admitted else ""
            front = "-" if r["front_ratio_mean"] is None else f"{r['front_ratio_mean']:.3f}"
            line += f"{r['optimum_ratio_mean']:>14.3f}{front + unproven:>16}"
        print(line)


def register(sub: argparse._SubParsersAction) -> None:
    topo = sub.add_parser("topo", help="inspect topologies")
    tsub = topo.add_subparsers(dest="topo_command", metavar="ACTION")
    tsub.required = True
    show = tsub.add_parser("show", help="print a topology's sites and links")
    show.add_argument("name", nargs="?", default=DEFAULT_TOPOLOGY,
                      help="TopoHub key, generator (ring:N, spine-leaf:S:L, random:N[:SEED]), built-in name or file")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=cmd_topo_show)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--topology", default=DEFAULT_TOPOLOGY)
        p.add_argument("--demand-mbps", type=float, default=DEFAULT_DEMAND_MBPS,
                       help="bandwidth reserved per overlay edge (model units)")
        p.add_argument("--model-bytes", type=int, default=DEFAULT_MODEL_BYTES)
        p.add_argument("--seed", type=int, default=0)
        p.add_argument("--json", action="store_true")

    sch = sub.add_parser("schedule", help="schedule one task and print its trees, paths and reservations")
    common(sch)
    sch.add_argument("--scheduler", default="mst",
                     help=f"one of {', '.join(SCHEDULERS)}, module:Class or path/file.py:Class (docs/schedulers.md), "
                          "or optimum (exact, an ILP)")
    sch.add_argument("--locals", type=int, help="number of local models (random sites, see --seed)")
    sch.add_argument("--global", dest="global_site", help="site of the global model")
    sch.add_argument("--local-sites", help="comma-separated sites of the local models")
    sch.add_argument("--task-id", type=int, default=None,
                     help="task id (default 1; with --install, one above every installed task's)")
    sch.add_argument("--hops", action="store_true", help="weigh every link 1 instead of by delay/load")
    live = sch.add_mutually_exclusive_group()
    live.add_argument("--install", action="store_true",
                      help="schedule on the running network (netai net up) and install the paths there")
    live.add_argument("--remove", type=int, metavar="TASK_ID", help="remove a task's paths from the running network")
    sch.add_argument("--url", help="controller REST URL of the running network (default: the only one running)")
    # With --install the running network's topology is the default: tell an explicit --topology apart.
    sch.set_defaults(func=cmd_schedule, topology=None)

    cmp_ = sub.add_parser("compare", help="reserved bandwidth and round lower bound vs number of locals")
    common(cmp_)
    cmp_.add_argument("--locals", default="1..13", help="A..B, A,B,C or N")
    cmp_.add_argument("--tasks", type=int, default=30)
    cmp_.add_argument("--schedulers", default=",".join(SCHEDULERS),
                      help="comma-separated: registered names, module:Class or path/file.py:Class")
    cmp_.add_argument("--optimum", action="store_true",
                      help="also solve every task exactly (ILP, HiGHS): each scheduler's ratio to the "
                           "optimum and to the bandwidth-latency Pareto front")
    cmp_.add_argument("--time-limit", type=float, default=60.0, metavar="S",
                      help="with --optimum: HiGHS's time limit per solve, seconds (default 60)")
    cmp_.set_defaults(func=cmd_compare)
