"""The experiment runner: everything `sudo make experiment` does after set-up.

One run (docs/architecture.md, "Data flow of one experiment"):

1. validate the config and check the machine *before* anything starts (root, Mininet, Open vSwitch,
   the controller, iperf3, the compute backend); a failure here leaves nothing behind;
2. bring the emulation up (Mininet + OVS + the controller) and start background traffic;
3. for every number of locals, every task and every scheduler (interleaved, so background load
   and machine noise hit the schedulers alike): update the network state the scheduler sees
   (reservations of the point's earlier tasks + background load measured from port statistics),
   record it, schedule, install the task's flows (cookie = task id), run the FL task for real,
   record each round (latency and breakdown, accuracy, the ratio to the round's lower bound) and
   the task's carried bytes (flow counters by cookie), remove the flows;
4. write the CSVs, figures and report (``report.md``, ``report.html``) from the database, on every exit
   path.

Ctrl-C or SIGTERM: the emulation and the workers are torn down, the run is marked interrupted,
and the results written so far are kept.

Over 400 lines: preflight, task sets, progress and the run loop share the run's objects; the results
side (CSV, figures, report) already lives in `orchestrator.experiment.report`.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.dashboard.server import Dashboard
from orchestrator.errors import ConfigError
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.link_recorder import LinkRecorder
from orchestrator.experiment.online import run_online
from orchestrator.experiment.report import claims, summarize, write_csvs, write_report
from orchestrator.experiment.results_db import ResultsDB
from orchestrator.experiment.task_manager import RunClock, TaskManager
from orchestrator.runtime.compute import check_model
from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.tasks import Task, generate_tasks
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan

LOG = logging.getLogger("netai.experiment")
# The online mode and the task manager are imported above, not in run_experiment: their loggers must
# exist before Mininet is imported (loggers made after it get Mininet's logger class, whose records
# do not reach the run's log file).


@dataclass(frozen=True)
class RunOutcome:
    run_id: int
    run_dir: Path
    status: str
    report: Path | None


# -- checks before anything starts -------------------------------------------------------------------
def preflight(cfg: ExperimentConfig) -> str:
    """Check the machine for what `cfg` needs; return the compute backend to use.

    Raises
    ------
    ConfigError
        Naming what is missing and how to get it (nothing has been started).
    """
    if os.geteuid() != 0:
        raise ConfigError("the experiment needs root for Mininet and Open vSwitch: run it with sudo")
    for tool, why in (("mnexec", "Mininet"), ("ovs-vsctl", "Open vSwitch"), ("osken-manager", "the controller")):
        if shutil.which(tool) is None and not (Path(sys.executable).parent / tool).exists():
            raise ConfigError(f"{why} is not installed ({tool} not found): run `sudo make setup`")
    if subprocess.run(["ovs-vsctl", "--timeout=3", "show"], capture_output=True).returncode != 0:
        raise ConfigError("Open vSwitch is not running: run `sudo make setup`")
    if cfg.background.enabled and shutil.which("iperf3") is None:
        raise ConfigError("background traffic needs iperf3: run `sudo make setup`")
    from orchestrator.runtime.backends import pick_backend

    backend = pick_backend(cfg.emulation.backend)
    if backend == "loopback":
        raise ConfigError("an experiment runs in the emulated network: backend must be auto, docker or process")
    if backend == "docker":
        from orchestrator.runtime.backends import docker_client, image_exists

        client = docker_client()
        try:
            if not image_exists(client):
                raise ConfigError("the worker image is missing: run `sudo make setup` (it builds it)")
        finally:
            client.close()
    return backend


def environment(cfg: ExperimentConfig, plan: EmulationPlan, info: Any, backend: str) -> dict[str, Any]:
    cluster = getattr(info, "cluster", {}) or {}
    return {
        "kernel": platform.release(),
        "python": platform.python_version(),
        "datapath": getattr(info, "datapath", "?"),
        "delay_emulated": getattr(info, "delay_emulated", False),
        # the userspace datapath's one send budget for every link, bytes (orchestrator/emulation/ovs_socket.py)
        "ovs_send_buffer": getattr(info, "ovs_send_buffer", None),
        # the smallest receive buffer of the run's switch ports' packet sockets, bytes (same module)
        "ovs_receive_buffer": getattr(info, "ovs_receive_buffer", None),
        "bringup_s": round(getattr(info, "bringup_s", 0.0), 3),
        # what ovs-vswitchd's threads were raised to (orchestrator/emulation/datapath_priority.py)
        "datapath_priority": getattr(info, "datapath_priority", None),
        "backend": backend,
        "bw_scale": plan.bw_scale,
        "max_link_mbps": cfg.emulation.max_link_mbps,
        "connectivity": cfg.emulation.connectivity,
        "cpus": os.cpu_count(),
        "background": f"{cfg.background.pattern}, load {cfg.background.load}, {cfg.background.pairs} pairs"
        if cfg.background.enabled else "off",
    } | ({"cluster": cluster} if cluster else {})  # {servers: {server: [sites]}, cut: [[a, b]..], cut_mbps, ..}


# -- progress -------------------------------------------------------------------------------------
class Progress:
    """Bars for the run, the task and the round on a terminal; plain log lines elsewhere."""

    def __init__(self, total_runs: int, *, enabled: bool) -> None:
        self.enabled = enabled and sys.stderr.isatty()
        self._p: Any = None
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as RichProgress

            self._p = RichProgress(TextColumn("{task.description:<34}"), BarColumn(), MofNCompleteColumn(),
                                   TimeElapsedColumn(), transient=False)
            self._p.start()
            self.run_bar = self._p.add_task("run (tasks x schedulers)", total=total_runs)
            self.task_bar = self._p.add_task("task", total=1)
            self.round_bar = self._p.add_task("round", total=1)

    def task(self, label: str, rounds: int) -> None:
        LOG.info("%s", label)
        if self._p:
            self._p.reset(self.task_bar, total=rounds, description=label[:34])

    def round_progress(self, done_rounds: int, locals_done: int, n_locals: int, rnd: int) -> None:
        if self._p:
            self._p.update(self.task_bar, completed=done_rounds)
            self._p.reset(self.round_bar, total=n_locals, completed=locals_done, description=f"round {rnd}: locals trained")

    def advance_run(self) -> None:
        if self._p:
            self._p.advance(self.run_bar)

    def close(self) -> None:
        if self._p:
            self._p.stop()


def round_progress(events: dict[str, list[dict[str, Any]]], schedule: Schedule) -> tuple[int, int]:
    """(rounds G has completed, locals that finished training in the round under way), from the
    agents' timing events by site."""
    done = max((int(ev.get("round", 0)) for ev in events.get(schedule.global_site, [])
                if ev.get("event") == "round_complete"), default=0)
    current = done + 1
    trained = sum(
        1 for site in schedule.local_sites
        if any(ev.get("event") == "train_end" and ev.get("round") == current for ev in events.get(site, []))
    )
    return done, trained


def _read_events(log_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """The events of a task's roles by site (the site each event names; file names are safe stems)."""
    events: dict[str, list[dict[str, Any]]] = {}
    for path in log_dir.glob("*.events.jsonl"):
        try:
            lines = path.read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            try:
                ev = json.loads(line)
            except ValueError:
                continue  # a line being written
            if isinstance(ev, dict) and isinstance(ev.get("site"), str):
                events.setdefault(ev["site"], []).append(ev)
    return events


@contextlib.contextmanager
def watch_rounds(log_dir: Path, schedule: Schedule, rounds: int, progress: Progress) -> Iterator[None]:
    """Follow the agents' event files in a thread and move the task and round bars."""
    import threading

    stop = threading.Event()

    def follow() -> None:
        while not stop.wait(0.5):
            done, trained = round_progress(_read_events(log_dir), schedule)
            progress.round_progress(done, trained, len(schedule.local_sites), min(done + 1, rounds))

    t = threading.Thread(target=follow, daemon=True)
    if progress.enabled:
        t.start()
    try:
        yield
    finally:
        stop.set()


# -- the run --------------------------------------------------------------------------------------
def task_sets(cfg: ExperimentConfig, model: NetworkModel, model_bytes: int) -> dict[int, list[Task]]:
    """The seeded tasks of every point (number of locals); ids are unique in the run."""
    return {
        n: generate_tasks(
            model, count=cfg.tasks_per_point, locals_per_task=n, seed=cfg.seed * 1000 + n, first_id=100 * n + 1,
            model_name=cfg.task.model, rounds=cfg.task.rounds, demand_mbps=cfg.task.demand_mbps,
            model_bytes=model_bytes,
        )
        for n in cfg.locals
    }


def run_experiment(cfg: ExperimentConfig, *, out_root: Path, progress: bool = True,
                   dashboard_port: int | None = None) -> RunOutcome:
    """Run `cfg` for real (see the module docstring); returns where the results are.

    The status is ``completed`` when at least one task completed, ``failed`` when none did (or the
    run broke), ``interrupted`` on Ctrl-C or SIGTERM. With `dashboard_port` the live dashboard is
    served on 127.0.0.1 while the run lasts (a port in use is a `ConfigError` before anything starts).
    A config with ``engine: simulation`` runs on the flow-level model instead (no root, no network:
    `orchestrator.experiment.simulated`).
    """
    if cfg.engine == "simulation":
        from orchestrator.experiment.simulated import run_simulated

        return run_simulated(cfg, out_root=out_root)

    model = cfg.network()
    plan = EmulationPlan.from_model(model, max_link_mbps=cfg.emulation.max_link_mbps)
    backend_kind = preflight(cfg)
    model_bytes = check_model(cfg.task.model, cfg.task.model_args, cfg.task.dataset, cfg.task.dataset_args)  # a broken model: exit 2, nothing started
    if backend_kind == "docker":
        from orchestrator.runtime.backends import ensure_worker_image

        ensure_worker_image()  # the image carries the project's code: keep it in step with the checkout
    remote = remote_clients(cfg, plan, backend_kind)  # SSH and host keys checked: nothing started yet
    try:
        return _run_emulated(cfg, out_root, plan, model, backend_kind, model_bytes, remote, dashboard_port,
                             progress)
    finally:
        for client in {id(c): c for c in remote.values()}.values():
            client.close()


def remote_clients(cfg: ExperimentConfig, plan: EmulationPlan, backend_kind: str) -> dict[str, Any]:
    """{site: Docker client over SSH} for the config's `compute.servers` (`orchestrator.runtime.remote`)."""
    if not cfg.remote_servers:
        return {}
    if backend_kind != "docker":
        raise ConfigError("compute.servers needs the docker backend (emulation.backend: docker or auto)")
    from orchestrator.runtime.backends import docker_client
    from orchestrator.runtime.remote import connect_servers

    local = docker_client()
    try:
        return connect_servers(cfg.remote_servers, sites=[h.site for h in plan.hosts], local_client=local)
    finally:
        local.close()


def _run_emulated(cfg: ExperimentConfig, out_root: Path, plan: EmulationPlan, model: Any, backend_kind: str,
                  model_bytes: int, remote: dict[str, Any], dashboard_port: int | None, progress: bool) -> RunOutcome:
    from orchestrator.emulation.background import BackgroundTraffic, plan_background
    from orchestrator.emulation.network import Emulation
    from orchestrator.runtime.backends import emulation_options, open_compute

    run_dir = out_root / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    dash = None if dashboard_port is None else Dashboard(run_dir / "results.db", port=dashboard_port, live=True)
    try:
        run_dir.mkdir(parents=True, exist_ok=False)
    except BaseException:
        if dash is not None:
            dash.close()
        raise
    log_handler = logging.FileHandler(run_dir / "experiment.log")
    log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(log_handler)
    logging.getLogger().setLevel(logging.INFO)
    db = ResultsDB(run_dir / "results.db")
    run_id = db.start_run(cfg.name, cfg.to_dict())
    db.record_topology(run_id, model.name, model.to_dict(), plan.to_dict())
    status, note = "failed", ""
    tm: TaskManager | None = None
    if dash is not None:
        dash.start()
        print(f"netai: live dashboard at {dash.url}", flush=True)
        LOG.info("live dashboard at %s", dash.url)
    try:
        hosting = emulation_options(backend_kind, log_dir=run_dir / "workers", clients=remote)
        with Emulation(plan, log_dir=run_dir / "emulation", connectivity=cfg.emulation.connectivity,
                       cluster=cfg.emulation.cluster, **hosting) as emu, \
                open_compute(backend_kind, emu, log_root=run_dir / "workers") as compute:
            info = emu.info
            reservations = emu.client.health().get("reservations", {})
            db.set_environment(run_id, environment(cfg, plan, info, backend_kind) | {
                "remote_sites": {site: server.docker for server in cfg.remote_servers for site in server.sites},
                "reservations_enforced": bool(reservations.get("enforced")),
                "reservations_note": reservations.get("reason", ""), "mode": cfg.mode})
            LOG.info("emulation up: %d switches in %.1f s, delay emulated: %s; %d site servers up",
                     len(plan.switches), getattr(info, "bringup_s", 0.0), getattr(info, "delay_emulated", False),
                     len(compute.servers))
            flows = plan_background(model, plan, cfg.background, topology=cfg.topology, seed=cfg.seed) \
                if cfg.background.enabled else []
            if flows:
                emu.client.set_background([[f.src, f.dst] for f in flows])
            traffic = BackgroundTraffic(emu.host, flows, cfg.background, seed=cfg.seed, log_dir=run_dir / "background")
            traffic.start()
            stopped: list[Any] = []  # flow results of background runs a load step replaced
            steps = itertools.count(1)

            def background_step(load: float) -> None:
                """A step of the background load (a fault event): the flows re-planned for `load`."""
                nonlocal traffic
                stopped.extend(traffic.stop())
                step_cfg = replace(cfg.background, load=load, enabled=load > 0)
                new = plan_background(model, plan, step_cfg, topology=cfg.topology, seed=cfg.seed) if load > 0 else []
                emu.client.set_background([[f.src, f.dst] for f in new])
                traffic = BackgroundTraffic(emu.host, new, step_cfg, seed=cfg.seed,
                                            log_dir=run_dir / "background" / f"step-{next(steps)}")
                traffic.start()
            clock = RunClock()
            if dash is not None:
                dash.controller = emu.client
            recorder = LinkRecorder(emu.client, plan, run_dir / "results.db", run_id, clock=clock.now).start()
            tm = TaskManager(db=db, run_id=run_id, emu=emu, plan=plan, model=model, compute=compute, cfg=cfg,
                             run_dir=run_dir, clock=clock, release_on_end=cfg.mode == "online")
            tm.background_step = background_step
            try:
                if cfg.mode == "online":
                    run_online(tm, model, model_bytes, progress=progress)
                else:
                    _run_sequential(tm, model, model_bytes, progress=progress)
            finally:
                with contextlib.suppress(Exception):
                    tm.settle_counters(wait=True)
                recorder.stop()
                db.update_environment(run_id, clock_end_s=round(clock.now(), 3), link_samples=recorder.samples)
                for r in [*stopped, *traffic.stop()]:
                    db.record_background(run_id, r.src, r.dst, r.offered_mbps / plan.bw_scale,
                                         None if r.achieved_mbps is None else r.achieved_mbps / plan.bw_scale)
        done = tm.outcomes["done"]
        status = "completed" if done else "failed"
        failed = tm.outcomes["failed"]
        note = "no task completed" if not done else (f"{failed} task(s) failed" if failed else "")
    except KeyboardInterrupt:
        status, note = "interrupted", "interrupted by the user (Ctrl-C)"
        raise
    except SystemExit as e:  # the emulation turns SIGTERM into SystemExit after tearing down
        status, note = "interrupted", f"terminated ({e})"
        raise
    except BaseException as e:
        note = f"{type(e).__name__}: {e}"
        raise
    finally:
        if dash is not None:
            dash.close()
        db.finish_run(run_id, status, note)
        report = _write_results(db, run_id, run_dir)
        db.close()
        logging.getLogger().removeHandler(log_handler)
        log_handler.close()
    return RunOutcome(run_id=run_id, run_dir=run_dir, status=status, report=report)


def _run_sequential(tm: Any, model: NetworkModel, model_bytes: int, *, progress: bool) -> None:
    """Every point's tasks, one at a time, every scheduler on the same task before the next (so
    background load and machine noise hit the schedulers alike)."""
    cfg = tm.cfg
    tasks = task_sets(cfg, model, model_bytes)
    bar = Progress(sum(len(ts) for ts in tasks.values()) * len(cfg.schedulers), enabled=progress)
    states = {(s, n): NetworkState(model) for s in cfg.schedulers for n in cfg.locals}
    try:
        for n in cfg.locals:
            for task in tasks[n]:
                for name in cfg.schedulers:
                    tm.arrive(name, task)
                    live = tm.admit(name, task, states[(name, n)])
                    if live is not None:
                        bar.task(f"{name}: task {task.id}, {len(task.local_sites)} locals", task.rounds)
                        nodes = live.schedule.overlay_nodes
                        with watch_rounds(live.execution.log_dir, live.schedule, task.rounds, bar):
                            while not tm.check(live, tm.compute.poll(nodes)):
                                tm.settle_counters()
                                time.sleep(0.05)  # poll interval of the roles' states; tasks have budgets
                    tm.settle_counters()
                    bar.advance_run()
    finally:
        bar.close()


def _write_results(db: ResultsDB, run_id: int, run_dir: Path) -> Path | None:
    try:
        write_csvs(db, run_id, run_dir)
        return write_report(db, run_id, run_dir)  # draws every figure, writes report.md and report.html
    except Exception:
        LOG.exception("writing the results failed")
        return None


def print_summary(outcome: RunOutcome) -> None:
    """The summary table and the paper's two claims, on the terminal."""
    from orchestrator.experiment.report import task_results

    with ResultsDB(outcome.run_dir / "results.db") as db:
        points = summarize(db, outcome.run_id)
        tasks = task_results(db, outcome.run_id)
    counts = {s: sum(t.state == s for t in tasks) for s in ("done", "failed", "blocked")}
    failed = f"; {counts['failed']} of {len(tasks)} tasks FAILED" if counts["failed"] else ""
    print(f"\nrun {outcome.run_id} {outcome.status}: {counts['done']} of {len(tasks)} tasks done, "
          f"{counts['blocked']} blocked{failed}; results in {outcome.run_dir}")
    print(f"{'scheduler':<10}{'locals':>7}{'ran':>6}{'blocked':>8}{'latency ms':>12}{'± std':>9}"
          f"{'reserved Gb/s':>15}{'carried MB':>12}{'/bound':>8}{'accuracy':>10}")

    def f(x: float | None, scale: float = 1.0, d: int = 2) -> str:
        return "-" if x is None else f"{x * scale:.{d}f}"

    for p in points:
        print(f"{p.scheduler:<10}{p.n_locals:>7}{p.tasks_ran:>6}{p.blocked:>8}{f(p.latency_s_mean, 1e3, 1):>12}"
              f"{f(p.latency_s_std, 1e3, 1):>9}{f(p.reserved_mbps_mean, 1e-3):>15}{f(p.carried_mb_mean, 1, 1):>12}"
              f"{f(p.ratio_to_bound_mean):>8}{f(p.accuracy_mean, 1, 3):>10}")
    if points:
        ns = sorted({p.n_locals for p in points})
        c = claims(points, n_locals=8 if 8 in ns else ns[-1])
        for key in ("bandwidth", "latency"):
            if c[f"{key}_ratio"] is not None:
                print(f"{key} mst/spff at {c['n_locals']} locals: {c[f'{key}_ratio']:.3f}")


def trimmed(cfg: ExperimentConfig, *, locals_: tuple[int, ...], tasks_per_point: int, rounds: int) -> ExperimentConfig:
    """A smaller copy of a config (for CI and quick checks)."""
    return replace(cfg, locals=locals_, tasks_per_point=tasks_per_point, task=replace(cfg.task, rounds=rounds))
