"""The experiment config's ``emulation`` section: its declared schema, and the forms of time dilation.

``time_dilation`` is a number (one K for the whole run), ``auto`` (K from trials before the run,
`orchestrator.experiment.calibration`), ``host`` (this host's, `netai calibrate`), or a mapping of
numbers of locals to K (``{1: 2, 8: 16}``: a K per point). ``per_point: true`` beside ``auto`` asks
for a K per point chosen by trials of each point (`orchestrator.experiment.point_runs`). Every form
is checked here, and against the rest of the config (`check_per_point`), before anything starts.

This module parses and writes the section back; it runs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from controller.flows import CONNECTIVITY_MODES, STRICT
from orchestrator.emulation.cluster import ClusterSpec, parse_cluster
from orchestrator.emulation.kernel import DATAPATHS
from orchestrator.errors import ConfigError
from orchestrator.experiment.config_checks import Check, bool_check, choice_check, num_check, section_check
from topologies.plan import MAX_EMULATED_MBPS

BACKENDS = ("auto", "docker", "process")
#: ``emulation.time_dilation``: ``auto`` (K from trials before the run), ``host`` (this host's, `netai calibrate`).
AUTO, HOST = "auto", "host"
#: The most a K may be (a fixed K, or auto's cap); the cap auto's trials and `netai calibrate`'s take by default.
MAX_TIME_DILATION = 1000.0
AUTO_MAX_TIME_DILATION = 64.0
#: What a K per point is called in the errors, with an example of each form.
PER_POINT_FORMS = "time_dilation: auto with per_point: true, or a mapping of locals to K (time_dilation: {1: 2, 8: 16})"


@dataclass(frozen=True)
class EmulationConfig:
    max_link_mbps: float = 100.0
    backend: str = "auto"
    #: ``strict`` (the default for experiments: only the tasks' paths and the background routes carry
    #: traffic, so what is measured is exactly what the schedulers placed, and a task whose traffic
    #: strays from its paths fails instead of being carried best-effort) or ``best-effort`` (every
    #: host pair also routed, in the links' lowest class; see `controller.flows`).
    connectivity: str = STRICT
    #: What forwards the packets: ``auto`` (Open vSwitch's kernel module where the kernel has it, else
    #: tc filters in the kernel; the userspace datapath in cluster mode), ``kernel``, ``user`` or ``tc``
    #: (`orchestrator.emulation.kernel.choose_datapath`; docs/datapaths.md).
    datapath: str = "auto"
    #: Time dilation K (DieCast, TDF): link rates divided by K, delays, modelled training and the
    #: training allowance multiplied by K, and every recorded duration divided by K, so a small host
    #: emulates a large network faithfully at K times the wall time (docs/fidelity.md, "Fidelity").
    time_dilation: float = 1.0
    #: ``time_dilation: auto``: K is the smallest of 1, 2, 4, ... up to `max_time_dilation` at which a
    #: short calibration before the run shows no fidelity violation (`orchestrator.experiment.calibration`);
    #: `time_dilation` is then the K the calibration chose.
    time_dilation_auto: bool = False
    #: The largest K auto's trials try; when none up to it is faithful the run goes on at it (its verdict says).
    max_time_dilation: float = AUTO_MAX_TIME_DILATION
    #: ``time_dilation: host``: this host's K; `host_dilation.resolve` sets it and the calibration's id (`_from`).
    time_dilation_host: bool = False
    time_dilation_from: str = ""
    #: Cluster mode: the servers the sites are spread over (`orchestrator.emulation.cluster`); runs
    #: with the process backend.
    cluster: ClusterSpec | None = None
    #: A K per point (number of locals), each point in an emulation of its own
    #: (`orchestrator.experiment.point_runs`): with `time_dilation_auto`, each point's K from trials of
    #: that point; the Ks given (a mapping ``time_dilation: {1: 2, 8: 16}``, or those a resumed run
    #: recorded) are `time_dilation_points`, (locals, K) pairs.
    per_point: bool = False
    time_dilation_points: tuple[tuple[int, float], ...] = ()
    #: Each copy's sender paces its segments at its overlay edge's bottleneck rate (`workers.pacing`),
    #: so that a copy crosses its links no faster than they are configured, whatever htb's burst;
    #: false: htb alone shapes them (docs/fidelity.md, "Shaping").
    pace_copies: bool = True

    def point_k(self, n_locals: int) -> float | None:
        """The K given for the point of `n_locals` locals (None: none given; auto chooses it)."""
        return dict(self.time_dilation_points).get(n_locals)


def recorded_emulation(section: Mapping[str, Any]) -> dict[str, Any]:
    """A run's recorded ``emulation`` section with what a run recorded before a key existed did:
    one recorded before ``pace_copies`` did not pace its copies."""
    return {"pace_copies": False, **section}


def _dilation(key: str, v: Any) -> float:
    """A fixed K (a number in 1..`MAX_TIME_DILATION`); ``auto``, ``host`` and a mapping are taken out
    before (`parse_emulation`)."""
    if isinstance(v, str):
        raise ConfigError(f"{key} must be a number >= 1 and <= {MAX_TIME_DILATION:g}, {AUTO}, {HOST} or a mapping "
                          f"of locals to K, got {v!r}")
    return num_check(1, MAX_TIME_DILATION)(key, v)


def _points(key: str, raw: Mapping[Any, Any]) -> tuple[tuple[int, float], ...]:
    """A mapping of numbers of locals to K (keys may be strings of digits: the config as JSON stores them)."""
    if not raw:
        raise ConfigError(f"{key}: a K per point needs at least one point, e.g. {{1: 2, 8: 16}}")
    out: dict[int, float] = {}
    for n, k in raw.items():
        if isinstance(n, bool) or not (isinstance(n, int) or (isinstance(n, str) and n.isdigit())) or int(n) < 1:
            raise ConfigError(f"{key}: a K per point maps a number of locals (an integer >= 1) to K, got the key {n!r}")
        out[int(n)] = _dilation(f"{key}.{int(n)}", k)
    return tuple(sorted(out.items()))


EMULATION_SCHEMA: dict[str, Check] = {
    "max_link_mbps": num_check(0, MAX_EMULATED_MBPS, lo_open=True), "backend": choice_check(BACKENDS),
    "connectivity": choice_check(CONNECTIVITY_MODES), "datapath": choice_check(DATAPATHS), "time_dilation": _dilation,
    "max_time_dilation": num_check(2, MAX_TIME_DILATION), "per_point": bool_check, "pace_copies": bool_check,
}


def parse_emulation(raw: Any, base_dir: Path | None) -> EmulationConfig:
    """The emulation section; its ``cluster`` entry names files relative to the config's folder."""
    rest = dict(raw) if isinstance(raw, Mapping) else raw
    cluster = rest.pop("cluster", None) if isinstance(rest, dict) else None
    word = rest.get("time_dilation") if isinstance(rest, dict) else None
    points = _points("emulation.time_dilation", word) if isinstance(word, Mapping) else ()
    if word in (AUTO, HOST) or points:
        rest = {k: v for k, v in rest.items() if k != "time_dilation"}
    if word != AUTO and isinstance(rest, dict) and "max_time_dilation" in rest:
        raise ConfigError("emulation.max_time_dilation is the calibration's cap: it needs time_dilation: auto")
    cfg = replace(EmulationConfig(**section_check("emulation", rest, EMULATION_SCHEMA)), time_dilation_auto=word == AUTO,
                  time_dilation_host=word == HOST)
    if isinstance(rest, dict) and rest.get("per_point") and word != AUTO:
        raise ConfigError(f"emulation.per_point goes with time_dilation: auto (its trials choose each point's K); "
                          f"a K per point is {PER_POINT_FORMS}")
    if points:
        cfg = replace(cfg, per_point=True, time_dilation_points=points)
    spec = parse_cluster(cluster, base_dir=base_dir)
    if spec is not None and cfg.backend == "docker":
        raise ConfigError("emulation.cluster runs the process backend (plain Mininet hosts), not docker")
    return replace(cfg, cluster=spec, backend="process" if spec is not None else cfg.backend)


def check_per_point(emulation: EmulationConfig, locals_: Sequence[int], *, mode: str, engine: str) -> None:
    """Refuse a K per point the rest of the config cannot run: it needs the emulation and the
    sequential mode (each point runs in an emulation of its own), and a mapping needs a K for every
    number of locals of the run (others it may hold: ``--locals`` picks some of the config's).

    Raises
    ------
    ConfigError
        Naming the key and what it needs.
    """
    if not emulation.per_point:
        return
    if engine != "emulation":
        raise ConfigError("emulation.time_dilation: a K per point dilates the emulation: it needs engine: emulation")
    if mode != "sequential":
        raise ConfigError("emulation.time_dilation: a K per point runs each point in an emulation of its own: it "
                          "needs mode: sequential (online tasks of any locals run side by side)")
    missing = [n for n in locals_ if not emulation.time_dilation_auto and emulation.point_k(n) is None]
    if missing:
        raise ConfigError(f"emulation.time_dilation gives no K for {missing[0]} locals: a mapping of locals to K "
                          f"needs one for each of locals {', '.join(map(str, locals_))}")


def emulation_section(emulation: EmulationConfig) -> dict[str, Any]:
    """The section as a config file holds it (what `parse_emulation` reads back to the same config):
    the time dilation as written (a number, ``auto``, ``host`` or the mapping), the cap only with
    ``auto``, ``per_point`` only when set with ``auto``. A resumed run's recorded Ks are state, not
    config: with ``auto`` they are left out. The cluster is the caller's."""
    d = asdict(emulation)
    e = emulation
    if e.time_dilation_auto or e.time_dilation_host:
        d["time_dilation"] = AUTO if e.time_dilation_auto else HOST
    elif e.per_point:
        d["time_dilation"] = {str(n): k for n, k in e.time_dilation_points}  # str keys: as JSON gives them back
    if not e.time_dilation_auto:
        del d["max_time_dilation"]
    if not (e.per_point and e.time_dilation_auto):
        del d["per_point"]
    for key in ("time_dilation_auto", "time_dilation_host", "time_dilation_from", "time_dilation_points"):
        del d[key]
    return d
