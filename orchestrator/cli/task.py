"""``netai task run``: schedule one FL task on a topology and run it end to end.

Examples::

    netai task run --topology triangle --scheduler mst --locals 2 --rounds 3 --model mlp --backend loopback
    sudo netai task run --topology sndlib/nobel-us --scheduler mst --locals 8 --rounds 3 --model cnn --json

Backends (`orchestrator.runtime.backends`): ``loopback`` (no Mininet, no root: agents on 127.0.0.x), ``process``
(agents in Mininet hosts), ``docker`` (every host a worker container), ``auto`` (the default:
``docker`` when root, a Docker daemon and the worker image are there, else ``process`` as root,
else ``loopback``). The emulated backends bring up the emulation (Mininet + controller), install the
task's schedule, run the task, and tear everything down on every exit path.

``--attach`` runs the task on the network ``netai net up`` runs (as root, from another terminal)::

    sudo netai task run --attach --scheduler mst --locals 3 --rounds 3

It schedules on that network's topology and installed reservations, installs the task's paths,
starts site servers in the task's hosts (entering their network namespaces), reports each round as
it ends and removes the paths at the end (`orchestrator.experiment.attach`); ``netai flows --task
ID`` shows its entries meanwhile. When ``net up`` records a results database, the task goes there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.cli.dashboard import add_dashboard_args
from orchestrator.cli.learning import add_compute_args, add_learning_args, compute_options, learning_options
from orchestrator.errors import ConfigError
from orchestrator.runtime.timing import TRAIN_ALLOWANCE_S

DEFAULT_LOG_ROOT = Path(os.environ.get("NETAI_TASK_LOG_DIR", "/var/tmp/netai-tasks"))


def register(subparsers: Any) -> None:
    task = subparsers.add_parser("task", help="run one federated-learning task end to end")
    sub = task.add_subparsers(dest="task_command", metavar="SUBCOMMAND")
    sub.required = True
    run = sub.add_parser("run", help="schedule a task and run it (per-round latency breakdown and accuracy)",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--topology", help="topology name (e.g. triangle, sndlib/nobel-us); required unless "
                     "--attach (then default: the running network's)")
    run.add_argument("--scheduler", default="mst",
                     help="scheduler name, module:Class or path/file.py:Class (default mst; docs/schedulers.md)")
    run.add_argument("--locals", type=int, required=True, help="number of local models")
    add_learning_args(run)
    add_compute_args(run)
    run.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="keyword argument of the model factory (JSON value), repeatable")
    run.add_argument("--select", default="all", metavar="POLICY",
                     help="local-model selection policy: all (default), random, data_size, network_cost, "
                          "contribution, module:Class or file.py:Class (docs/selection.md)")
    run.add_argument("--select-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="an option of the selection policy (k, fraction, seed, metric); repeatable")
    run.add_argument("--backend", default="auto", choices=("auto", "docker", "process", "loopback"))
    run.add_argument("--log-dir", type=Path, default=None, help=f"default {DEFAULT_LOG_ROOT}/<time>-task<id>")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument("--attach", action="store_true",
                     help="run on the network `netai net up` runs (root): its hosts, its controller")
    run.add_argument("--url", help="with --attach: controller REST URL of the running network (default: the only one)")
    run.add_argument("--task-id", type=int, default=None,
                     help="with --attach: the task's id (default: one above every installed or recorded task's)")
    run.add_argument("--train-allowance", type=float, default=TRAIN_ALLOWANCE_S, metavar="S",
                     help="with --attach: what a round may spend training on top of its transfer timeouts, s")
    add_dashboard_args(run)
    run.set_defaults(func=cmd_run)


def _key_values(pairs: list[str], flag: str = "--model-arg") -> dict[str, Any]:
    """KEY=VALUE pairs of `flag` as a mapping (a value that parses as JSON is that JSON)."""
    out: dict[str, Any] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise ConfigError(f"{flag} takes KEY=VALUE, got {p!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _selection(args: argparse.Namespace) -> dict[str, Any] | None:
    """The task's selection config from --select and --select-arg, checked (None: all train)."""
    from orchestrator.runtime.task_runner import selection_settings
    from workers.config import normalize_spec

    selection = {"policy": normalize_spec(args.select), **_key_values(args.select_arg, "--select-arg")}
    selection_settings(selection)  # a bad policy or option: one line, exit 2, before anything starts
    return None if selection == {"policy": "all"} else selection


def resolve_backend(name: str) -> str:
    """``auto`` -> docker / process (as root) or loopback; an explicit emulated backend needs root."""
    from orchestrator.runtime.backends import pick_backend

    if name == "loopback":
        return name
    if os.geteuid() != 0:
        if name == "auto":
            return "loopback"
        raise ConfigError(f"the {name} backend runs in Mininet and needs root (or use --backend loopback)")
    return pick_backend(name)


def cmd_run(args: argparse.Namespace) -> int:
    from orchestrator.runtime.compute import check_model
    from orchestrator.runtime.summaries import TaskResult
    from orchestrator.runtime.task_runner import run_task
    from orchestrator.scheduling import NetworkState, get_scheduler
    from orchestrator.scheduling.tasks import generate_tasks
    from topologies.loaders import load
    from workers.models import normalize_spec

    args.model = normalize_spec(args.model)
    model_args = _key_values(args.model_arg)
    args.selection = _selection(args)
    options = learning_options(args, model_args=model_args, selection=args.selection)  # bad: one line, exit 2
    args.compute = compute_options(args)  # bad: one line, exit 2
    if args.attach:
        if args.dashboard:
            raise ConfigError("--dashboard goes with the network: `netai net up --dashboard` shows attached tasks")
        return _cmd_attach(args, options)
    if args.topology is None:
        raise ConfigError("--topology is required (or --attach, to run on the network `netai net up` runs)")
    if args.url or args.task_id is not None:
        raise ConfigError("--url and --task-id go with --attach")
    # a broken model: one line, exit 2, before anything starts; sized on the task's own dataset
    check_model(options.model, options.model_args, options.dataset, options.dataset_args)
    model = load(args.topology)
    (task,) = generate_tasks(model, count=1, locals_per_task=args.locals, seed=args.seed,
                             model_name=args.model, rounds=args.rounds)
    schedule = get_scheduler(args.scheduler).schedule(NetworkState(model), task)
    if schedule.blocked:
        raise ConfigError(f"{schedule.scheduler} cannot place the task: {schedule.reason}")
    backend_kind = resolve_backend(args.backend)
    if args.dashboard and backend_kind == "loopback":
        raise ConfigError("--dashboard shows an emulated network: use the docker or process backend (root)")
    log_dir: Path = args.log_dir or DEFAULT_LOG_ROOT / f"{time.strftime('%Y%m%d-%H%M%S')}-task{task.id}"
    if not args.json:
        print(f"task {task.id}: G={task.global_site}, locals={', '.join(task.local_sites)}; {schedule.scheduler}: "
              f"{len(schedule.relay_sites)} relays, broadcast depth {schedule.depth('broadcast')}, "
              f"upload depth {schedule.depth('upload')}; backend {backend_kind}; logs {log_dir}", flush=True)
    result: TaskResult
    try:
        if backend_kind == "loopback":
            from orchestrator.runtime.backends import LoopbackBackend
            from orchestrator.runtime.compute import ComputeManager

            nodes = schedule.overlay_nodes
            with ComputeManager(LoopbackBackend(nodes, log_root=log_dir), nodes) as manager:
                result = run_task(schedule, manager=manager, options=options, log_dir=manager.task_dir("agents"))
        else:
            result = _run_emulated(task, schedule, model, backend_kind, options, log_dir,
                                   train_allowance_s=args.train_allowance, compute=args.compute,
                                   dashboard_port=args.dashboard_port if args.dashboard else None)
    except (RuntimeError, TimeoutError) as e:  # a role or a server failed: say why in one line, status 1
        print(f"netai: task {task.id} failed: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"topology": args.topology, "scheduler": args.scheduler, "task": task.to_dict(),
                          "schedule": schedule.to_dict(), **result.to_dict()}, indent=1))
    else:
        _print_table(result)
    return 0


def _run_emulated(task: Any, schedule: Any, model: Any, kind: str, options: Any, log_dir: Path, *,
                  train_allowance_s: float, compute: Any, dashboard_port: int | None = None) -> Any:
    """Bring the emulation up, run the task through the lifecycle core, tear down. The run is recorded
    in ``<log dir>/emulation/results.db`` (link load, the task's states, rounds and per-node times), so
    `netai dashboard` replays it; with `dashboard_port`, the live dashboard serves it meanwhile.
    `compute`: how the locals' modelled training cost is set (`compute_model.ComputeModel`)."""
    from orchestrator.cli.net import LiveRecord
    from orchestrator.emulation.network import Emulation
    from orchestrator.emulation.network_port import ControllerNetwork
    from orchestrator.lifecycle.core import Lifecycle
    from orchestrator.lifecycle.recorder import DbRecorder
    from orchestrator.runtime.backends import emulation_options, open_compute
    from orchestrator.runtime.compute_model import training_cost
    from orchestrator.runtime.compute_port import ServerCompute
    from orchestrator.runtime.forked import early_fork_server
    from orchestrator.scheduling import NetworkState
    from topologies.plan import EmulationPlan

    if kind == "docker":
        from orchestrator.runtime.backends import ensure_worker_image

        ensure_worker_image()  # the image carries the project's code: keep it in step with the checkout
    plan = EmulationPlan.from_model(model)
    training = training_cost(options, compute)  # the modelled training, counted before bring-up
    log_dir.mkdir(parents=True, exist_ok=True)
    run_id = ""
    emu = Emulation(plan, log_dir=log_dir / "emulation", **emulation_options(kind, log_dir=log_dir / "workers"))
    live = LiveRecord(emu, model, plan, port=dashboard_port, name="task-run")  # a taken port: exit 2 here
    try:
        with early_fork_server(kind, log_root=log_dir / "workers") as forks, emu, live:
            run_id = emu.run_id
            if live.dashboard is not None:
                print(f"netai: live dashboard at {live.dashboard.url}", flush=True)
            delay = bool(getattr(emu.info, "delay_emulated", False))
            network = ControllerNetwork(emu.client, plan, delay_emulated=delay, install_ids=iter((task.id,)),
                                        measure_background=False)
            with open_compute(kind, emu, log_root=log_dir / "workers", forks=forks) as manager:
                compute = ServerCompute(manager, model=model, rate=network.rate, propagation=delay,
                                        train_allowance_s=train_allowance_s, options=lambda _t: options,
                                        dir_name="agents", training=training)
                core = Lifecycle(network=network, compute=compute, recorder=DbRecorder(live.db, live.run_id),
                                 clock=live.clock, model=model, schedulers=lambda _name: None,
                                 whole_updates=options.compression == "none")
                return core.run_one(schedule.scheduler, task, NetworkState(model), schedule=schedule).result
    finally:
        if kind == "docker" and run_id:
            # The emulation's teardown removes each container (`DockerWorkerHost.remove_run`); this
            # catches any a failed teardown left.
            from orchestrator.runtime.backends import docker_client, remove_containers

            client = docker_client()
            try:
                remove_containers(client, run_id=run_id)
            finally:
                client.close()


ROUND_HEADER = f"{'round':>5} {'latency ms':>11} {'broadcast':>10} {'train':>8} {'upload':>8} {'accuracy':>9}  stragglers"


def _round_line(r: Any) -> str:
    return (f"{r.round:>5} {r.latency_s * 1e3:>11.1f} {r.broadcast_s * 1e3:>10.1f} {r.train_s * 1e3:>8.1f} "
            f"{r.upload_s * 1e3:>8.1f} {r.accuracy:>9.3f}  {', '.join(r.stragglers) or '-'}"
            + (f"  selected: {', '.join(r.selected)}" if getattr(r, "selected", ()) else ""))


def _print_table(result: Any) -> None:
    print(ROUND_HEADER)
    for r in result.rounds:
        print(_round_line(r))
    print(f"backend {result.backend}; model {result.model_bytes / 1e6:.2f} MB; "
          f"{len(result.rejected)} frames rejected; logs in {result.log_dir}")


# -- --attach ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def _sigterm_exits() -> Iterator[None]:
    """SIGTERM (and SIGHUP) end the process through the exception path, so the task's paths, roles and
    servers are removed as on Ctrl-C."""
    def stop(signum: int, _frame: Any) -> None:
        raise SystemExit(128 + signum)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _cmd_attach(args: argparse.Namespace, options: Any) -> int:
    """``--attach``: the task on the running network (see the module docstring)."""
    from orchestrator.emulation.running import find_running
    from orchestrator.experiment.attach import AttachRequest, run_attached
    from orchestrator.runtime.compute import check_model
    from orchestrator.runtime.compute_model import resolve
    from orchestrator.scheduling import get_scheduler

    if args.backend not in ("auto", "process"):
        raise ConfigError("--attach runs the roles as processes in the running network's hosts: "
                          "--backend must be auto or process")
    if args.task_id is not None and not 0 < args.task_id < 2**63:
        raise ConfigError(f"--task-id must be a positive integer below 2**63, got {args.task_id}")
    if args.train_allowance <= 0:
        raise ConfigError(f"--train-allowance must be positive, got {args.train_allowance}")
    get_scheduler(args.scheduler)  # an unknown scheduler or a broken plugin: one line, exit 2
    if os.geteuid() != 0:
        raise ConfigError("--attach enters the running network's hosts (network namespaces): run it with sudo")
    # a broken model: one line, exit 2, before anything starts; sized on the task's own dataset
    model_bytes = check_model(options.model, options.model_args, options.dataset, options.dataset_args)
    resolve(options, args.compute)  # the modelled training, counted (or measured) before anything is installed
    net = find_running(args.url)
    req = AttachRequest(scheduler=args.scheduler, locals=args.locals, seed=args.seed, options=options,
                        model_bytes=model_bytes, log_root=args.log_dir or DEFAULT_LOG_ROOT, task_id=args.task_id,
                        topology=args.topology, train_allowance_s=args.train_allowance, compute=args.compute)
    quiet = bool(args.json)
    header = [False]

    def say(message: str) -> None:
        if not quiet:
            print(message, flush=True)

    def on_round(r: Any) -> None:
        if quiet:
            return
        if not header[0]:
            print(ROUND_HEADER)
            header[0] = True
        print(_round_line(r), flush=True)

    try:
        with _sigterm_exits():
            out = run_attached(net, req, say=say, on_round=on_round)
    except (RuntimeError, TimeoutError) as e:  # a role, a server or the controller failed: one line, status 1
        print(f"netai: attached task failed: {str(e).splitlines()[0]}", file=sys.stderr)
        return 1
    result = out.result
    if args.json:
        print(json.dumps({"run": net.name, "topology": net.plan.topology, "scheduler": args.scheduler,
                          "task": out.task.to_dict(), "schedule": out.schedule.to_dict(),
                          "reservation": out.reservation, "recorded_in": out.recorded_in, **result.to_dict()},
                         indent=1))
    else:
        print(f"task {out.task.id} done on {net.name}; its paths are removed; model {result.model_bytes / 1e6:.2f} MB; "
              f"{len(result.rejected)} frames rejected; logs in {out.log_dir}"
              + (f"; recorded in {out.recorded_in}" if out.recorded_in else ""))
    return 0
