"""The experiment runner: everything `sudo make experiment` does after set-up.

One run (docs/architecture.md, "Data flow of one experiment"):

1. validate the config and check the machine *before* anything starts (root, Mininet, Open vSwitch,
   the controller, iperf3, the compute backend); a failure here leaves nothing behind;
2. with ``time_dilation: auto``, choose K by trials (`_calibrate`), each on an emulation of its own
   (Mininet, the switches, the controller, the site servers); go on on the last faithful trial's,
   else bring one up, and start background traffic (a session: `orchestrator.experiment.session`);
   with a K per point, one calibration and session per number of locals, in turn, into the same run
   (`orchestrator.experiment.point_runs`);
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

The sessions (bring-up, the sequential loop, settling) live in `orchestrator.experiment.session`, the
results side (CSV, figures, report) in `orchestrator.results`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.dashboard.server import Dashboard
from orchestrator.errors import ConfigError
from orchestrator.experiment.calibration import Calibration, Trial, calibration_config, judge
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.k_store import after_run, search_or_reuse, workload_key
from orchestrator.experiment.kept import KeptEmulation, fresh_dir
from orchestrator.experiment.point_runs import point_kept, run_points
from orchestrator.experiment.progress import round_progress as round_progress  # its home before
from orchestrator.experiment.resume import Resume, recorded_dilation, reopen
from orchestrator.experiment.runs import RunOutcome, check_memory
from orchestrator.experiment.session import Hosting, RunShared, SessionEnd, hosted, run_session
from orchestrator.results import durability, queries
from orchestrator.results.db import ResultsDB
from orchestrator.results.report import write_results_on_exit
from orchestrator.results.summary import RunSummary
from orchestrator.runtime import compute_model
from orchestrator.runtime.compute import check_model
from topologies.plan import EmulationPlan

LOG = logging.getLogger("netai.experiment")
# The online mode and the task manager are imported above (through the session module), not in
# run_experiment: their loggers must
# exist before Mininet is imported (loggers made after it get Mininet's logger class, whose records
# do not reach the run's log file).


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
    from orchestrator.emulation.kernel import datapath_problem

    if problem := datapath_problem(cfg.emulation.datapath, cluster=cfg.emulation.cluster is not None):
        raise ConfigError(problem)
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


# -- the run --------------------------------------------------------------------------------------
def run_experiment(cfg: ExperimentConfig, *, out_root: Path, progress: bool = True,
                   dashboard_port: int | None = None, figures: bool = True, source: dict[str, Any] | None = None,
                   resume: Path | None = None) -> RunOutcome:
    """Run `cfg` for real (see the module docstring); returns where the results are.

    The status is ``completed`` when at least one task completed, ``failed`` when none did (or the
    run broke), ``interrupted`` on Ctrl-C or SIGTERM. With `dashboard_port` the live dashboard is
    served on 127.0.0.1 while the run lasts (a port in use is a `ConfigError` before anything starts).
    A config with ``engine: simulation`` runs on the flow-level model instead (no root, no network:
    `orchestrator.experiment.simulated`). Without `figures` the run folder has the CSVs and the report
    but no plots (``netai experiment --no-figures``). `source` is recorded for a resume (`resume.source_record`);
    `resume` (a run folder, or a sweep's) continues that run instead of starting one
    (`orchestrator.experiment.resume`: checked before this is called).
    """
    from orchestrator.experiment.host_dilation import resolve

    if resume is not None and cfg.mode == "online":
        raise ConfigError(f"{resume}: an online run cannot be resumed (its tasks arrive on the run's clock)")
    if resume is not None and not cfg.sweep and cfg.engine != "simulation":
        cfg = recorded_dilation(cfg, resume)  # the K the run started with, not this host's today
    cfg = resolve(cfg)  # `time_dilation: host`: this host's K, or a ConfigError before anything starts
    if cfg.sweep:  # one run per entry, then the sweep's report (orchestrator.experiment.sweep)
        from orchestrator.experiment.sweep import run_sweep

        return run_sweep(cfg, run_one=run_experiment, out_root=out_root, progress=progress,
                         dashboard_port=dashboard_port, figures=figures, source=source, resume=resume)
    if cfg.engine == "simulation":
        from orchestrator.experiment.simulated import run_simulated

        return run_simulated(cfg, out_root=out_root, figures=figures, source=source, resume=resume)

    model = cfg.network()
    plan = EmulationPlan.from_model(model, max_link_mbps=cfg.emulation.max_link_mbps)
    if cfg.emulation.time_dilation != 1 and not cfg.emulation.per_point:  # per point: each point's own
        plan = plan.dilated(cfg.emulation.time_dilation)
    backend_kind = preflight(cfg)
    model_bytes = check_model(cfg.task.model, cfg.task.model_args, cfg.task.dataset, cfg.task.dataset_args)  # a broken model: exit 2, nothing started
    compute_model.resolve(cfg.task, cfg.compute)  # the modelled training, counted before anything starts
    check_memory(cfg, model, model_bytes)  # a task a site's memory cannot hold: exit 2, nothing started
    if backend_kind == "docker":
        from orchestrator.runtime.backends import ensure_worker_image

        ensure_worker_image()  # the image carries the project's code: keep it in step with the checkout
    remote = remote_clients(cfg, plan, backend_kind)  # SSH and host keys checked: nothing started yet
    try:
        outcome = _run_emulated(cfg, out_root, plan, model, backend_kind, model_bytes, remote, dashboard_port,
                                progress, figures=figures, source=source, resume=resume)
        after_run(cfg, backend_kind, outcome.summary)  # a reused K the run found not faithful is dropped
        return outcome
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
                  model_bytes: int, remote: dict[str, Any], dashboard_port: int | None, progress: bool, *,
                  figures: bool = True, source: dict[str, Any] | None = None,
                  resume: Path | None = None, hosting: Hosting | None = None) -> RunOutcome:
    started = time.monotonic()
    run_dir, dash, log_handler, db, run_id, again = _open_run(cfg, out_root, plan, model, dashboard_port,
                                                              source=source, resume=resume)
    status, note = "failed", ""
    shared = RunShared(db=db, run_id=run_id, run_dir=run_dir, model=model, backend_kind=backend_kind,
                       model_bytes=model_bytes, remote=remote, dash=dash, progress=progress, again=again)
    try:
        outcomes, lost = _points(shared, cfg, plan) if cfg.emulation.per_point else \
            _one_k(shared, cfg, plan, hosting=hosting)
        status, note = _outcome(again.outcomes(outcomes) if again else outcomes, lost)
    except KeyboardInterrupt:
        status, note = "interrupted", "interrupted by the user (Ctrl-C)"
        raise
    except SystemExit as e:  # the emulation turns SIGTERM into SystemExit after tearing down
        status, note = "interrupted", f"terminated ({e})"
        raise
    except BaseException as e:
        note = durability.failure_note(e)
        raise
    finally:
        report, summary = _close_run(db, run_id, run_dir, status, note, dash=dash, log_handler=log_handler,
                                     wall_s=time.monotonic() - started, figures=figures)
    return RunOutcome(run_id=run_id, run_dir=run_dir, status=status, report=report, summary=summary)


def _one_k(shared: RunShared, cfg: ExperimentConfig, plan: EmulationPlan, *,
           hosting: Hosting | None = None) -> tuple[dict[str, int], str]:
    """The run at one K: with ``time_dilation: auto`` its calibration first (recorded with the plan at
    its K), then one session (`orchestrator.experiment.session`) on the last trial's emulation when that
    trial was faithful at the K chosen (`orchestrator.experiment.kept`), else on its own (or on `hosting`: a
    trial's session). Its tasks' outcomes and lost note."""
    with KeptEmulation() as kept:
        if cfg.emulation.time_dilation_auto:  # K from trials of the run's own workload, before it starts
            calibration = _calibrate(cfg, shared.run_dir / "calibration", plan, shared, kept=kept)
            plan = _record_plan(shared.db, shared.run_id, shared.model, plan.dilated(calibration.k))
            shared.db.update_environment(shared.run_id, time_dilation_calibration=calibration.to_dict())
            hosting = kept.take(calibration.k)
        end = run_session(shared, cfg, plan, hosting=hosting)
    return end.outcomes, end.lost


def _points(shared: RunShared, cfg: ExperimentConfig, plan: EmulationPlan) -> tuple[dict[str, int], str]:
    """The run with a K per point (`orchestrator.experiment.point_runs`): each point calibrated in its
    own folder under ``calibration/`` (``time_dilation: auto``), then its session at its K (on its last
    trial's emulation when that trial was faithful at its K: `orchestrator.experiment.kept`), its plan recorded
    as the run's while it runs."""
    db, run_id = shared.db, shared.run_id

    def session(point: ExperimentConfig, k: float, clock_start_s: float) -> SessionEnd:
        dilated = _record_plan(db, run_id, shared.model, plan.dilated(k))
        try:
            return run_session(shared, point, dilated, clock_start_s=clock_start_s, hosting=kept.take(k))
        finally:
            kept.close()

    again = shared.again
    with KeptEmulation() as kept:
        return run_points(
            cfg, calibrate=lambda point, floor, floor_locals: _calibrate(
                point, shared.run_dir / "calibration" / f"{point.locals[0]}-locals", plan, shared,
                floor=floor, floor_locals=floor_locals, kept=kept),
            session=session, record=lambda **items: db.update_environment(run_id, **items),
            recorded=db.run(run_id)["environment"] if again is not None else {},
            kept=None if again is None else lambda point: point_kept(point, shared.model, shared.model_bytes, again))


def _close_run(db: ResultsDB, run_id: int, run_dir: Path, status: str, note: str, *, dash: Dashboard | None,
               log_handler: logging.Handler, wall_s: float, figures: bool) -> tuple[Path | None, RunSummary | None]:
    """On every exit path: the dashboard closed, the run marked (`durability.finish_or_leave`: a full
    disk leaves it to be found crashed), its results written, the database and the log closed."""
    if dash is not None:
        dash.close()
    with contextlib.suppress(sqlite3.Error):  # a full disk: the run's marking below says what it can
        db.update_environment(run_id, run_wall_s=round(wall_s, 3))
    durability.finish_or_leave(db, run_id, status, note, LOG)
    try:  # a full disk is raised, for the command line to say in one line
        return write_results_on_exit(db, run_id, run_dir, figures=figures, log=LOG)
    finally:
        db.close()
        logging.getLogger().removeHandler(log_handler)
        log_handler.close()


def _outcome(outcomes: dict[str, int], lost: str) -> tuple[str, str]:
    """The run's status and note: ``completed`` when a task completed, unless a machine was lost
    (`lost`: the network measured was not the configured one from then on)."""
    done, failed = outcomes["done"], outcomes["failed"]
    note = "no task completed" if not done else (f"{failed} task(s) failed" if failed else "")
    if lost:
        return "failed", f"{lost}; {note or 'every task completed'}"
    return ("completed" if done else "failed"), note


def _open_run(cfg: ExperimentConfig, out_root: Path, plan: EmulationPlan, model: Any,
              dashboard_port: int | None, *, source: dict[str, Any] | None = None, resume: Path | None = None,
              ) -> tuple[Path, Dashboard | None, logging.Handler, ResultsDB, int, Resume | None]:
    """The run's folder, log file, results database (run started, topology recorded; or, with
    `resume`, the run in that folder reopened) and live dashboard (started), before the emulation
    comes up.

    The caller owns what this returns: it closes the dashboard, finishes the run, closes the database
    and removes the log handler on every exit path. Only a run folder that cannot be created closes
    the dashboard here (nothing else is open yet).
    """
    run_dir = resume or out_root / f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    dash = None if dashboard_port is None else Dashboard(run_dir / "results.db", port=dashboard_port, live=True)
    try:
        run_dir.mkdir(parents=True, exist_ok=resume is not None)
    except BaseException:
        if dash is not None:
            dash.close()
        raise
    log_handler = logging.FileHandler(run_dir / "experiment.log")
    log_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(log_handler)
    logging.getLogger().setLevel(logging.INFO)
    db = ResultsDB(run_dir / "results.db")
    again = None
    if resume is None:
        run_id = db.start_run(cfg.name, cfg.to_dict(), source=source)
        db.record_topology(run_id, model.name, model.to_dict(), plan.to_dict())
    else:
        run_id = int(queries.last_run_id(db.conn) or 0)
        again = reopen(db, run_id, run_dir)
    if dash is not None:
        dash.start()
        print(f"netai: live dashboard at {dash.url}", flush=True)
        LOG.info("live dashboard at %s", dash.url)
    return run_dir, dash, log_handler, db, run_id, again


def _record_plan(db: ResultsDB, run_id: int, model: Any, plan: EmulationPlan) -> EmulationPlan:
    """`plan` recorded as the run's (replacing the undilated one recorded before the calibration)."""
    db.record_topology(run_id, model.name, model.to_dict(), plan.to_dict())
    return plan


def _calibrate(cfg: ExperimentConfig, out_root: Path, plan: EmulationPlan, shared: RunShared, *,
               floor: float = 1.0, floor_locals: int = 0, kept: KeptEmulation | None = None) -> Calibration:
    """``time_dilation: auto``: the K the run (or a point of it, `cfg` then holding its locals alone)
    uses, from trials of its own workload at K = 1, 2, 4, ... (`orchestrator.experiment.calibration`;
    from `floor`, a point of the run with fewer locals' K, for a point),
    each a short run of its own (results without figures in `out_root`) on `plan` dilated by K, brought
    up into `kept` (its logs in ``emulation-k<K>/`` there) and left up for the run if it is faithful;
    one line per K on the console and in the log."""
    def say(line: str) -> None:
        LOG.info("%s", line)
        print(f"netai: {line}", flush=True)

    def trial(k: float) -> Trial:
        if kept is not None:
            kept.close()  # the trial before's emulation, torn down outside this trial's wall time
        t0, trial_cfg = time.monotonic(), calibration_config(cfg, k)
        hosting = None if kept is None else kept.bring_up(k, lambda: hosted(
            shared.backend_kind, trial_cfg, plan.dilated(k), fresh_dir(out_root / f"emulation-k{k:g}"),
            remote=shared.remote))
        outcome = _run_emulated(trial_cfg, out_root, plan.dilated(k), shared.model, shared.backend_kind,
                                shared.model_bytes, shared.remote, None, False, figures=False, hosting=hosting)
        return judge(k, time.monotonic() - t0, outcome.summary)

    trial_cfg = calibration_config(cfg, 1)
    say(f"time dilation auto: calibrating on 1 task of {trial_cfg.locals[0]} locals, {trial_cfg.task.rounds} "
        f"rounds, under {', '.join(cfg.schedulers)}, K up to {cfg.emulation.max_time_dilation:g}")
    cal = search_or_reuse(workload_key(cfg, shared.backend_kind), trial, cfg.emulation.max_time_dilation, say=say,
                          floor=floor, floor_locals=floor_locals)
    if kept is not None and not cal.faithful:  # the cap's trial failed: what failed stays with its emulation
        kept.close()
    return cal


def trimmed(cfg: ExperimentConfig, *, locals_: tuple[int, ...], tasks_per_point: int, rounds: int) -> ExperimentConfig:
    """A smaller copy of a config (for CI and quick checks)."""
    return replace(cfg, locals=locals_, tasks_per_point=tasks_per_point, task=replace(cfg.task, rounds=rounds))
