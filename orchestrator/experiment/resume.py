"""`netai experiment --resume RUN_DIR`: continue a run that was interrupted, crashed or killed.

A run records where its config came from (`source`: the file, the command line's overrides and the
config as they made it, the ``runs.source_json`` column; a sweep in ``sweep.json``). A resume:

1. finds the run in RUN_DIR and refuses, before anything starts, a run that is still running, an
   online run (its tasks share the run's clock: the rest cannot be run as they would have been),
   or a config file that changed since the run started (one line naming the first setting that did);
2. says so and changes nothing when every task of the run is recorded and the run ended;
3. otherwise reopens the run (`ResultsDB.reopen_run`: a crashed one marked so, the half-recorded
   tasks discarded, the resume recorded) and runs the tasks the run does not hold, the same seeded
   tasks in the same order with the same K (with a K per point, each point's: `recorded_dilation`), every scheduler's network state holding the
   reservations of the point's earlier tasks (`Resume.readmit`).

The report covers the whole run and says when it was resumed (`durability.resume_lines`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import ExperimentConfig, load_config, parse_config
from orchestrator.experiment.emulation_config import recorded_emulation
from orchestrator.results import durability, queries
from orchestrator.results.db import ResultsDB
from orchestrator.scheduling import NetworkState, Schedule

#: What a sweep's folder records of it (the sweep's own `source`).
SWEEP_FILE = "sweep.json"


def write_sweep_record(sweep_dir: Path, name: str, source: Mapping[str, Any]) -> None:
    """The sweep's `SWEEP_FILE`, whole or not at all: written aside, synced, then renamed over (a crash
    or a full disk while it is written leaves no half file for a resume to stumble on)."""
    tmp = sweep_dir / f"{SWEEP_FILE}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"name": name, "source": dict(source)}, sort_keys=True))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, sweep_dir / SWEEP_FILE)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_sweep_record(sweep_dir: Path) -> dict[str, Any]:
    """The sweep's `SWEEP_FILE`.

    Raises
    ------
    ConfigError
        One line when it cannot be read (what a resume can do instead).
    """
    try:
        record = json.loads((sweep_dir / SWEEP_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        record = e
    if not isinstance(record, dict):
        why = record if isinstance(record, Exception) else "not a JSON object"
        raise ConfigError(f"{sweep_dir}: its {SWEEP_FILE} cannot be read ({why}): the sweep cannot be resumed as "
                          f"one; resume its runs one by one (--resume {sweep_dir}/RUN_DIR) or start it again")
    return record


def source_record(path: str | Path | None, overrides: Mapping[str, Any], cfg: ExperimentConfig) -> dict[str, Any]:
    """What a run records of where its config came from: the file (absolute), the command line's
    overrides and the config they made (before ``time_dilation: host`` is resolved)."""
    return {"path": None if path is None else str(Path(path).resolve()), "overrides": dict(overrides),
            "config": cfg.to_dict()}


def changes(old: Any, new: Any, where: str = "") -> list[str]:
    """The settings that differ between two configs as dicts, as ``key.sub: old -> new``, in key order."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{where}.{key}" if where else str(key)
            if key not in old:
                out.append(f"{sub}: added ({json.dumps(new[key])})")
            elif key not in new:
                out.append(f"{sub}: removed (was {json.dumps(old[key])})")
            else:
                out.extend(changes(old[key], new[key], sub))
        return out
    return [] if old == new else [f"{where or 'config'}: {json.dumps(old)} -> {json.dumps(new)}"]


def check_source(source: Mapping[str, Any], build: Any, config_path: str | Path | None = None) -> None:
    """Refuse a resume whose config changed since the run started: `build(path, overrides)` makes
    the config as the command line does; `config_path` overrides the recorded file.

    Raises
    ------
    ConfigError
        One line naming the first setting that changed (and how many more did), or a file that is gone.
    """
    path = config_path or source.get("path")
    if not path or "config" not in source:
        return  # a run started in code: nothing recorded to check against
    if not Path(path).exists():
        raise ConfigError(f"the run's config {path} is gone: give it as CONFIG to resume (--resume RUN_DIR CONFIG)")
    now = build(path, source.get("overrides", {})).to_dict()
    recorded = dict(source["config"])
    if isinstance(recorded.get("emulation"), dict):
        recorded["emulation"] = recorded_emulation(recorded["emulation"])
    diff = changes(recorded, now)
    if diff:
        more = f" (and {len(diff) - 1} more)" if len(diff) > 1 else ""
        raise ConfigError(f"the config changed since the run started: {diff[0]}{more}; resuming would mix "
                          "two configs in one run: start a new run instead")


@dataclass
class Resume:
    """A run being continued: its folder and id, and the task records it holds by (scheduler, task id)."""

    run_dir: Path
    run_id: int
    kept: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)

    def has(self, label: str, task_id: int) -> bool:
        return (label, task_id) in self.kept

    def outcomes(self, session: dict[str, int]) -> dict[str, int]:
        """The run's task outcomes: this session's (the core's, by state) and those of the tasks it kept."""
        total = dict(session)
        for rec in self.kept.values():
            if rec["state"] in total:
                total[rec["state"]] += 1
        return total

    def readmit(self, label: str, task_id: int, state: NetworkState) -> None:
        """Put a kept task's reservation back on its scheduler's network state, as it was when the
        run first placed it (a blocked task's, or one without a schedule, holds none)."""
        rec = self.kept[(label, task_id)]
        if rec["schedule"] is not None and rec["state"] != "blocked":
            schedule = Schedule.from_dict(rec["schedule"])
            if not schedule.blocked:
                state.admit(schedule)


@dataclass(frozen=True)
class Found:
    """A run found in a folder: its id, status, engine, config (as recorded) and source."""

    run_dir: Path
    run_id: int
    status: str
    engine: str
    config: dict[str, Any]
    source: dict[str, Any]
    owner: str


def find_run(run_dir: Path) -> Found:
    """The run in `run_dir` (its database's latest), a crashed one marked so.

    Raises
    ------
    ConfigError
        No results database there, or a run still running (its process alive, or on another host).
    """
    db_path = run_dir / "results.db"
    if not db_path.is_file():
        runs = sorted(p.parent.name for p in run_dir.glob("*/results.db"))
        if runs:  # a sweep's folder without its record
            raise ConfigError(f"{run_dir}: no run to resume here: it holds run folders ({', '.join(runs[:3])}"
                              f"{', ...' if len(runs) > 3 else ''}) but no {SWEEP_FILE} to resume them as one sweep: "
                              f"resume each (--resume {run_dir}/RUN_DIR)")
        raise ConfigError(f"{run_dir}: no run to resume here (no results.db)")
    with ResultsDB(db_path) as db:
        run_id = queries.last_run_id(db.conn)
        if run_id is None:
            raise ConfigError(f"{run_dir}: its results.db holds no run")
        durability.reap(db.conn, run_id)
        run = db.run(run_id)
    if run["status"] == "running":
        alive = durability.owner_alive(run.get("owner", ""))
        who = "its process is alive" if alive else "it may be running on another host"
        raise ConfigError(f"{run_dir}: the run is still running ({who}: {run.get('owner') or 'owner unknown'})")
    return Found(run_dir=run_dir, run_id=run_id, status=str(run["status"]), engine=str(run.get("engine", "")),
                 config=run["config"], source=json.loads(run.get("source_json") or "{}"), owner=run.get("owner", ""))


def expected_tasks(cfg: ExperimentConfig) -> set[tuple[str, int]]:
    """Every (scheduler, task id) the run of `cfg` records (sequential mode)."""
    from orchestrator.experiment.runs import task_sets

    sets = task_sets(cfg, cfg.network(), model_bytes=1)
    return {(name, task.id) for tasks in sets.values() for task in tasks for name in cfg.schedulers}


def recorded_config(found: Found, base_dir: Path | None) -> ExperimentConfig:
    """The run's config as it recorded it (validated again; scheduler files found from `base_dir`).

    Raises
    ------
    ConfigError
        An online run: its tasks share the run's clock, so the rest cannot run as they would have.
    """
    cfg = parse_config(found.config, where=f"{found.run_dir}/results.db", base_dir=base_dir)
    if cfg.mode == "online":
        raise ConfigError(f"{found.run_dir}: an online run cannot be resumed (its tasks arrive on the run's "
                          "clock and share the network): start it again")
    return cfg


def is_complete(found: Found, cfg: ExperimentConfig) -> bool:
    """Whether the run ended and holds a whole record of every task it runs."""
    if found.status in ("running", "crashed"):
        return False
    with ResultsDB(found.run_dir / "results.db") as db:
        have = set(queries.recorded_tasks(db.conn, found.run_id))
    return expected_tasks(cfg) <= have


def write_missing_results(run_dir: Path, run_id: int, *, figures: bool = True) -> bool:
    """Write a complete run's report, CSVs and figures again when its ``report.md`` is missing (a full
    disk stopped them: `orchestrator.results.report.write_results_on_exit`); whether it did."""
    if (run_dir / "report.md").is_file():
        return False
    from orchestrator.results.report import write_results

    with ResultsDB(run_dir / "results.db") as db:
        write_results(db, run_id, run_dir, figures=figures)
    return True


def reopen(db: ResultsDB, run_id: int, run_dir: Path) -> Resume:
    """Reopen run `run_id` for this process (`ResultsDB.reopen_run`): what it keeps."""
    row = db.reopen_run(run_id)
    kept = queries.recorded_tasks(db.conn, run_id)
    print(f"netai: resuming {run_dir.name}: {len(kept)} task run(s) kept, {row['discarded']} half-recorded "
          f"discarded (the run was {row['previous_status']})", flush=True)
    return Resume(run_dir=run_dir, run_id=run_id, kept=kept)


def load_for_resume(run_dir: Path, config_path: str | None, build: Any) -> tuple[Found, ExperimentConfig]:
    """The run in `run_dir` and its config, every check done (`find_run`, `check_source`,
    `recorded_config`): nothing has started when this raises."""
    found = find_run(run_dir)
    check_source(found.source, build, config_path)
    path = config_path or found.source.get("path")
    base = Path(path).resolve().parent if path else None
    return found, recorded_config(found, base)


def apply_overrides(cfg: ExperimentConfig, overrides: Mapping[str, Any], *, where: str) -> ExperimentConfig:
    """`cfg` with the command line's overrides (`cli.experiment.overrides_of`: locals, tasks, rounds,
    time_dilation, max_time_dilation), validated again."""
    if overrides.get("locals") or overrides.get("tasks") or overrides.get("rounds"):
        locals_ = tuple(int(x) for x in str(overrides["locals"]).split(",")) if overrides.get("locals") else cfg.locals
        cfg = replace(cfg, locals=locals_, tasks_per_point=overrides.get("tasks") or cfg.tasks_per_point,
                      task=replace(cfg.task, rounds=overrides.get("rounds") or cfg.task.rounds))
        cfg = parse_config(cfg.to_dict(), where=where)  # re-validate the trimmed copy
    if overrides.get("time_dilation") is not None or overrides.get("max_time_dilation") is not None:
        from orchestrator.experiment.host_dilation import with_dilation

        cfg = with_dilation(cfg, overrides.get("time_dilation"), overrides.get("max_time_dilation"), where=where)
    return cfg


def load_config_as(path: str | Path, overrides: Mapping[str, Any]) -> ExperimentConfig:
    """A config file with a run's recorded overrides, as `netai experiment` made it (`apply_overrides`)."""
    return apply_overrides(load_config(path), overrides, where=str(path))


def remove_unstarted(sweep_dir: Path) -> list[Path]:
    """Remove the sweep's run folders whose database holds no run (the sweep stopped between making
    the folder and recording the run in it: nothing of the run is there); the folders removed."""
    import shutil

    gone = []
    for sub in sorted(p for p in sweep_dir.iterdir() if (p / "results.db").is_file()):
        with ResultsDB(sub / "results.db") as db:
            empty = queries.last_run_id(db.conn) is None
        if empty:
            shutil.rmtree(sub)
            gone.append(sub)
    return gone


def entry_run_dir(sweep_dir: Path, name: str) -> Path | None:
    """The folder of the sweep's run named `name` (its database's run name), None if it never started."""
    for sub in sorted(p for p in sweep_dir.iterdir() if (p / "results.db").is_file()):
        with ResultsDB(sub / "results.db") as db:
            run_id = queries.last_run_id(db.conn)
            if run_id is not None and db.run(run_id)["name"] == name:
                return sub
    return None


def load_sweep_for_resume(sweep_dir: Path, config_path: str | None, build: Any) -> ExperimentConfig:
    """The sweep in `sweep_dir` (its ``sweep.json``) and its config, checked as a run's is
    (`check_source`): nothing has started when this raises."""
    source = read_sweep_record(sweep_dir).get("source") or {}
    check_source(source, build, config_path)
    path = config_path or source.get("path")
    if "config" not in source:
        if not path:
            raise ConfigError(f"{sweep_dir}: its sweep.json records no config to resume it with")
        return build(path, source.get("overrides", {}))
    base = Path(path).resolve().parent if path else None
    cfg = parse_config(source["config"], where=str(sweep_dir / SWEEP_FILE), base_dir=base)
    online = [run.name for run in cfg.sweep if run.mode == "online"]
    if online:
        raise ConfigError(f"{sweep_dir}: its online run(s) {', '.join(online)} cannot be resumed (their tasks "
                          "arrive on the run's clock and share the network): start the sweep again")
    return cfg


def sweep_complete(sweep_dir: Path, cfg: ExperimentConfig) -> bool:
    """Whether every entry of the sweep in `sweep_dir` has a complete run (`is_complete`)."""
    for run in cfg.sweep:
        earlier = entry_run_dir(sweep_dir, run.name)
        if earlier is None or not is_complete(find_run(earlier), run):
            return False
    return True


def recorded_dilation(cfg: ExperimentConfig, run_dir: Path) -> ExperimentConfig:
    """`cfg` at the K its run in `run_dir` recorded in its plan (no calibration, no host K again); with
    a K per point, at each point's recorded K (``time_dilation_per_point``), the points the run had not
    reached still to be calibrated (or given by the config's mapping)."""
    from orchestrator.experiment.host_dilation import with_dilation

    with ResultsDB(run_dir / "results.db") as db:
        run_id = int(queries.last_run_id(db.conn) or 0)
        topo, run = queries.topology(db.conn, run_id), db.run(run_id)
    if cfg.emulation.per_point:
        ks = dict(cfg.emulation.time_dilation_points)
        ks |= {int(n): float(k) for n, k in (run["environment"].get("time_dilation_per_point") or {}).items()}
        return replace(cfg, emulation=replace(cfg.emulation, time_dilation_points=tuple(sorted(ks.items()))))
    if cfg.emulation.time_dilation_auto and "time_dilation_calibration" not in run["environment"]:
        return cfg  # it stopped while calibrating: calibrate again
    k = (json.loads(topo["plan_json"]) if topo else {}).get("time_dilation")
    return cfg if k is None else with_dilation(cfg, str(float(k)), where=str(run_dir / "results.db"))
