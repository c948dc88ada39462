"""``netai task run``: schedule one FL task on a topology and run it end to end.

Examples::

    netai task run --topology triangle --scheduler mst --locals 2 --rounds 3 --model mlp --backend loopback
    sudo netai task run --topology sndlib/nobel-us --scheduler mst --locals 8 --rounds 3 --model cnn --json

Backends (`orchestrator.runtime.backends`): ``loopback`` (no Mininet, no root: agents on 127.0.0.x), ``process``
(agents in Mininet hosts), ``docker`` (every host a worker container), ``auto`` (the default:
``docker`` when root, a Docker daemon and the worker image are there, else ``process`` as root,
else ``loopback``). The emulated backends bring up the emulation (Mininet + controller), install the
task's schedule, run the task, and tear everything down on every exit path.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError

DEFAULT_LOG_ROOT = Path(os.environ.get("NETAI_TASK_LOG_DIR", "/var/tmp/netai-tasks"))


def register(subparsers: Any) -> None:
    task = subparsers.add_parser("task", help="run one federated-learning task end to end")
    sub = task.add_subparsers(dest="task_command", metavar="SUBCOMMAND")
    sub.required = True
    run = sub.add_parser("run", help="schedule a task and run it (per-round latency breakdown and accuracy)",
                         description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--topology", required=True, help="topology name (e.g. triangle, sndlib/nobel-us)")
    run.add_argument("--scheduler", default="mst", help="scheduler name (default mst)")
    run.add_argument("--locals", type=int, required=True, help="number of local models")
    run.add_argument("--rounds", type=int, default=3)
    run.add_argument("--model", default="mlp", help="registered model, module:callable or file.py:callable")
    run.add_argument("--model-arg", action="append", default=[], metavar="KEY=VALUE",
                     help="keyword argument of the model factory (JSON value), repeatable")
    run.add_argument("--backend", default="auto", choices=("auto", "docker", "process", "loopback"))
    run.add_argument("--partition", default="iid", choices=("iid", "dirichlet"))
    run.add_argument("--alpha", type=float, default=0.5, help="Dirichlet concentration (non-IID)")
    run.add_argument("--local-epochs", type=int, default=2)
    run.add_argument("--lr", type=float, default=0.1)
    run.add_argument("--seed", type=int, default=0, help="seed of the task draw, the data split and the model")
    run.add_argument("--child-timeout", type=float, default=60.0, metavar="S",
                     help="per-child wait of a node, seconds (scaled by its subtree height)")
    run.add_argument("--log-dir", type=Path, default=None, help=f"default {DEFAULT_LOG_ROOT}/<time>-task<id>")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.set_defaults(func=cmd_run)


def _model_args(pairs: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key:
            raise ConfigError(f"--model-arg takes KEY=VALUE, got {p!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


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
    from orchestrator.runtime.task_runner import FLOptions, TaskResult, run_task
    from orchestrator.scheduling import NetworkState, get_scheduler
    from orchestrator.scheduling.tasks import generate_tasks
    from topologies.loaders import load
    from workers.models import normalize_spec

    if args.rounds < 1:
        raise ConfigError(f"--rounds must be at least 1, got {args.rounds}")
    args.model = normalize_spec(args.model)
    model_args = _model_args(args.model_arg)
    check_model(args.model, model_args)  # a broken model: one line, exit 2, before anything starts
    model = load(args.topology)
    (task,) = generate_tasks(model, count=1, locals_per_task=args.locals, seed=args.seed,
                             model_name=args.model, rounds=args.rounds)
    schedule = get_scheduler(args.scheduler).schedule(NetworkState(model), task)
    if schedule.blocked:
        raise ConfigError(f"{args.scheduler} cannot place the task: {schedule.reason}")
    backend_kind = resolve_backend(args.backend)
    options = FLOptions(model=args.model, model_args=model_args, rounds=args.rounds,
                        partitioning=args.partition, alpha=args.alpha, seed=args.seed,
                        local_epochs=args.local_epochs, lr=args.lr, child_timeout_s=args.child_timeout)
    log_dir: Path = args.log_dir or DEFAULT_LOG_ROOT / f"{time.strftime('%Y%m%d-%H%M%S')}-task{task.id}"
    if not args.json:
        print(f"task {task.id}: G={task.global_site}, locals={', '.join(task.local_sites)}; {args.scheduler}: "
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
            result = _run_emulated(schedule, model, backend_kind, options, log_dir)
    except (RuntimeError, TimeoutError) as e:  # a role or a server failed: say why in one line, status 1
        print(f"netai: task {task.id} failed: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps({"topology": args.topology, "scheduler": args.scheduler, "task": task.to_dict(),
                          "schedule": schedule.to_dict(), **result.to_dict()}, indent=1))
    else:
        _print_table(result)
    return 0


def _run_emulated(schedule: Any, model: Any, kind: str, options: Any, log_dir: Path) -> Any:
    from orchestrator.emulation.network import Emulation
    from orchestrator.runtime.backends import emulation_options, open_compute
    from orchestrator.runtime.task_runner import run_task
    from topologies.plan import EmulationPlan

    if kind == "docker":
        from orchestrator.runtime.backends import ensure_worker_image

        ensure_worker_image()  # the image carries the project's code: keep it in step with the checkout
    plan = EmulationPlan.from_model(model)
    log_dir.mkdir(parents=True, exist_ok=True)
    run_id = ""
    try:
        with Emulation(plan, log_dir=log_dir / "emulation",
                       **emulation_options(kind, log_dir=log_dir / "workers")) as emu:
            run_id = emu.run_id
            with open_compute(kind, emu, log_root=log_dir / "workers") as manager:
                emu.install_task(schedule)
                try:
                    return run_task(schedule, manager=manager, options=options, log_dir=manager.task_dir("agents"))
                finally:
                    emu.client.remove_task(schedule.task_id)
    finally:
        if kind == "docker" and run_id:
            # Mininet removes each container with its host; this catches any a failed teardown left.
            from orchestrator.runtime.backends import docker_client, remove_containers

            client = docker_client()
            try:
                remove_containers(client, run_id=run_id)
            finally:
                client.close()


def _print_table(result: Any) -> None:
    print(f"{'round':>5} {'latency ms':>11} {'broadcast':>10} {'train':>8} {'upload':>8} {'accuracy':>9}  stragglers")
    for r in result.rounds:
        print(f"{r.round:>5} {r.latency_s * 1e3:>11.1f} {r.broadcast_s * 1e3:>10.1f} {r.train_s * 1e3:>8.1f} "
              f"{r.upload_s * 1e3:>8.1f} {r.accuracy:>9.3f}  {', '.join(r.stragglers) or '-'}")
    print(f"backend {result.backend}; model {result.model_bytes / 1e6:.2f} MB; "
          f"{len(result.rejected)} frames rejected; logs in {result.log_dir}")
