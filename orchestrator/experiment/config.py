"""Experiment configs: a declared schema, validated before anything starts.

Each section declares its keys, types and ranges (Faucet's habit); an unknown key, a value of
the wrong type or out of range, an unknown scheduler or topology, or more locals than the
topology's compute sites raise `ConfigError` with one line naming the key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import yaml

from orchestrator.errors import ConfigError
from orchestrator.experiment.config_checks import (
    Check,
    bool_check,
    choice_check,
    int_check,
    num_check,
    section_check,
    str_check,
    text_check,
)
from orchestrator.experiment.emulation_config import AUTO as AUTO
from orchestrator.experiment.emulation_config import AUTO_MAX_TIME_DILATION as AUTO_MAX_TIME_DILATION
from orchestrator.experiment.emulation_config import HOST as HOST
from orchestrator.experiment.emulation_config import MAX_TIME_DILATION as MAX_TIME_DILATION
from orchestrator.experiment.emulation_config import (
    EmulationConfig,
    check_per_point,
    emulation_section,
    parse_emulation,
)
from orchestrator.experiment.faults import FaultEvent, RescheduleConfig, parse_events, parse_reschedule
from orchestrator.experiment.sweep_entries import parse_sweep
from orchestrator.runtime.compute_model import ComputeModel
from orchestrator.runtime.remote import RemoteServer, parse_servers
from orchestrator.runtime.timing import TRAIN_ALLOWANCE_S
from orchestrator.scheduling import Scheduler, SchedulerSpec, get_scheduler, resolve_schedulers
from orchestrator.scheduling.background_plan import BackgroundConfig
from orchestrator.scheduling.tasks import DEFAULT_DEMAND_MBPS, max_locals
from orchestrator.simulation.spec import SimParams
from topologies.errors import TopologyError
from topologies.loaders import DEFAULT_TOPOLOGY, load
from topologies.model import NetworkModel
from workers.spec import LearningSpec, SpecError

PATTERNS = ("constant", "poisson", "demand-matrix")
MODES = ("sequential", "online")
ARRIVALS = ("poisson", "all")
#: ``emulation``: Mininet, real workers; ``simulation``: the flow-level model on SimGrid
#: (`orchestrator.simulation`; docs/simulation.md, "Flow-level simulation").
ENGINES = ("emulation", "simulation")
ORDERS = ("rotate", "fixed")  # ``order``: the schedulers' order on each task (`ExperimentConfig.order`)


@dataclass(frozen=True, kw_only=True)
class TaskConfig(LearningSpec):
    """The ``task`` section: the learning spec (`workers.spec.LearningSpec`: every setting, its
    default and its check declared there) and what only an experiment's tasks have.

    The section's keys are `TASK_KEYS` (``partition`` is the spec's `partitioning`) and
    ``demand_mbps``, ``train_allowance_s``. The other settings are not keys: the run derives them
    (each task's seed from the config's ``seed`` and its id; chunk size and timeouts from its
    schedule, `orchestrator.runtime.timing.task_timing`).
    """

    demand_mbps: float = DEFAULT_DEMAND_MBPS
    #: What a round may spend training, on top of the transfer timeouts derived from the schedule.
    train_allowance_s: float = TRAIN_ALLOWANCE_S

    def section(self) -> dict[str, Any]:
        """The section as a config file holds it (its keys only; selection left out when off)."""
        learning = self.settings()
        out: dict[str, Any] = {key: learning[name] for key, name in TASK_KEYS.items()}
        if out["selection"] is None:
            del out["selection"]
        return out | {"demand_mbps": self.demand_mbps, "train_allowance_s": self.train_allowance_s}


#: The learning settings an experiment's ``task`` section sets: its key -> the spec's setting.
TASK_KEYS: dict[str, str] = {
    "model": "model", "model_args": "model_args", "rounds": "rounds", "partition": "partitioning", "alpha": "alpha",
    "lr": "lr", "local_epochs": "local_epochs", "batch_size": "batch_size", "strategy": "strategy", "mu": "mu",
    "compression": "compression", "k": "k", "dataset": "dataset", "dataset_args": "dataset_args",
    "selection": "selection", "compute_timing": "compute_timing",
}


@dataclass(frozen=True)
class SimulationConfig(SimParams):
    """The flow-level model's parameters (`engine: simulation`; each documented in
    `orchestrator.simulation.spec.SimParams`), and how they were set."""

    #: How the parameters were set by hand (free text, shown in the report's "Simulation model");
    #: when set, the config's parameters stand and this host's calibration (`netai calibrate`) is
    #: not applied.
    calibration: str = ""


@dataclass(frozen=True)
class OnlineConfig:
    """How tasks arrive in the online mode: `tasks` of them, by a Poisson process of mean
    inter-arrival `mean_interarrival_s` or all at once, each drawing its number of locals from the
    config's `locals`; the same trace (from `seed`) for every scheduler."""

    tasks: int = 30
    arrival: str = "poisson"
    mean_interarrival_s: float = 2.0
    seed: int = 1
    #: Seconds between samples of the running tasks, bandwidth, memory and the sites' CPU.
    sample_s: float = 1.0


@dataclass(frozen=True)
class ExperimentConfig:
    name: str
    topology: str = DEFAULT_TOPOLOGY
    compute_sites: tuple[str, ...] | None = None
    schedulers: tuple[str, ...] = ("spff", "mst", "steiner")
    locals: tuple[int, ...] = (2, 4, 8)
    tasks_per_point: int = 2
    seed: int = 1
    task: TaskConfig = field(default_factory=TaskConfig)
    emulation: EmulationConfig = field(default_factory=EmulationConfig)
    background: BackgroundConfig = field(default_factory=BackgroundConfig)
    #: ``sequential``: one task at a time, every scheduler on the same tasks (paired comparison);
    #: ``online``: tasks arrive (`online`) and run side by side, one scheduler after the other.
    mode: str = "sequential"
    #: Sequential mode: the schedulers' order on each task, ``rotate`` or ``fixed`` (`runs.scheduler_order`).
    order: str = "rotate"
    online: OnlineConfig = field(default_factory=OnlineConfig)
    #: Scheduled faults and load steps (online mode; `orchestrator.experiment.faults`).
    events: tuple[FaultEvent, ...] = ()
    #: What happens to running tasks when the network changes (`orchestrator.experiment.faults`).
    reschedule: RescheduleConfig = field(default_factory=RescheduleConfig)
    #: ``emulation`` (Mininet and real workers) or ``simulation`` (the flow-level model on SimGrid).
    engine: str = "emulation"
    simulation: SimulationConfig = field(default_factory=SimulationConfig)
    #: How the locals' modelled training cost is set (the ``compute`` section's own keys:
    #: `orchestrator.runtime.compute_model.ComputeModel`, each setting declared there).
    compute: ComputeModel = field(default_factory=ComputeModel)
    #: Sites whose servers run on Docker daemons reached over SSH (``compute.servers``,
    #: `orchestrator.runtime.remote`).
    remote_servers: tuple[RemoteServer, ...] = ()
    #: The resolved `schedulers` entries (`orchestrator.scheduling.plugins`) by which the labels of
    #: `schedulers` are built; a label without one is a registered name (a config built in code).
    scheduler_specs: tuple[SchedulerSpec, ...] = ()
    #: A sweep (``sweep``: a list of settings each run overrides, e.g. the model's size): the runs, one
    #: per entry, each a full config validated before anything starts; and the entries as written.
    sweep: tuple[ExperimentConfig, ...] = ()
    sweep_overrides: tuple[Mapping[str, Any], ...] = ()

    def scheduler(self, label: str) -> Scheduler:
        """A new instance of the scheduler labelled `label` (its schedules carry the label)."""
        for spec in self.scheduler_specs:
            if spec.label == label:
                return spec.build()
        return get_scheduler(label)

    def network(self) -> NetworkModel:
        return load(self.topology, compute_sites=list(self.compute_sites) if self.compute_sites else None)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["task"] = self.task.section()
        specs = {s.label: s for s in self.scheduler_specs}  # a label without one: a registered name
        d["schedulers"] = [specs[x].to_entry() if x in specs else x for x in self.schedulers]
        del d["scheduler_specs"], d["sweep"]
        overrides = d.pop("sweep_overrides")
        if overrides:
            d["sweep"] = [dict(o) for o in overrides]
        d["locals"] = list(self.locals)
        d["compute_sites"] = list(self.compute_sites) if self.compute_sites else None
        if self.mode != "online":
            del d["online"]  # these sections are only allowed with mode: online
            del d["events"], d["reschedule"]
        else:
            d["events"] = [e.to_dict() for e in self.events]
            d["reschedule"] = self.reschedule.to_dict()
            del d["order"]  # the sequential mode's only
        if self.engine != "simulation":
            del d["simulation"]  # only allowed with engine: simulation
        del d["remote_servers"]
        d["emulation"] = emulation_section(self.emulation)
        if self.emulation.cluster is None:
            del d["emulation"]["cluster"]
        else:
            d["emulation"]["cluster"] = self.emulation.cluster.to_dict()
        d["compute"] = self.compute.section()
        if self.remote_servers:
            d["compute"]["servers"] = [s.to_dict() for s in self.remote_servers]
        return d

    @property
    def faults(self) -> bool:
        """Whether tasks may move or lose a site mid-run (then G checkpoints after every round): with
        events, periodic moves, or (online) servers on other machines, one of which may be lost."""
        far = self.emulation.cluster is not None and any(s.far for s in self.emulation.cluster.servers)
        return bool(self.events) or "periodic" in self.reschedule.policies or (far and self.mode == "online")


def _selection(key: str, v: Any) -> None:
    """Build the selection policy once, so that a bad one fails before anything starts."""
    from workers.selection import SelectionError, make_policy

    try:
        make_policy(v)
    except SelectionError as e:
        raise ConfigError(f"{key}: {e}") from None


def _as_given(key: str, v: Any) -> Any:
    return v  # a learning setting: `LearningSpec.check` checks it, with the others


#: The task section's own keys (the learning settings' are `TASK_KEYS`).
TASK_SCHEMA: dict[str, Check] = {"demand_mbps": num_check(0, lo_open=True), "train_allowance_s": num_check(0, lo_open=True)}


def _task(raw: Any) -> TaskConfig:
    """The task section: its own keys checked here, the learning settings by the spec's one check
    (`LearningSpec.check`), an error naming the key as written (``task.partition``); then the
    selection policy is built."""
    section = section_check("task", raw, {**dict.fromkeys(TASK_KEYS, _as_given), **TASK_SCHEMA})
    task = TaskConfig(**{TASK_KEYS.get(k, k): v for k, v in section.items()})
    try:
        task.check()
    except SpecError as e:
        key = next((k for k, name in TASK_KEYS.items() if name == e.setting), e.setting)
        raise ConfigError(e.named(f"task.{key}")) from None
    _selection("task.selection", task.selection)
    return task


BACKGROUND_SCHEMA: dict[str, Check] = {
    "enabled": bool_check, "pattern": choice_check(PATTERNS), "load": num_check(0, 1), "pairs": int_check(1, 1000),
    "mean_on_s": num_check(0, lo_open=True), "mean_off_s": num_check(0, lo_open=True),
}
ONLINE_SCHEMA: dict[str, Check] = {
    "tasks": int_check(1, 10_000), "arrival": choice_check(ARRIVALS), "mean_interarrival_s": num_check(0, lo_open=True),
    "seed": int_check(0), "sample_s": num_check(0.1, 60),
}
SIMULATION_SCHEMA: dict[str, Check] = {
    "rates": choice_check(("capacity", "emulated")), "tcp_efficiency": num_check(0, 1, lo_open=True),
    "per_hop_latency_ms": num_check(0), "propagation": bool_check, "alpha_s": num_check(0),
    "seconds_per_example": num_check(0), "seconds_per_round": num_check(0), "local_epochs": int_check(1, 1000),
    "train_examples": int_check(1),
    "chunk_bytes": int_check(0), "max_segments": int_check(0),
    "cpu_cores": int_check(0, 1024), "cpu_s_per_byte": num_check(0), "cpu_s_per_chunk": num_check(0),
    "cpu_s_per_byte_hop": num_check(0), "calibration": text_check, "site_speed": bool_check, "wire_bytes_factor": num_check(1),
    "train_cpu_factor": num_check(1), "ack_share": num_check(0, 1), "shaper_burst_k": num_check(0),
    "segment_mss": int_check(0, 65_535),
}
TOP_KEYS = ("name", "topology", "compute_sites", "schedulers", "locals", "tasks_per_point", "seed",
            "task", "emulation", "background", "mode", "online", "events", "reschedule", "engine", "simulation",
            "compute", "sweep", "order")
#: What an entry of ``sweep`` may override (a sweep's runs are named after it: ``name-1``, ...).
SWEEP_KEYS = tuple(k for k in TOP_KEYS if k not in ("name", "sweep"))


def parse_config(raw: Any, *, where: str = "config", base_dir: str | Path | None = None) -> ExperimentConfig:
    """Validate a parsed config mapping and build an `ExperimentConfig`; scheduler files are found
    relative to `base_dir` (the config file's folder; default the working directory).

    Raises
    ------
    ConfigError
        One line naming the first bad key, prefixed by `where`.
    """
    try:
        return _parse(raw, where, base_dir)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    except TopologyError as e:
        raise ConfigError(f"{where}: topology: {e}") from None


def _parse(raw: Any, where: str, base_dir: str | Path | None = None) -> ExperimentConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError("expected a mapping of settings")
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise ConfigError(f"unknown key {unknown[0]!r}; allowed: {', '.join(TOP_KEYS)}")
    name = str_check("name", raw.get("name", Path(where).stem))
    topology = str_check("topology", raw.get("topology", DEFAULT_TOPOLOGY))
    schedulers = raw.get("schedulers", ["spff", "mst", "steiner"])
    if not isinstance(schedulers, list) or not schedulers:
        raise ConfigError("schedulers must be a non-empty list")
    specs = resolve_schedulers(schedulers, base_dir)  # classes loaded, options checked, labels unique
    files_dir = None if base_dir is None else Path(base_dir)  # what key and known_hosts paths are relative to
    locals_ = raw.get("locals", [2, 4, 8])
    if not isinstance(locals_, list) or not locals_:
        raise ConfigError("locals must be a non-empty list of integers")
    locals_t = tuple(int_check(1)("locals[]", n) for n in locals_)
    compute = raw.get("compute_sites")
    if compute is not None and (not isinstance(compute, list) or not all(isinstance(s, str) for s in compute)):
        raise ConfigError("compute_sites must be a list of site names")
    cfg = ExperimentConfig(
        name=name,
        topology=topology,
        compute_sites=tuple(compute) if compute else None,
        schedulers=tuple(s.label for s in specs),
        scheduler_specs=specs,
        locals=locals_t,
        tasks_per_point=int_check(1, 10_000)("tasks_per_point", raw.get("tasks_per_point", 2)),
        seed=int_check(0)("seed", raw.get("seed", 1)),
        task=_task(raw.get("task")),
        emulation=parse_emulation(raw.get("emulation"), files_dir),
        background=BackgroundConfig(**section_check("background", raw.get("background"), BACKGROUND_SCHEMA)),
        mode=choice_check(MODES)("mode", raw.get("mode", "sequential")),
        online=OnlineConfig(**section_check("online", raw.get("online"), ONLINE_SCHEMA)),
        order=choice_check(ORDERS)("order", raw.get("order", "rotate")),
    )
    if "online" in raw and cfg.mode != "online":
        raise ConfigError("an online section needs mode: online")
    if "order" in raw and cfg.mode != "sequential":
        raise ConfigError("order needs mode: sequential (online runs each scheduler's whole trace in turn)")
    cfg = _with_engine(cfg, raw)
    cfg = _with_compute(cfg, raw, files_dir)
    return _with_sweep(_on_topology(cfg, raw), raw, where, base_dir)


def _with_sweep(cfg: ExperimentConfig, raw: Mapping[str, Any], where: str,
                base_dir: str | Path | None) -> ExperimentConfig:
    """`cfg` with its sweep's runs (`orchestrator.experiment.sweep_entries`), each validated whole."""
    runs, entries = parse_sweep(raw, name=cfg.name, keys=SWEEP_KEYS, parse=lambda r: _parse(r, where, base_dir))
    return replace(cfg, sweep=runs, sweep_overrides=entries) if runs else cfg


def _with_engine(cfg: ExperimentConfig, raw: Mapping[str, Any]) -> ExperimentConfig:
    """`cfg` with its engine and simulation section, checked against the mode and the emulation."""
    engine = choice_check(ENGINES)("engine", raw.get("engine", "emulation"))
    if "simulation" in raw and engine != "simulation":
        raise ConfigError("a simulation section needs engine: simulation")
    if engine == "simulation" and cfg.mode != "sequential":
        raise ConfigError("engine: simulation runs mode: sequential only")
    if engine == "simulation" and cfg.emulation.cluster is not None:
        raise ConfigError("emulation.cluster needs engine: emulation")
    if engine == "simulation" and (cfg.emulation.time_dilation_auto or cfg.emulation.time_dilation_host):
        word = "auto calibrates" if cfg.emulation.time_dilation_auto else "host dilates"
        raise ConfigError(f"emulation.time_dilation: {word} the emulation: it needs engine: emulation")
    check_per_point(cfg.emulation, cfg.locals, mode=cfg.mode, engine=engine)
    return replace(cfg, engine=engine,
                   simulation=SimulationConfig(**section_check("simulation", raw.get("simulation"), SIMULATION_SCHEMA)))


#: The compute section: the modelled training's settings (checked by `ComputeModel.check`) and
#: ``servers`` (`orchestrator.runtime.remote.parse_servers`).
COMPUTE_SCHEMA: dict[str, Check] = {**{f.name: _as_given for f in fields(ComputeModel)}, "servers": _as_given}


def _compute_model(section: Mapping[str, Any]) -> ComputeModel:
    """The compute section's modelled training (`ComputeModel.of`: checked, a setting of another
    cost source refused), an error naming the key as written (``compute.core_gflops``)."""
    try:
        return ComputeModel.of({k: v for k, v in section.items() if k != "servers"})
    except SpecError as e:
        raise ConfigError(e.named(f"compute.{e.setting}")) from None


def _with_compute(cfg: ExperimentConfig, raw: Mapping[str, Any], files_dir: Path | None) -> ExperimentConfig:
    """`cfg` with its compute section: the modelled training, and the remote site servers
    (``compute.servers``), which only an emulation runs."""
    section = section_check("compute", raw.get("compute"), COMPUTE_SCHEMA)
    cfg = replace(cfg, compute=_compute_model(section))
    if "servers" not in section:
        return cfg
    if cfg.engine == "simulation":
        raise ConfigError("compute.servers needs engine: emulation (a simulation runs no servers)")
    if cfg.emulation.cluster is not None:
        raise ConfigError("compute.servers (Docker over SSH) and emulation.cluster do not combine yet")
    return replace(cfg, remote_servers=parse_servers(section["servers"], base_dir=files_dir))


def _on_topology(cfg: ExperimentConfig, raw: Mapping[str, Any]) -> ExperimentConfig:
    """`cfg` with its events and rescheduling, and what needs the topology's model to be checked:
    the events' sites and links, and the numbers of locals the compute sites allow."""
    model = cfg.network()
    events = parse_events(raw.get("events"), model, tasks=cfg.online.tasks, rounds=cfg.task.rounds)
    reschedule = parse_reschedule(raw.get("reschedule"))
    if (events or "reschedule" in raw) and cfg.mode != "online":
        raise ConfigError("events and reschedule need mode: online (tasks that run side by side)")
    cfg = replace(cfg, events=events, reschedule=reschedule)
    limit = max_locals(model)
    too_many = [n for n in cfg.locals if n > limit]
    if too_many:
        raise ConfigError(f"locals {too_many[0]} is more than topology {model.name!r} allows "
                          f"({len(model.compute_sites)} compute sites: at most {limit} locals besides G)")
    return cfg


def read_config_file(path: str | Path) -> Any:
    """The parsed YAML of a config file; a `ConfigError` naming the file if it is missing or malformed."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{p}: no such config file")
    try:
        return yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else "YAML error"
        raise ConfigError(f"{p}: malformed YAML: {first}") from None


def load_config(path: str | Path) -> ExperimentConfig:
    """Read and validate an experiment config file (YAML)."""
    p = Path(path)
    return parse_config(read_config_file(p), where=str(p), base_dir=p.resolve().parent)
