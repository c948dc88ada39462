"""`netai validate CONFIG`: run a config both ways, emulated and simulated, on the same tasks, and
say how far apart they are (docs/simulation.md, "Flow-level simulation", validation).

Both runs take their tasks from the config's seed (`runs.task_sets`), in the same order under the
same schedulers, so every task is compared with itself (`orchestrator.results.agreement`). The
simulated twin is the config with ``engine: simulation`` at the emulated link rates, with this
host's calibration (`experiment.simulated.apply_calibration`; none: it says it is uncalibrated).
The emulated half may be an earlier emulated run of the same config (`emulated_run`): it is the
expensive half, and the same tasks make it the same measurement.

The emulated reference runs at this host's time dilation K (`host_dilation`, stored by `netai
calibrate`) when the config sets no K itself (`reference_config`; ``time_dilation: host`` too), so
that it measures the emulated network rather than the host's contention; which K and which
calibration is printed and recorded. A host without one runs it undilated, and says so.

Everything lands in one folder: the two run folders, ``validation.json`` (every figure printed)
and ``sim_vs_emu.png``/``.svg`` (simulated against emulated, per task). What was validated (the
config, the host, the regime, the worst and geometric-mean error) is added to the user's store of
validations (`validation_store`), which simulated runs cite. An emulated reference that is not
faithful at some point (its own fidelity verdict) is said first, as soon as it is known, and heads
the output; the validation is still written and stored, marked ``reference_faithful: false``, and
covers no simulated run (`netai validate` exits 1).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.experiment import validation_store
from orchestrator.experiment.calibrate import as_simulated, replace_backend, same_config_run
from orchestrator.experiment.config import ExperimentConfig, parse_config
from orchestrator.experiment.validation_store import Regime, ValidationRecord
from orchestrator.results import agreement_report as out
from orchestrator.results.agreement import (
    ClaimAgreement,
    PointAgreement,
    claim_agreement,
    latency_errors,
    paired_tasks,
    point_agreement,
)
from orchestrator.results.db import ResultsDB
from orchestrator.results.dilation import k_for, per_point
from orchestrator.results.queries import SchedulerViews
from orchestrator.results.summary import RunSummary, TaskSummary, run_summary
from orchestrator.simulation.spec import twin_simulation

Say = Callable[[str], None]


@dataclass(frozen=True)
class Validation:
    out_dir: Path
    points: list[PointAgreement]
    claims: list[ClaimAgreement]
    figure: tuple[Path, ...]
    calibrated: bool
    #: Whether the emulated reference was faithful at every point (its own fidelity verdict).
    reference_faithful: bool
    record: ValidationRecord


def check_validatable(cfg: ExperimentConfig) -> None:
    """Refuse what the simulation cannot stand for, before anything starts.

    Raises
    ------
    ConfigError
        For the online mode, fault events, or a remote cluster.
    """
    if cfg.mode != "sequential":
        raise ConfigError("netai validate compares the sequential mode (the simulation runs no other)")
    if cfg.events:
        raise ConfigError("netai validate takes a config without fault events (the simulation models none)")
    if cfg.emulation.cluster is not None or cfg.remote_servers:
        raise ConfigError("netai validate runs on one machine: the config has a cluster or remote servers")


def simulated_twin(cfg: ExperimentConfig, *, propagation: bool, time_dilation: float = 1.0,
                   paced: bool = False) -> ExperimentConfig:
    """`cfg` on the flow-level model at the emulated rates, with propagation delay as the emulated
    run had it (its other settings unchanged). A time-dilated emulation records its durations
    divided by K, in the emulated network's time, which is the simulation's: the twin has no K,
    but the per-chunk work and chunk size of the emulation at `time_dilation` (`twin_simulation`),
    and htb's burst unless the emulation's senders `paced` their copies."""
    raw = as_simulated(cfg.to_dict(), twin_simulation(propagation=propagation, time_dilation=time_dilation,
                                                      paced=paced))
    return parse_config(raw, where=f"{cfg.name} (simulated twin)")


def twin_configs(cfg: ExperimentConfig, env: Mapping[str, Any], *, propagation: bool) -> list[ExperimentConfig]:
    """The simulated twins of `cfg`'s emulated run (its environment `env`): one at the run's K; with a
    K per point, one per K, each holding the points that ran at it (`dilation.k_for`), since what K
    changes of the emulation (its per-chunk work in emulated time, its chunk size) is a point's own.
    Whether its copies were paced is the run's (``paced_copies``; a run from before pacing was not)."""
    paced = bool(env.get("paced_copies", False))
    by_k: dict[float, list[int]] = {}
    for n in dict.fromkeys(cfg.locals):
        by_k.setdefault(k_for(env, n), []).append(n)
    if not per_point(env) or len(by_k) == 1:
        return [simulated_twin(cfg, propagation=propagation, time_dilation=k_for(env, max(cfg.locals)), paced=paced)]
    return [simulated_twin(replace(cfg, name=f"{cfg.name}-k{k:g}", locals=tuple(ns)), propagation=propagation,
                           time_dilation=k, paced=paced) for k, ns in by_k.items()]


def reference_config(cfg: ExperimentConfig, store: Path | None, *, host_k: bool, say: Say) -> ExperimentConfig:
    """The config the emulated reference runs: ``time_dilation: host`` resolved (a `ConfigError`
    without the host's K); with `host_k` (the config sets no K itself) at the host's K when its
    calibration has one, else undilated, saying so; otherwise `cfg` as it is."""
    from orchestrator.experiment.host_dilation import host_calibration, resolve, with_k

    if cfg.emulation.time_dilation_host:
        cfg = resolve(cfg, store)
    elif host_k:
        try:
            cfg = with_k(cfg, host_calibration(store))
        except ConfigError as e:
            say(f"emulated reference undilated (K=1), which on a small host measures the host too: {e}")
            return cfg
    else:
        return cfg
    say(f"emulated reference at this host's time dilation K={cfg.emulation.time_dilation:g} "
        f"(calibration {cfg.emulation.time_dilation_from})")
    return cfg


def validate(cfg: ExperimentConfig, *, out_root: Path, backend: str | None = None, emulated_run: Path | None = None,
             calibration_store: Path | None = None, host_k: bool = False, say: Say = print,
             validations: Path | None = None, figures: bool = True) -> Validation:
    """Run `cfg` both ways and compare (see the module docstring); with `host_k` (the config sets no
    K) the emulated reference runs at the host's K (`reference_config`). The validation is added to
    the store at `validations` (default `validation_store.default_path`). Without `figures` the two
    runs' folders have their results and reports but no plots; the comparison's figure is drawn.

    Raises
    ------
    ConfigError
        Bad input (checked before anything starts), or an emulated run that completed no task.
    """
    if cfg.engine != "emulation":
        raise ConfigError("netai validate takes an emulated config (engine: emulation); it simulates it itself")
    check_validatable(cfg)
    if backend:
        cfg = replace_backend(cfg, backend)
    cfg = reference_config(cfg, calibration_store, host_k=host_k, say=say)
    emu_id = same_config_run(emulated_run, cfg) if emulated_run is not None else None
    folder = out_root / f"{cfg.name}-validate-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=False)
    if emulated_run is None:
        from orchestrator.experiment.runner import run_experiment

        say(f"[1/3] emulated run of {cfg.name} ({cfg.emulation.backend} backend) ...")
        outcome = run_experiment(cfg, out_root=folder, progress=False, figures=figures)
        if outcome.status != "completed":
            raise ConfigError(f"the emulated run {outcome.run_dir} ended {outcome.status}: nothing to compare")
        emu_dir, emu_id = outcome.run_dir, outcome.run_id
    else:
        say(f"[1/3] emulated run: {emulated_run} (run {emu_id}, the same config)")
        emu_dir = emulated_run
    emu_summary = _summary(emu_dir, int(emu_id or 0))
    unfaithful = out.unfaithful_headline(emu_summary.verdicts)
    if unfaithful:
        say(unfaithful)
    from orchestrator.experiment.simulated import ReplayedBackground, run_simulated
    from orchestrator.results.queries import scheduler_views

    with ResultsDB(emu_dir / "results.db") as db:
        env = db.run(int(emu_id or 0))["environment"]
        by_scheduler = scheduler_views(db.conn, int(emu_id or 0)) if cfg.background.enabled else {}
    views = first_views(by_scheduler)
    delay = bool(env.get("delay_emulated", False))
    say(f"[2/3] simulated run of {cfg.name} (the same tasks; propagation {'on' if delay else 'off'}, "
        "as the emulated links had it; each task's schedulers given the background the emulated ones were) ...")
    replay = ReplayedBackground(f"the emulated run {emu_dir.name} (run {emu_id})", views) if views else None
    sims = [run_simulated(twin, out_root=folder, calibration_store=calibration_store, replay=replay,
                          figures=figures) for twin in twin_configs(cfg, env, propagation=delay)]
    twins = [(sim.run_dir, _summary(sim.run_dir, sim.run_id)) for sim in sims]
    _say_replay(twins[0][1].environment, split_views(by_scheduler), say)
    say("[3/3] comparing ...")
    measured = [sum(v.values()) for v in views.values()]
    result = _compare(folder, cfg, emu_dir, emu_summary, twins, say, measured)
    validation_store.save(result.record, validations or validation_store.default_path())
    return result


def first_views(views: SchedulerViews) -> dict[int, dict[tuple[str, str], float]]:
    """Per task id, its first scheduler's view: an emulated view is one per task, the same for each
    of its schedulers, so the first stands for the task."""
    return {task_id: next(iter(by.values())) for task_id, by in views.items()}


def split_views(views: SchedulerViews) -> list[int]:
    """The task ids whose schedulers were given different backgrounds (a scheduler keeps the last
    view while the controller does not answer), sorted."""
    return sorted(t for t, by in views.items() if len({tuple(sorted(v.items())) for v in by.values()}) > 1)


def _summary(run_dir: Path, run_id: int) -> RunSummary:
    with ResultsDB(run_dir / "results.db") as db:
        return run_summary(db, run_id)


def _parts(run_dir: Path, run_id: int) -> dict[tuple[str, int], dict[str, float]]:
    from orchestrator.results.queries import point_parts

    with ResultsDB(run_dir / "results.db") as db:
        return point_parts(db.conn, run_id)


def _say_replay(env: Mapping[str, Any], split: list[int], say: Say) -> None:
    """Warn where the replay (the simulated run's environment `env`) is not what the emulated
    schedulers had: tasks it had no view for, and tasks whose emulated schedulers were given
    different views (each simulated one got the first's)."""
    k, n = env.get("scheduler_background_replayed", 0), env.get("scheduler_background_tasks", 0)
    if env.get("scheduler_background", "").startswith("replayed") and k < n:
        say(f"warning: the emulated run recorded no view for {n - k} of the {n} tasks; their simulated "
            "schedulers were given the modelled background")
    if split:
        say(f"warning: the emulated schedulers of task(s) {', '.join(map(str, split))} were given different "
            "backgrounds (a scheduler keeps its last view while the controller does not answer); the "
            "simulated ones were all given the first scheduler's")


def _schedules(run_dir: Path, run_id: int) -> dict[tuple[str, int], str]:
    from orchestrator.results.queries import decisions

    with ResultsDB(run_dir / "results.db") as db:
        return decisions(db.conn, run_id)


def _compare(folder: Path, cfg: ExperimentConfig, emu_dir: Path, emu: RunSummary,
             twins: Sequence[tuple[Path, RunSummary]], say: Say, measured_background: list[float]) -> Validation:
    """The agreement tables printed and written (headed by the reference's fidelity when it was not
    faithful), the figure drawn, and the validation's record; `twins` are the simulated runs (one, or
    one per K of a run with a K per point: their tasks compared together)."""
    sim_tasks = [t for _, s in twins for t in s.tasks]
    pairs = paired_tasks(emu.tasks, sim_tasks)
    if not pairs:
        raise ConfigError("no task completed in both runs: nothing to compare")
    points = point_agreement(emu.tasks, sim_tasks)
    claims = claim_agreement(emu.tasks, sim_tasks)
    env = twins[0][1].environment
    calibrated = env.get("calibrated") is True
    head = (f"calibrated: {env.get('calibration_summary')}" if calibrated else
            "UNCALIBRATED: " + str(env.get("uncalibrated_reason", "no calibration of this host")))
    figure = out.draw_tasks(pairs, folder, f"{cfg.name}: simulated vs emulated, per task")
    scheduled, differing = out.schedule_identity(_schedules(emu_dir, emu.run_id),
                                                 {k: v for d, s in twins for k, v in _schedules(d, s.run_id).items()})
    view = out.background_view_line(str(env.get("scheduler_background", "modelled")), measured_background,
                                    env.get("modelled_background_total_mbps"))
    sim_parts = {k: v for d, s in twins for k, v in _parts(d, s.run_id).items()}
    unfaithful = out.unfaithful_headline(emu.verdicts)
    record = _record(cfg, pairs, points, folder, faithful=unfaithful is None, calibration=env.get("calibration_id"),
                     shaper=float(env.get("shaper_burst_k") or 0) > 0, segments=int(env.get("segment_mss") or 0) > 0)
    lines = [*([unfaithful] if unfaithful else []),
             f"validate {cfg.name}: emulated {emu_dir} (run {emu.run_id}), simulated "
             + ", ".join(f"{d} (run {s.run_id})" for d, s in twins),
             f"emulated at {_dilation_text(emu.environment)} ("
             + (f"this host's, calibration {cfg.emulation.time_dilation_from})" if cfg.emulation.time_dilation_from
                else "chosen by its trials)" if cfg.emulation.time_dilation_auto else "the config's)"),
             f"simulation {head}; propagation {'on' if env.get('delay_emulated') else 'off'}, emulated delay "
             f"{'on' if emu.environment.get('delay_emulated') else 'off'}",
             f"tasks compared: {len(pairs)} (emulated done {sum(t.state == 'done' for t in emu.tasks)}, "
             f"simulated done {sum(t.state == 'done' for t in sim_tasks)})", view,
             out.schedules_line(scheduled, differing), "",
             *out.point_lines(points), "", *out.reference_lines(emu.verdicts), "",
             *out.claim_lines(claims), "",
             *out.parts_lines(_parts(emu_dir, emu.run_id), sim_parts), "", out.carried_line(points),
             out.retrans_line(points), _errors_line(record), f"figure: {figure[0]}"]
    for line in lines:
        say(line)
    doc: dict[str, Any] = {"config": cfg.name, "config_hash": record.config_hash, "emulated_run": str(emu_dir),
                           "simulated_run": str(twins[0][0]), "simulated_runs": [str(d) for d, _ in twins],
                           "reference_faithful": record.reference_faithful,
                           "unfaithful_points": [[v.scheduler, v.n_locals] for v in emu.unfaithful],
                           "calibrated": calibrated, "calibration": env.get("calibration_summary"),
                           "time_dilation": emu.environment.get("time_dilation", cfg.emulation.time_dilation),
                           "time_dilation_per_point": emu.environment.get("time_dilation_per_point"),
                           "time_dilation_from": cfg.emulation.time_dilation_from or None,
                           "tasks_compared": len(pairs), "figure": [str(p) for p in figure],
                           "scheduler_background": env.get("scheduler_background"),
                           "decisions_compared": scheduled, "decisions_differing": [list(k) for k in differing],
                           "record": record.to_dict()}
    (folder / "validation.json").write_text(json.dumps(out.as_json(points, claims, doc), indent=1, default=str))
    (folder / "validation.txt").write_text("\n".join(lines) + "\n")
    return Validation(folder, points, claims, figure, calibrated, record.reference_faithful, record)


def _record(cfg: ExperimentConfig, pairs: list[tuple[TaskSummary, TaskSummary]], points: list[PointAgreement],
            folder: Path, *, faithful: bool, calibration: str | None, shaper: bool,
            segments: bool) -> ValidationRecord:
    """What the store keeps of this validation: the regime is that of the tasks both engines completed."""
    from orchestrator import __version__
    from orchestrator.simulation.calibration import HostIdentity, new_id
    from orchestrator.simulation.spec import MODEL_REVISION

    host = HostIdentity.here()
    rid, created = new_id(host)
    digest = hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True, default=str).encode()).hexdigest()[:12]
    regime = Regime.of(cfg.network().name, [e.model_bytes for e, _ in pairs], [e.n_locals for e, _ in pairs],
                       [e.scheduler for e, _ in pairs])
    worst, geomean = latency_errors(points)
    return ValidationRecord(id=f"{rid}-{digest[:6]}", created=created, host=host.hostname, version=__version__,
                            model=MODEL_REVISION, config=cfg.name, config_hash=digest, regime=regime, worst_error=worst,
                            geomean_error=geomean, reference_faithful=faithful, calibration=calibration,
                            folder=str(folder), shaper=shaper, segments=segments)


def _errors_line(record: ValidationRecord) -> str:
    faithful = "" if record.reference_faithful else "; NOT recorded as covering it: the reference was not faithful"
    return (f"mean round latency sim/emu: worst error {record.worst_error:.2%}, geometric-mean error "
            f"{record.geomean_error:.2%}; regime {record.regime.text()}{faithful}")


def _dilation_text(env: Mapping[str, Any]) -> str:
    """``time dilation K=8``, or with a K per point ``time dilation K=2 at 1 locals, K=16 at 8 locals``."""
    ks = per_point(env)
    if ks:
        return "time dilation " + ", ".join(f"K={k:g} at {n} locals" for n, k in ks.items())
    return f"time dilation K={float(env.get('time_dilation') or 1.0):g}"
