"""The store of validations: what each `netai validate` compared, and which simulated runs it
stands for (docs/simulation.md, "What a validation covers").

A record (`ValidationRecord`) holds the config validated (its name and a hash of it), when, on which
host and under which revision of the simulation's model, the regime of the tasks both engines
completed (`Regime`: topology, model size, locals, schedulers), the worst and the geometric-mean
error of simulated over emulated mean round latency, and whether the emulated reference was
faithful. A simulated run takes the newest record that covers its own regime (`covering`) and
states it; without one it says so, and why the nearest record does not cover it (`gaps`).

The store is one JSON file per user (`default_path`). This module only reads and writes it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.simulation.calibration import read_store, write_store
from orchestrator.simulation.spec import MODEL_REVISION

#: Environment variable naming the store (else ``validations.json`` in the project's cache folder,
#: `orchestrator.runtime.profiles.cache_dir`, which ``NETAI_CACHE_DIR`` sets).
ENV_PATH = "NETAI_VALIDATIONS"
FORMAT = 1
#: How far outside the validated model sizes a run's model may be and still be covered: a factor, so
#: that a model of the same kind (a few layers wider or narrower) counts, while one of another order
#: of magnitude, whose copies are a few chunks instead of hundreds (or the reverse), does not.
MODEL_BYTES_FACTOR = 2.0


def default_path() -> Path:
    """`$NETAI_VALIDATIONS`, else ``validations.json`` in the project's per-user cache folder."""
    from orchestrator.runtime.profiles import cache_dir

    env = os.environ.get(ENV_PATH)
    return Path(env) if env else cache_dir() / "validations.json"


@dataclass(frozen=True)
class Regime:
    """What a run's figures depend on that a validation may not have seen."""

    topology: str
    #: The least and the most model bytes of the run's tasks.
    model_bytes: tuple[int, int]
    #: The least and the most locals of the run's points.
    n_locals: tuple[int, int]
    schedulers: tuple[str, ...]

    @classmethod
    def of(cls, topology: str, model_bytes: Sequence[int], n_locals: Sequence[int],
           schedulers: Sequence[str]) -> Regime:
        """The regime of runs with these model sizes, numbers of locals and schedulers."""
        return cls(topology, (min(model_bytes), max(model_bytes)), (min(n_locals), max(n_locals)),
                   tuple(sorted(set(schedulers))))

    def text(self) -> str:
        return (f"topology {self.topology}, model {_span(self.model_bytes, _size)}, "
                f"{_span(self.n_locals, str)} locals, schedulers {', '.join(self.schedulers)}")


def _size(n: int) -> str:
    return f"{n / 1e6:.3g} MB" if n >= 1e6 else f"{n / 1e3:.3g} KB"


def _span(lo_hi: tuple[int, int], show: Any) -> str:
    lo, hi = lo_hi
    return show(lo) if lo == hi else f"{show(lo)} to {show(hi)}"


@dataclass(frozen=True)
class ValidationRecord:
    """One `netai validate`: what it compared and how far apart the engines were."""

    id: str
    created: str
    host: str
    version: str
    #: The simulation's model revision (`spec.MODEL_REVISION`) the validation ran under.
    model: int
    config: str
    config_hash: str
    regime: Regime
    #: Worst and geometric-mean |sim/emu - 1| of mean round latency over the compared points
    #: (`agreement.latency_errors`).
    worst_error: float
    geomean_error: float
    reference_faithful: bool
    calibration: str | None
    folder: str
    #: Whether the validated twin modelled htb's burst (``simulation.shaper_burst_k`` > 0): yes where
    #: its emulated reference's copies were not paced (`workers.pacing`; every run before pacing).
    shaper: bool = True
    #: Whether the validated twin sent each chunk frame as TCP segments of its own
    #: (``simulation.segment_mss`` > 0: a twin of paced copies, since the model's revision 5).
    segments: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ValidationRecord:
        r = d["regime"]
        regime = Regime(str(r["topology"]), (int(r["model_bytes"][0]), int(r["model_bytes"][1])),
                        (int(r["n_locals"][0]), int(r["n_locals"][1])), tuple(str(s) for s in r["schedulers"]))
        return cls(id=str(d["id"]), created=str(d["created"]), host=str(d["host"]), version=str(d["version"]),
                   model=int(d["model"]), config=str(d["config"]), config_hash=str(d["config_hash"]), regime=regime,
                   worst_error=float(d["worst_error"]), geomean_error=float(d["geomean_error"]),
                   reference_faithful=bool(d["reference_faithful"]), calibration=d.get("calibration"),
                   folder=str(d.get("folder", "")), shaper=bool(d.get("shaper", True)),
                   segments=bool(d.get("segments", False)))

    def summary(self) -> dict[str, Any]:
        """What a simulated run records of the validation it rests on."""
        return {"id": self.id, "config": self.config, "config_hash": self.config_hash, "created": self.created,
                "host": self.host, "worst_error": self.worst_error, "geomean_error": self.geomean_error,
                "regime": self.regime.text(), "calibration": self.calibration or "none (uncalibrated)"}


def load_all(path: Path) -> list[ValidationRecord]:
    """Every record in `path` (none if it does not exist).

    Raises
    ------
    ValueError
        If the file is not a validation store (with its path).
    """
    return read_store(path, "validations", (FORMAT,), ValidationRecord.from_dict, "a validation store")


def save(record: ValidationRecord, path: Path) -> None:
    """Add `record` to the store at `path` (created with its folder), written atomically."""
    records = [r for r in load_all(path) if r.id != record.id] + [record]
    write_store(path, "validations", FORMAT, [r.to_dict() for r in records])


def gaps(record: ValidationRecord, regime: Regime, *, model: int = MODEL_REVISION, shaper: bool = True,
         segments: bool = False) -> list[str]:
    """Why `record` does not cover `regime` (empty: it covers it). It covers a run when its
    emulated reference was faithful, it ran under the same model revision, on the same topology,
    with every scheduler of the run, the run's locals within its range, and the run's model sizes
    within its range widened by `MODEL_BYTES_FACTOR` either way; and when the run models the
    emulation's shaper as the validated twin did (`shaper`: its ``simulation.shaper_burst_k`` > 0):
    with it or without, a deep tree's small copies are up to a fifth faster or slower (docs/simulation.md,
    "The shaper's burst"); and its frames cross as TCP segments of their own as the twin's did or
    not (`segments`: its ``simulation.segment_mss`` > 0)."""
    out = [] if record.reference_faithful else ["its emulated reference was NOT faithful"]
    if record.model != model:
        out.append(f"it ran under the simulation's model revision {record.model}, not {model}")
    if shaper != record.shaper:
        out.append("it validated a twin that models the emulation's shaper, which this run does not "
                   "(set simulation.shaper_burst_k to the K of the emulation it stands for)" if record.shaper else
                   "it validated a twin of an emulation whose copies were paced, without the shaper's burst, which "
                   "this run models (leave simulation.shaper_burst_k out)")
    if segments != record.segments:
        out.append("it validated a twin whose chunk frames cross as TCP segments of their own, which this run's "
                   "do not (set simulation.segment_mss: 1448)" if record.segments else
                   "it validated a twin whose chunk frames cross at the flat payload share, which this run's do "
                   "not (leave simulation.segment_mss out)")
    v = record.regime
    if v.topology != regime.topology:
        out.append(f"it validated topology {v.topology}")
    lo, hi = v.model_bytes[0] / MODEL_BYTES_FACTOR, v.model_bytes[1] * MODEL_BYTES_FACTOR
    if not lo <= regime.model_bytes[0] <= regime.model_bytes[1] <= hi:
        out.append(f"it validated model {_span(v.model_bytes, _size)} (covering {_size(int(lo))} to {_size(int(hi))})")
    if not v.n_locals[0] <= regime.n_locals[0] <= regime.n_locals[1] <= v.n_locals[1]:
        out.append(f"it validated {_span(v.n_locals, str)} locals")
    missing = sorted(set(regime.schedulers) - set(v.schedulers))
    if missing:
        out.append(f"it validated schedulers {', '.join(v.schedulers)} (not {', '.join(missing)})")
    return out


def covering(path: Path, regime: Regime, *, shaper: bool = True, segments: bool = False) -> dict[str, Any]:
    """What a simulated run of `regime` records: ``validation``, the newest record of the store at
    `path` that covers it (`ValidationRecord.summary`), or ``validation_gap``, why none does
    (`shaper`: the run models the emulation's shaper; `segments`: its frames cross as segments; `gaps`)."""
    try:
        records = load_all(path)
    except ValueError as e:
        return {"validation_gap": f"the validation store is unreadable ({e})"}
    ok = [r for r in records if not gaps(r, regime, shaper=shaper, segments=segments)]
    if ok:
        return {"validation": max(ok, key=lambda r: r.created).summary()}
    head = f"no validation covers this run's regime ({regime.text()})"
    if not records:
        return {"validation_gap": f"{head}: no `netai validate` recorded in {path}"}
    newest_first = sorted(records, key=lambda r: r.created, reverse=True)
    nearest = min(newest_first, key=lambda r: len(gaps(r, regime, shaper=shaper, segments=segments)))  # the newest of the nearest
    return {"validation_gap": f"{head}; of the {len(records)} in {path}, the nearest, {nearest.config} of "
                              f"{nearest.created} on {nearest.host}: {'; '.join(gaps(nearest, regime, shaper=shaper, segments=segments))}"}
