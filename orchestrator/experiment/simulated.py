"""`engine: simulation`: an experiment config run on the flow-level model (`orchestrator.simulation`).

The same task sets (`runs.task_sets`), the same schedulers, in the same order and on the same
network states as the sequential mode of the emulation (every scheduler sees the reservations of
the point's earlier tasks and the background's own rates, `orchestrator.simulation.background`),
then every admitted task's rounds simulated on SimGrid (child engine processes,
`orchestrator.simulation.spec.simulate`), recorded in the same results database, CSVs,
figures and report. The run is marked ``engine = simulation`` (the `runs` table) and its
environment lists the model's parameters, so the report says it was simulated and how, and which
`netai validate` covers its regime, or that none does (`validation_store.covering`).
"""

from __future__ import annotations

import logging
import platform
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from controller.htb import BACKGROUND_SHARE
from orchestrator.experiment.config import ExperimentConfig, SimulationConfig
from orchestrator.experiment.resume import Resume, reopen
from orchestrator.experiment.runs import RunOutcome, check_memory, scheduler_order, task_sets
from orchestrator.experiment.validation_store import Regime, covering
from orchestrator.experiment.validation_store import default_path as validations_path
from orchestrator.lifecycle.core import Lifecycle, LiveTask
from orchestrator.lifecycle.recorder import DbRecorder
from orchestrator.results import durability, queries
from orchestrator.results.db import ResultsDB
from orchestrator.results.report import write_results_on_exit
from orchestrator.results.summary import RunSummary
from orchestrator.runtime.compute_model import ModelledTraining, for_training, resolve
from orchestrator.scheduling import NetworkState
from orchestrator.scheduling.cost import capacity_rate, emulated_rate
from orchestrator.simulation.background import SimBackground
from orchestrator.simulation.calibration import CalibrationMismatch, default_path, find, uncalibrated_note
from orchestrator.simulation.ports import SimBatch, SimCompute, SimNetwork
from orchestrator.simulation.spec import SimParams
from topologies.plan import EmulationPlan
from workers.compute import TrainingCost

LOG = logging.getLogger("netai.simulation")


def sim_params(cfg: ExperimentConfig) -> SimParams:
    """The model's parameters from the config's `simulation` section. With ``compute_timing: modeled``
    and no training figure of its own, training is the emulation's compute model (`workers.compute`):
    the run's modelled training (`compute_model.resolve` of its task and ``compute`` section: the
    cost per example and per round), its epochs and its dataset's examples, at each site's speed."""
    params = SimParams(**{k: v for k, v in asdict(cfg.simulation).items() if k != "calibration"})
    defaults = SimulationConfig()
    if cfg.task.compute_timing == "modeled" and params.seconds_per_example == defaults.seconds_per_example \
            and params.seconds_per_round == defaults.seconds_per_round:
        training = resolve(cfg.task, cfg.compute)
        params = replace(params, seconds_per_example=training.cost.s_per_example,
                         seconds_per_round=training.cost.s_per_round, local_epochs=cfg.task.local_epochs,
                         train_examples=training.train_examples, site_speed=True)
    return params


def apply_calibration(cfg: ExperimentConfig, params: SimParams, store: Path) -> tuple[SimParams, dict[str, Any]]:
    """`params` with this host's calibration (`calibration.find` in `store`) for every parameter
    the config leaves at its default, and propagation on only if the calibration's emulation had
    delay; and what the run records about it. A config whose ``simulation.calibration`` note is
    set keeps its own parameters (recorded as such); without a matching calibration the run is
    recorded as uncalibrated, with why and how far off the defaults were measured to be."""
    if cfg.simulation.calibration:
        return params, {"calibrated": "set in the config"}
    try:
        cal = find(store)
    except (CalibrationMismatch, ValueError) as e:
        LOG.warning("uncalibrated simulation: %s", e)
        return params, uncalibrated_note(store, str(e))
    defaults = SimulationConfig()
    own: dict[str, Any] = {k: v for k, v in cal.usable_params().items()
                           if getattr(cfg.simulation, k) == getattr(defaults, k)}
    if cfg.simulation.propagation == defaults.propagation:
        own["propagation"] = cal.delay_emulated
    typed: dict[str, Any] = {k: (int(v) if k == "cpu_cores" else v) for k, v in own.items()}
    params = replace(params, **typed)
    return params, {"calibrated": True, "calibrated_params": sorted(own), "calibration_id": cal.id, "calibration_created": cal.created,
                    "calibration_host": cal.host.hostname, "calibration_version": cal.version,
                    "calibration_store": str(store), "calibration_summary": cal.summary()}


@dataclass(frozen=True)
class ReplayedBackground:
    """The background an emulated run's schedulers were given, per task (`validate.first_views`),
    for the simulated schedulers of the same tasks (`netai validate`); `source` names the run."""

    source: str
    by_task: Mapping[int, Mapping[tuple[str, str], float]]


def run_simulated(cfg: ExperimentConfig, *, out_root: Path, model_bytes: int | None = None,
                  calibration_store: Path | None = None, figures: bool = True,
                  replay: ReplayedBackground | None = None, source: dict[str, Any] | None = None,
                  resume: Path | None = None, validations: Path | None = None) -> RunOutcome:
    """Run `cfg` on the flow-level model; results in a new run folder under `out_root`.

    `model_bytes` skips building the model to size it (`check_model`), e.g. in a benchmark.
    `calibration_store`: where this host's calibration is looked up (`apply_calibration`; default
    `orchestrator.simulation.calibration.default_path`). `replay`: the schedulers are given these
    tasks' recorded background instead of the modelled one (recorded as ``scheduler_background``).
    `source`: recorded for a resume; `resume`: the run folder whose run this continues (its kept
    tasks not run again, `orchestrator.experiment.resume`). `validations`: the store of validations
    whose newest covering one the run cites (default `validation_store.default_path`).
    """
    model = cfg.network()
    plan = EmulationPlan.from_model(model, max_link_mbps=cfg.emulation.max_link_mbps)
    params, calibration = apply_calibration(cfg, sim_params(cfg), calibration_store or default_path())
    model_bytes, frames = _model_sizes(cfg, model_bytes)
    check_memory(cfg, model, model_bytes)  # as the emulation: before anything starts
    rate = emulated_rate(plan) if params.rates == "emulated" else capacity_rate(model)
    run_dir, db, run_id, again = _open(cfg, out_root, model, plan, source=source, resume=resume)
    background = _background(cfg, model, plan, params)
    db.update_environment(run_id, **_environment(cfg, plan, params, background, calibration,
                                                 training := _training(cfg, params))
                          | {"frame_headers": "modelled" if frames is not None else "not modelled"}
                          | _validation(cfg, model.name, model_bytes, validations))
    status, note = "failed", ""
    try:
        batch = SimBatch(model, params, rate, background, frames)
        batch.work_dir = run_dir
        network = SimNetwork(batch, propagation=params.propagation, replay=None if replay is None else replay.by_task)
        core = Lifecycle(network=network, compute=SimCompute(batch, network, run_dir), recorder=SimRecorder(db, run_id),
                         clock=batch, model=model, schedulers=_planning(cfg, training),
                         whole_updates=cfg.task.compression == "none")
        t0 = time.monotonic()
        admitted = _admit_all(cfg, core, model, model_bytes, again)
        db.update_environment(run_id, scheduling_wall_s=round(time.monotonic() - t0, 3),
                              **_replay_figures(replay, network, background is None))
        t0 = time.monotonic()
        result = batch.run()
        for live in admitted:  # each task's record whole, one after the other
            core.check(live, {})
            core.settle_counters()
        core.settle_counters(wait=True)
        done = (again.outcomes(core.outcomes) if again else core.outcomes)["done"]
        db.update_environment(run_id, clock_end_s=round(float(result["sim_end_s"]), 6),
                              simulation_wall_s=round(time.monotonic() - t0, 3),
                              simulation_peak_rss_mb=round(result.get("peak_rss_bytes", 0) / 2**20, 1),
                              simulation_processes=int(result.get("processes", 0)))
        status = "completed" if done else "failed"
        note = "" if done else "no task completed"
    except KeyboardInterrupt:
        status, note = "interrupted", "interrupted by the user (Ctrl-C)"
        raise
    except BaseException as e:
        note = durability.failure_note(e)
        raise
    finally:
        report, summary = _close(db, run_id, run_dir, status, note, figures=figures)
    return RunOutcome(run_id=run_id, run_dir=run_dir, status=status, report=report, summary=summary)


def _validation(cfg: ExperimentConfig, topology: str, model_bytes: int, store: Path | None) -> dict[str, Any]:
    """What the run records of the newest validation in `store` that covers its regime, or why none does."""
    return covering(store or validations_path(), Regime.of(topology, [model_bytes], cfg.locals, cfg.schedulers),
                    shaper=cfg.simulation.shaper_burst_k > 0, segments=cfg.simulation.segment_mss > 0)


def _close(db: ResultsDB, run_id: int, run_dir: Path, status: str, note: str, *,
           figures: bool) -> tuple[Path | None, RunSummary | None]:
    """On every exit path: the run marked (`durability.finish_or_leave`), its results written
    (`write_results_on_exit`: logged if they cannot be; a full disk raised), the database closed."""
    durability.finish_or_leave(db, run_id, status, note, LOG)
    try:
        return write_results_on_exit(db, run_id, run_dir, figures=figures, log=LOG)
    finally:
        db.close()


def _open(cfg: ExperimentConfig, out_root: Path, model: Any, plan: EmulationPlan, *, source: dict[str, Any] | None,
          resume: Path | None) -> tuple[Path, ResultsDB, int, Resume | None]:
    """A new run's folder and database (run started, topology recorded), or the run in `resume` reopened."""
    if resume is not None:
        for stale in sorted(resume.glob("netai-sim-*")):  # a killed run's engine files
            shutil.rmtree(stale, ignore_errors=True)
            print(f"netai: removed {stale.name}: the engine files of the run that stopped", flush=True)
        db = ResultsDB(resume / "results.db")
        run_id = int(queries.last_run_id(db.conn) or 0)
        return resume, db, run_id, reopen(db, run_id, resume)
    run_dir = _new_run_dir(out_root, f"{cfg.name}-sim-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        db = ResultsDB(run_dir / "results.db")
        run_id = db.start_run(cfg.name, cfg.to_dict(), engine="simulation", source=source)
    except BaseException:  # e.g. Ctrl-C: no run recorded, so no folder left that holds none
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    db.record_topology(run_id, model.name, model.to_dict(), plan.to_dict())
    return run_dir, db, run_id, None


def _replay_figures(replay: ReplayedBackground | None, network: SimNetwork, off: bool) -> dict[str, Any]:
    """The environment's ``scheduler_background`` and how many tasks were replayed, of how many."""
    return {"scheduler_background": _scheduler_background(replay, network, off),
            "scheduler_background_replayed": len(network.replayed), "scheduler_background_tasks": len(network.asked)}


def _scheduler_background(replay: ReplayedBackground | None, network: SimNetwork, off: bool) -> str:
    """What the run's schedulers were told of the background (the environment's ``scheduler_background``)."""
    if replay is None:
        return "none: no background" if off else "modelled: the background flows' mean traffic, the same for every task"
    k, n = len(network.replayed), len(network.asked)
    told = f"{k} task{'' if k == 1 else 's'}" if k == n else f"{k} of {n} tasks; the others {'none' if off else 'modelled'}"
    return f"replayed: what the schedulers of {replay.source} were given, per task ({told})"


def _model_sizes(cfg: ExperimentConfig, model_bytes: int | None
                 ) -> tuple[int, Callable[[int], tuple[int, ...]] | None]:
    """The model's bytes and a copy's frames at a chunk size (`model_sizes`, the model built here);
    with `model_bytes` given (a benchmark) no model is built and the frames are not modelled."""
    if model_bytes is not None:
        return model_bytes, None
    from orchestrator.runtime.compute import model_sizes

    return model_sizes(cfg.task.model, cfg.task.model_args, cfg.task.dataset, cfg.task.dataset_args)


def controller_route(plan: EmulationPlan, src: str, dst: str) -> list[str]:
    """The path the emulation's controller routes background traffic from `src` to `dst` on: one
    fewest-hops path per host pair, found from the pair's smaller name (`controller.flows`)."""
    from controller.flows import shortest_site_path

    a, b = sorted((src, dst))
    path = shortest_site_path(plan, a, b)
    return path if src == a else path[::-1]


def _new_run_dir(out_root: Path, stamp: str) -> Path:
    """A new folder `stamp` under `out_root` (``stamp-2``, ... if taken): a simulation can take
    less than a second, and a run never reuses another's folder."""
    out_root.mkdir(parents=True, exist_ok=True)
    n = 1
    while True:
        run_dir = out_root / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            run_dir.mkdir()
            return run_dir
        except FileExistsError:
            n += 1


def _background(cfg: ExperimentConfig, model: Any, plan: EmulationPlan, params: SimParams) -> SimBackground | None:
    """The simulated background: the emulation's plan, seed and on/off processes, on the controller's routes."""
    background = SimBackground.plan(model, plan, cfg.background, topology=cfg.topology, seed=cfg.seed,
                                    emulated_rates=params.rates == "emulated", share=BACKGROUND_SHARE)
    return None if background is None else background.routed(lambda a, b: controller_route(plan, a, b))


def _planning(cfg: ExperimentConfig, training: ModelledTraining) -> Callable[[str], Any]:
    """The config's schedulers by label, a ``joint`` planning with the run's modelled training, as
    the emulation's do (`compute_model.for_training`)."""
    return lambda label: for_training(cfg.scheduler(label), training, cfg.task.local_epochs)


def _training(cfg: ExperimentConfig, params: SimParams) -> ModelledTraining:
    """The run's modelled training as the simulation takes it (recorded under the emulation's keys,
    `ModelledTraining.environment`): the compute model's (`sim_params`; counted once per process),
    or the simulation section's own figures where they stand instead."""
    if params.site_speed or cfg.task.compute_timing != "modeled":
        return resolve(cfg.task, cfg.compute)
    return ModelledTraining("set in the simulation section (seconds_per_example, seconds_per_round)",
                            TrainingCost(s_per_example=params.seconds_per_example, s_per_round=params.seconds_per_round),
                            params.train_examples, cfg.compute)


def _environment(cfg: ExperimentConfig, plan: EmulationPlan, params: SimParams, background: SimBackground | None,
                 calibration: dict[str, Any], training: ModelledTraining) -> dict[str, Any]:
    """The run's environment: the engine, every parameter of the model, the calibration used and
    the modelled training (the emulation's ``compute_*`` keys), so the report says the run was
    simulated and how (the settings left at their defaults and not calibrated listed under ``defaults``)."""
    env = {**_parameters(cfg, plan, params, background), **calibration, **training.environment()}
    env["defaults"] = [k for k in env["defaults"] if k not in calibration.get("calibrated_params", [])]
    if calibration.get("calibrated") is True:
        env["calibration"] = calibration["calibration_summary"]
    return env


def _parameters(cfg: ExperimentConfig, plan: EmulationPlan, params: SimParams,
                background: SimBackground | None) -> dict[str, Any]:
    return {
        "engine": "simulation (flow-level, SimGrid)", "mode": cfg.mode, "python": platform.python_version(),
        "rates": params.rates, "bw_scale": plan.bw_scale if params.rates == "emulated" else 1.0,
        "tcp_efficiency": params.tcp_efficiency, "per_hop_latency_ms": params.per_hop_latency_ms,
        "delay_emulated": params.propagation, "alpha_s": params.alpha_s,
        "seconds_per_example": params.seconds_per_example, "seconds_per_round": params.seconds_per_round,
        "local_epochs": params.local_epochs,
        "compute_timing": "modeled" if params.site_speed else "fixed", "training_from_profile": params.site_speed,
        "train_examples": params.train_examples, "max_segments": params.max_segments,
        "cpu_cores": params.cpu_cores, "cpu_s_per_byte": params.cpu_s_per_byte,
        "cpu_s_per_chunk": params.cpu_s_per_chunk,
        "cpu_s_per_byte_hop": params.cpu_s_per_byte_hop, "wire_bytes_factor": params.wire_bytes_factor,
        "train_cpu_factor": params.train_cpu_factor, "ack_share": params.ack_share,
        "shaper_burst_k": params.shaper_burst_k, "segment_mss": params.segment_mss,
        "calibration": cfg.simulation.calibration,
        "defaults": sorted(k for k, v in asdict(cfg.simulation).items() if v == getattr(SimulationConfig(), k)),
        "background": "off" if background is None else
        f"{cfg.background.pattern}, load {cfg.background.load}, {len(background.flows)} flows (simulated: the "
        "emulation's plan, seed and on/off processes; tasks served first, as htb serves them)",
        "modelled_background_total_mbps": None if background is None else round(sum(background.view_mbps().values()), 3),
    }


def _admit_all(cfg: ExperimentConfig, core: Lifecycle, model: Any, model_bytes: int,
               again: Resume | None = None) -> list[LiveTask]:
    """Every point's tasks under every scheduler, in the emulation's order (`scheduler_order`), on
    its network state (the sequential mode's: every scheduler sees the point's earlier tasks'
    reservations); on a resume (`again`) the kept tasks' reservations instead of running them again."""
    tasks = task_sets(cfg, model, model_bytes)
    states = {(s, n): NetworkState(model) for s in cfg.schedulers for n in cfg.locals}
    admitted = []
    for n in cfg.locals:
        for k, task in enumerate(tasks[n]):
            for name in scheduler_order(cfg.schedulers, k, cfg.order):
                if again is not None and again.has(name, task.id):
                    again.readmit(name, task.id, states[(name, n)])
                    continue
                core.arrive(name, task)
                live = core.admit(name, task, states[(name, n)])
                if not live.ended:
                    admitted.append(live)
    return admitted


class SimRecorder(DbRecorder):
    """The results database as the simulation fills it: a simulated task arrives, is admitted and
    starts when its run starts (no set-up is modelled, so its start overhead is 0 by definition),
    and its set-up figures are only those the model has."""

    def times(self, label: str, task_id: int, **times: float | None) -> None:
        first = times.get("first_broadcast_s")
        if first is not None:
            times.update(arrival_s=first, admitted_s=first, start_overhead_s=0.0)
        super().times(label, task_id, **times)

    def tcp_bytes(self, label: str, task_id: int, sent: int | None, retrans: int | None) -> None:
        """Nothing: the flow-level model has no TCP, so its tasks' TCP columns stay NULL (not modelled)."""

    def setup(self, label: str, task_id: int, **figures: float | int | bool) -> None:
        keep = ("chunk_bytes", "store_and_forward_s", "broadcast_bytes", "upload_bytes")
        super().setup(label, task_id, simulated=True, **{k: v for k, v in figures.items() if k in keep})
