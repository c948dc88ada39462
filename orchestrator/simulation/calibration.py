"""The simulation's calibrations: parameters fitted on one host, stored with the host's identity and
the project's version (docs/simulation.md, "Flow-level simulation", calibration).

A calibration (`Calibration`) holds this host's time dilation K (the smallest K of the auto-dilation
trials at which the emulation measured the emulated network, not the host; `time_dilation`, with the
trials in `dilation`), the `SimParams` fields that `netai calibrate` measured or fitted on the
emulated reference run at that K (`orchestrator.experiment.calibrate`), what it measured of the
host itself (`host_cpu`), whether the emulation it stands for had link delay, and how far the
uncalibrated model was from the emulation on the calibration's own points. Format 1 entries (made
before K was measured: their reference ran undilated and their parameters model the host's
contention) still load, with no K.
The store is one JSON file (`default_path`, or `$NETAI_CALIBRATION`, or a path the caller gives)
holding a list of calibrations; a simulated run uses the newest one whose host identity
(`HostIdentity`: hostname, machine id, CPU model, cores, kernel) and project version both match
this host's (`find`), fitted under the simulation's current model (`spec.MODEL_REVISION`). A
calibration of another host, version or model is never used: `find` says why none matched
(`CalibrationMismatch`).

This module only reads and writes that file; it runs nothing.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import __version__
from orchestrator.simulation.spec import MODEL_REVISION

#: Environment variable naming the calibration store (else `default_path`).
ENV_PATH = "NETAI_CALIBRATION"
#: The store's format version (2: the host's time dilation; 1 still loads, with none).
FORMAT = 2
#: The formats `load_all` reads.
READABLE_FORMATS = (1, 2)
#: The SimParams fields a calibration may set.
PARAMS = ("tcp_efficiency", "cpu_cores", "cpu_s_per_byte", "cpu_s_per_chunk", "cpu_s_per_byte_hop",
          "per_hop_latency_ms", "alpha_s", "wire_bytes_factor", "train_cpu_factor", "ack_share")


class CalibrationMismatch(LookupError):
    """No stored calibration fits this host and version (the message says what differed)."""


@dataclass(frozen=True)
class HostIdentity:
    """What makes a host's calibration its own: where the emulation ran and on what."""

    hostname: str
    machine_id: str
    cpu_model: str
    cores: int
    kernel: str

    @classmethod
    def here(cls) -> HostIdentity:
        """This host's identity (a field that cannot be read is "unknown")."""
        return cls(hostname=socket.gethostname(), machine_id=_read_first(Path("/etc/machine-id")),
                   cpu_model=_cpu_model(), cores=len(os.sched_getaffinity(0)), kernel=platform.release())

    def differences(self, other: HostIdentity) -> list[str]:
        """The fields that differ, as ``name: ours != theirs``."""
        mine, theirs = asdict(self), asdict(other)
        return [f"{k}: {mine[k]!r} != {theirs[k]!r}" for k in mine if mine[k] != theirs[k]]


def _read_first(path: Path) -> str:
    try:
        return path.read_text().strip().splitlines()[0]
    except (OSError, IndexError):
        return "unknown"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@dataclass(frozen=True)
class Calibration:
    """One calibration: its parameters and where, when and how they were obtained."""

    id: str
    created: str
    host: HostIdentity
    version: str
    #: SimParams fields (a subset of `PARAMS`) a simulated run takes where its config leaves the
    #: default. Format 2: fitted or measured on the emulated reference at `time_dilation`, so they
    #: describe the emulated network at K (`per_hop_latency_ms` what a chunk still waits per link
    #: there, `wire_bytes_factor` its frames per payload byte, `tcp_efficiency` derived); no CPU
    #: model (at a faithful K the host's CPU does not show). Format 1: fitted on an undilated run,
    #: the host's contention included (the CPU model's fields).
    params: dict[str, float]
    #: Whether the calibration's emulation had link delay (netem): simulated runs put propagation
    #: on only if it did.
    delay_emulated: bool
    #: Per point of the calibration run: emulated mean round time (at `time_dilation`, emulated
    #: seconds), simulated before (defaults) and after (`params`).
    points: list[dict[str, Any]] = field(default_factory=list)
    #: The uncalibrated model's worst |sim/emu - 1| over the calibration's points.
    uncalibrated_off_by: float = 0.0
    note: str = ""
    #: This host's time dilation K: what ``emulation.time_dilation: host`` and `netai validate`
    #: use; None in a format 1 entry (not measured).
    time_dilation: float | None = None
    #: The auto-dilation search that chose K (`orchestrator.experiment.calibration.Calibration.to_dict`:
    #: k, faithful, cap, wall_s, each trial's K, verdict, reasons, wall and emulated seconds);
    #: None in a format 1 entry.
    dilation: dict[str, Any] | None = None
    #: What was measured of the host itself, not applied to the model: ``cpu_s_per_byte`` (the
    #: workers' code per byte on one core, wall seconds), ``train_real_over_modelled`` (lone trainings'
    #: real over modelled time on the reference at K, 1 when they held).
    host_cpu: dict[str, float] = field(default_factory=dict)
    #: Whether `params`' ``wire_bytes_factor`` was measured with the simulation adding each copy's
    #: frame headers itself (`spec.build_spec`'s ``frame_bytes``): it then counts the Ethernet, IP
    #: and TCP headers and the ACKs only. An entry without it (made before) counted the chunks'
    #: headers in its factor too, at its own chunk size: `usable_params` leaves that factor out.
    frames: bool = False
    #: The simulation's model revision its parameters were fitted under (`spec.MODEL_REVISION`; an
    #: entry without one is of revision 1).
    model: int = MODEL_REVISION

    def usable_params(self) -> dict[str, float]:
        """`params` less a ``wire_bytes_factor`` that would count the frame headers twice (`frames`)."""
        return {k: v for k, v in self.params.items() if self.frames or k != "wire_bytes_factor"}

    @property
    def dilation_faithful(self) -> bool | None:
        """Whether a trial at `time_dilation` was faithful (None: no K measured)."""
        return None if self.dilation is None else bool(self.dilation.get("faithful"))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Calibration:
        params = {k: float(v) for k, v in dict(d["params"]).items() if k in PARAMS}
        return cls(id=str(d["id"]), created=str(d["created"]), host=HostIdentity(**d["host"]),
                   version=str(d["version"]), params=params, delay_emulated=bool(d["delay_emulated"]),
                   points=list(d.get("points", [])), uncalibrated_off_by=float(d.get("uncalibrated_off_by", 0.0)),
                   note=str(d.get("note", "")),
                   time_dilation=None if d.get("time_dilation") is None else float(d["time_dilation"]),
                   dilation=dict(d["dilation"]) if d.get("dilation") is not None else None,
                   host_cpu={k: float(v) for k, v in dict(d.get("host_cpu") or {}).items()},
                   frames=bool(d.get("frames", False)), model=int(d.get("model", 1)))

    def summary(self) -> str:
        """One line for a report: which calibration, when, where, and the host's K."""
        k = ("no time dilation measured" if self.time_dilation is None else
             f"host time dilation K={self.time_dilation:g} ({'faithful' if self.dilation_faithful else 'NOT faithful: the cap'})")
        return (f"calibration {self.id} of {self.created} on host {self.host.hostname} "
                f"({self.host.cores} cores, {self.host.cpu_model}), version {self.version}, {k}")


def default_path() -> Path:
    """Where calibrations are kept: `$NETAI_CALIBRATION`, else ``$XDG_STATE_HOME/netai`` (default
    ``~/.local/state/netai``) ``/calibration.json``."""
    env = os.environ.get(ENV_PATH)
    if env:
        return Path(env)
    state = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state) / "netai" / "calibration.json"


def load_all(path: Path) -> list[Calibration]:
    """Every calibration in `path` (none if it does not exist).

    Raises
    ------
    ValueError
        If the file is not a calibration store (with its path).
    """
    return read_store(path, "calibrations", READABLE_FORMATS, Calibration.from_dict, "a calibration store")


def save(cal: Calibration, path: Path) -> None:
    """Add `cal` to the store at `path` (created with its folder), written atomically."""
    cals = [c for c in load_all(path) if c.id != cal.id] + [cal]
    write_store(path, "calibrations", FORMAT, [c.to_dict() for c in cals])


def read_store(path: Path, key: str, formats: tuple[int, ...], parse: Any, what: str) -> list[Any]:
    """The records under `key` of a JSON store of one of `formats` at `path`, each made by `parse`
    (none if the file does not exist); the calibrations' store and the validations'.

    Raises
    ------
    ValueError
        If the file is not such a store (`what`, with its path).
    """
    if not path.exists():
        return []
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") not in formats:
            expected = formats[0] if len(formats) == 1 else f"one of {formats}"
            raise ValueError(f"format {doc.get('format')!r}, expected {expected}")
        return [parse(d) for d in doc[key]]
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as e:
        raise ValueError(f"{path} is not {what}: {e}") from e


def write_store(path: Path, key: str, fmt: int, records: list[dict[str, Any]]) -> None:
    """Write a JSON store of `records` under `key` at `path` (created with its folder), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps({"format": fmt, key: records}, indent=1))
    tmp.replace(path)


def find(path: Path, host: HostIdentity | None = None, version: str = __version__,
         model: int = MODEL_REVISION) -> Calibration:
    """The newest calibration in `path` made on `host` (default: this one) with `version`, fitted
    under the simulation's `model` revision.

    Raises
    ------
    CalibrationMismatch
        If there is none, saying whether the store is empty or what differed (host fields, version,
        model revision).
    """
    host = host or HostIdentity.here()
    cals = load_all(path)
    if not cals:
        raise CalibrationMismatch(f"no calibration in {path}: run `netai calibrate` on this host")
    same_host = [c for c in cals if not c.host.differences(host)]
    same_version = [c for c in same_host if c.version == version]
    good = [c for c in same_version if c.model == model]
    if good:
        return max(good, key=lambda c: c.created)
    if same_version:
        models = ", ".join(str(m) for m in sorted({c.model for c in same_version}))
        raise CalibrationMismatch(
            f"the calibrations of this host in {path} were fitted under the simulation's model revision(s) "
            f"{models}, not {model}: run `netai calibrate` again (with `--emulated-run` on the emulated run "
            f"its note names, it refits in seconds)")
    if same_host:
        versions = sorted({c.version for c in same_host})
        raise CalibrationMismatch(f"the calibrations of this host in {path} are for version(s) "
                                  f"{', '.join(versions)}, not {version}: run `netai calibrate` again")
    diff = host.differences(cals[-1].host)
    raise CalibrationMismatch(f"no calibration of this host in {path} (the newest differs in "
                              f"{'; '.join(diff)}): run `netai calibrate` on this host")


def new_id(host: HostIdentity) -> tuple[str, str]:
    """A new calibration's id and creation time (UTC, ISO 8601)."""
    now = time.gmtime()
    return f"{host.hostname}-{time.strftime('%Y%m%dT%H%M%SZ', now)}", time.strftime("%Y-%m-%dT%H:%M:%SZ", now)


#: How far the uncalibrated model was measured to be, when no calibration in the store says it:
#: sim/emu mean round latency per point of experiments/quick.yaml with the default parameters
#: (`netai validate`, no calibration) ranged 0.455 to 0.831 (measured 2026-11-25 on a 2-core
#: host; docs/measurements/simulation.md, "The uncalibrated model").
UNCALIBRATED_OFF_BY = 0.55
UNCALIBRATED_WHERE = "experiments/quick.yaml, measured 2026-11-25 (docs/measurements/simulation.md, \"The uncalibrated model\")"


def uncalibrated_note(path: Path, reason: str) -> dict[str, Any]:
    """What an uncalibrated run records: why, and how far off the defaults were measured to be
    (on a calibration's own points if the store has one, else `UNCALIBRATED_OFF_BY`)."""
    try:
        cals = load_all(path)
    except ValueError:
        cals = []
    if cals:
        worst = max(cals, key=lambda c: c.uncalibrated_off_by)
        at = "" if worst.time_dilation is None else f", emulated at K={worst.time_dilation:g}"
        where = f"the points of {worst.id} ({worst.host.hostname}{at})"
        return {"calibrated": False, "uncalibrated_reason": reason, "uncalibrated_off_by": worst.uncalibrated_off_by,
                "uncalibrated_where": where}
    return {"calibrated": False, "uncalibrated_reason": reason, "uncalibrated_off_by": UNCALIBRATED_OFF_BY,
            "uncalibrated_where": UNCALIBRATED_WHERE}
