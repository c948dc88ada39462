"""`engine: simulation`: an experiment config run on the flow-level model (`orchestrator.simulation`).

The same task sets (`runner.task_sets`), the same schedulers, in the same order and on the same
network states as the sequential mode of the emulation (every scheduler sees the reservations of
the point's earlier tasks; no background load), then every admitted task's rounds simulated on
SimGrid (child engine processes, `orchestrator.simulation.spec.simulate`), recorded in the same results database, CSVs,
figures and report. The run is marked ``engine = simulation`` (the `runs` table) and its
environment lists the model's parameters, so the report says it was simulated and how.
"""

from __future__ import annotations

import itertools
import logging
import math
import platform
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from orchestrator.experiment.config import ExperimentConfig, SimulationConfig
from orchestrator.experiment.runner import RunOutcome, task_sets
from orchestrator.experiment.task_manager import round_bound
from orchestrator.results.db import ResultsDB
from orchestrator.results.report import write_results
from orchestrator.runtime.task_runner import node_rounds, summarize
from orchestrator.scheduling import NetworkState
from orchestrator.scheduling.cost import RoundFigures, capacity_rate, emulated_rate, round_figures
from orchestrator.scheduling.schedule import Schedule
from orchestrator.simulation.spec import SimParams, TaskRun, build_spec, simulate
from topologies.plan import EmulationPlan

LOG = logging.getLogger("netai.simulation")


def sim_params(cfg: ExperimentConfig) -> SimParams:
    """The model's parameters from the config's `simulation` section."""
    return SimParams(**{k: v for k, v in asdict(cfg.simulation).items() if k != "calibration"})


def run_simulated(cfg: ExperimentConfig, *, out_root: Path, model_bytes: int | None = None) -> RunOutcome:
    """Run `cfg` on the flow-level model; results in a new run folder under `out_root`.

    `model_bytes` skips building the model to size it (`check_model`), e.g. in a benchmark.
    """
    model = cfg.network()
    plan = EmulationPlan.from_model(model, max_link_mbps=cfg.emulation.max_link_mbps)
    params = sim_params(cfg)
    if model_bytes is None:
        from orchestrator.runtime.compute import check_model

        model_bytes = check_model(cfg.task.model, cfg.task.model_args)
    rate = emulated_rate(plan) if params.rates == "emulated" else capacity_rate(model)
    stamp = f"{cfg.name}-sim-{time.strftime('%Y%m%d-%H%M%S')}"
    out_root.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):  # a simulation can take less than a second: never reuse a folder
        run_dir = out_root / (stamp if n == 1 else f"{stamp}-{n}")
        try:
            run_dir.mkdir()
            break
        except FileExistsError:
            continue
    db = ResultsDB(run_dir / "results.db")
    run_id = db.start_run(cfg.name, cfg.to_dict(), engine="simulation")
    db.record_topology(run_id, model.name, model.to_dict(), plan.to_dict())
    db.set_environment(run_id, {
        "engine": "simulation (flow-level, SimGrid)", "mode": cfg.mode, "python": platform.python_version(),
        "rates": params.rates, "bw_scale": plan.bw_scale if params.rates == "emulated" else 1.0,
        "tcp_efficiency": params.tcp_efficiency, "per_hop_latency_ms": params.per_hop_latency_ms,
        "delay_emulated": params.propagation, "alpha_s": params.alpha_s,
        "seconds_per_example": params.seconds_per_example, "local_epochs": params.local_epochs,
        "train_examples": params.train_examples, "max_segments": params.max_segments,
        "cpu_cores": params.cpu_cores, "cpu_s_per_byte": params.cpu_s_per_byte,
        "cpu_s_per_chunk": params.cpu_s_per_chunk,
        "cpu_s_per_byte_hop": params.cpu_s_per_byte_hop, "calibration": cfg.simulation.calibration,
        "defaults": sorted(k for k, v in asdict(cfg.simulation).items() if v == getattr(SimulationConfig(), k)),
        "background": "not simulated"})
    status, note = "failed", ""
    try:
        t0 = time.monotonic()
        runs, figures = _schedule_all(cfg, db, run_id, model, model_bytes, rate, params)
        db.update_environment(run_id, scheduling_wall_s=round(time.monotonic() - t0, 3))
        t0 = time.monotonic()
        result: dict[str, Any] = simulate(build_spec(model, runs, params, rate)) if runs else {"runs": [], "sim_end_s": 0.0}
        done = _record(db, run_id, runs, figures, result)
        db.update_environment(run_id, clock_end_s=round(float(result["sim_end_s"]), 6),
                              simulation_wall_s=round(time.monotonic() - t0, 3),
                              simulation_peak_rss_mb=round(result.get("peak_rss_bytes", 0) / 2**20, 1),
                              simulation_processes=int(result.get("processes", 0)))
        status = "completed" if done else "failed"
        note = "" if done else "no task completed"
    except BaseException as e:
        note = f"{type(e).__name__}: {e}"
        raise
    finally:
        db.finish_run(run_id, status, note)
        report, summary = None, None
        try:
            report, summary = write_results(db, run_id, run_dir)
        except Exception:
            LOG.exception("writing the results failed")
        db.close()
    return RunOutcome(run_id=run_id, run_dir=run_dir, status=status, report=report, summary=summary)


def _schedule_all(cfg: ExperimentConfig, db: ResultsDB, run_id: int, model: Any, model_bytes: int, rate: Any,
                  params: SimParams) -> tuple[list[TaskRun], dict[str, tuple[str, Schedule, RoundFigures]]]:
    """Every point's tasks under every scheduler, in the emulation's order, on its network state."""
    tasks = task_sets(cfg, model, model_bytes)
    states = {(s, n): NetworkState(model) for s in cfg.schedulers for n in cfg.locals}
    runs: list[TaskRun] = []
    figures: dict[str, tuple[str, Schedule, RoundFigures]] = {}
    for n in cfg.locals:
        for task in tasks[n]:
            for name in cfg.schedulers:
                db.record_task(run_id, name, task, state="pending")
                state = states[(name, n)]
                db.record_network_state(run_id, name, task.id, state)
                schedule = cfg.scheduler(name).schedule(state, task)
                if schedule.blocked:
                    db.set_task_state(run_id, name, task.id, "blocked", schedule.reason)
                    continue
                state.admit(schedule)
                fig = round_figures(model, schedule, task.model_bytes, rate=rate, propagation=params.propagation)
                db.record_schedule(run_id, schedule, fig.lower_bound.lower_s, scheduler=name)
                db.set_task_state(run_id, name, task.id, "running")
                key = f"{name}/{task.id}"
                runs.append(TaskRun(key, schedule, task.model_bytes, task.rounds))
                figures[key] = (name, schedule, fig)
    return runs, figures


def _record(db: ResultsDB, run_id: int, runs: list[TaskRun], figures: dict[str, tuple[str, Schedule, RoundFigures]],
            result: dict[str, Any]) -> int:
    """Record every simulated run's rounds, nodes, times and carried bytes; the number done."""
    by_key = {r["key"]: r for r in result["runs"]}
    done = 0
    for run in runs:
        name, schedule, fig = figures[run.key]
        tid = schedule.task_id
        r = by_key.get(run.key)
        if r is None:
            db.set_task_state(run_id, name, tid, "failed", "the simulation did not finish the task")
            continue
        events = r["events"]
        for ev in events.get(schedule.global_site, []):
            if ev["event"] == "round_complete":  # no training is run: no accuracy or loss
                ev.update(accuracy=math.nan, loss=math.nan, num_examples=0)
        for rr in summarize(schedule, events, rounds=run.rounds):
            # the bound and the reference with the round's own fastest training, as an emulated run's
            lb = round_bound(fig, schedule, rr)
            db.record_round(
                run_id, name, tid, rr.round, latency_s=rr.latency_s, broadcast_s=rr.broadcast_s,
                train_s=rr.train_s, upload_s=rr.upload_s, accuracy=None, lower_bound_s=lb.lower_s,
                broadcast_all_s=rr.broadcast_all_s, upload_tail_s=rr.upload_tail_s,
                broadcast_bound_s=lb.broadcast_s, upload_bound_s=lb.upload_s,
                reference_s=replace(fig.reference, train_s=rr.train_min_s).lower_s)
        db.record_node_rounds(run_id, name, tid, node_rounds(schedule, events))
        start, end = float(r["start_s"]), float(r["end_s"])
        db.set_task_times(run_id, name, tid, arrival_s=start, admitted_s=start, first_broadcast_s=start,
                          finished_s=end, start_overhead_s=0.0)
        db.set_carried_bytes(run_id, name, tid, sum(int(n) for _, _, n in r["link_bytes"]))
        sf = fig.store_and_forward
        db.set_task_setup(run_id, name, tid, chunk_bytes=int(r["chunk_bytes"]), simulated=True,
                          store_and_forward_s=sf.broadcast_s + sf.upload_s)
        db.set_task_state(run_id, name, tid, "done", at_s=end)
        done += 1
    return done

