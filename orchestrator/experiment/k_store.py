"""``time_dilation: auto`` without its trials, when this host already chose a K for the same workload.

`search_or_reuse` looks up the K an earlier auto run on this host chose for the same workload shape
(`workload_key`: topology, link rates, model, compute, the largest number of locals, schedulers,
rounds, backend, datapath, background, whether copies are paced, the verdict's allowances) in a small store beside the host's calibrations
(``auto_k.json`` next to `orchestrator.simulation.calibration.default_path`); with a K per point
each point is a workload of its own, its locals the largest. Found: the run uses it,
with no trials, and says where it came from. Not found: the trials run (`calibration.search`) and a
faithful choice is stored. A run at a reused K that turns out not faithful drops it (`forget`), so the
next run of that workload calibrates again; ``netai experiment --recalibrate`` ignores the store.

The key holds the host's identity too (hostname, machine id, CPU, cores, kernel: the calibration's),
and the project's version, so a K is never taken to another host or version.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from orchestrator.experiment.calibration import Calibration, Trial, search
from orchestrator.simulation.calibration import HostIdentity, default_path

#: Set to ignore the store for one run (``netai experiment --recalibrate``).
ENV_RECALIBRATE = "NETAI_RECALIBRATE"


def store_path() -> Path:
    return default_path().with_name("auto_k.json")


def workload_key(cfg: Any, backend: str) -> str:
    """A digest of what sets a workload's K on this host (see the module docstring)."""
    shape = {
        "host": asdict(HostIdentity.here()),
        "topology": cfg.topology, "max_link_mbps": cfg.emulation.max_link_mbps,
        "task": repr(cfg.task), "compute": repr(cfg.compute), "locals": max(cfg.locals),
        "schedulers": [repr(s) for s in cfg.schedulers], "backend": backend,
        "datapath": cfg.emulation.datapath, "connectivity": cfg.emulation.connectivity,
        "background": repr(cfg.background), "cap": cfg.emulation.max_time_dilation,
        "paced": cfg.emulation.pace_copies, "verdict": verdict_rules(),
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:16]


def verdict_rules() -> list[float]:
    """The fidelity verdict's allowances: a K chosen under other rules is not reused."""
    from orchestrator.results import fidelity as f

    return [f.HOP_FACTOR, f.HOP_SLACK_S, f.RATE_LOW, f.RATE_HIGH, f.NEGATIVE_HOP_SHARE, f.OVERRUN_SHARE,
            f.BOUND_SHARE, f.CHAIN_SHARE]


def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def find(key: str, path: Path | None = None) -> dict[str, Any] | None:
    """The stored choice for `key` ({"k", "date"}), None if there is none or the store is unreadable."""
    entry = _load(path or store_path()).get(key)
    ok = isinstance(entry, dict) and isinstance(entry.get("k"), int | float) and entry["k"] >= 1
    return entry if ok else None


def save(key: str, k: float, path: Path | None = None) -> None:
    path = path or store_path()
    data = _load(path)
    data[key] = {"k": k, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
    os.replace(tmp, path)


def forget(key: str, path: Path | None = None) -> bool:
    """Drop `key`'s K (its run was not faithful); whether there was one."""
    path = path or store_path()
    data = _load(path)
    if data.pop(key, None) is None:
        return False
    path.write_text(json.dumps(data, indent=1, sort_keys=True))
    return True


def search_or_reuse(key: str, trial: Callable[[float], Trial], cap: float, *, say: Callable[[str], None],
                    path: Path | None = None, floor: float = 1.0, floor_locals: int = 0) -> Calibration:
    """This host's K for the workload `key` if one is stored (no trials), else `search` from `floor`
    (storing a faithful choice)."""
    stored = None if os.environ.get(ENV_RECALIBRATE) else find(key, path)
    if stored is not None and float(stored["k"]) <= cap:
        k, when = float(stored["k"]), stored["date"]
        if floor_locals and k < floor <= cap:  # a point with more locals needs no less (`search`)
            say(f"time dilation auto: K={floor:g}, the K of this run's point at {floor_locals} locals, above the "
                f"K={k:g} this host chose for the same workload on {when} (no trials)")
            return Calibration(k=floor, faithful=True, cap=cap, trials=(), reused_from=str(when), floor=floor,
                               floor_locals=floor_locals)
        say(f"time dilation auto: K={k:g}, as this host chose for the same workload on {when} "
            f"(no trials; --recalibrate runs them again)")
        return Calibration(k=k, faithful=True, cap=cap, trials=(), reused_from=str(when))
    cal = search(trial, cap, say=say, floor=floor, floor_locals=floor_locals)
    if cal.faithful:
        save(key, cal.k, path)
    return cal


def after_run(cfg: Any, backend: str, summary: Any) -> None:
    """After an auto run: each K it reused whose point (with a K per point, its own point; else any)
    was not faithful is forgotten, so the next run of that workload calibrates again."""
    if not getattr(cfg.emulation, "time_dilation_auto", False) or summary is None:
        return
    env = summary.environment
    per_point = env.get("time_dilation_calibration_per_point")
    calibrations = {int(n): c for n, c in per_point.items()} if per_point else \
        {max(cfg.locals): env.get("time_dilation_calibration") or {}}
    for n, cal in calibrations.items():
        unfaithful = any(not v.faithful for v in summary.verdicts if not per_point or v.n_locals == n)
        if cal.get("reused_from") and unfaithful:
            forget(workload_key(replace(cfg, locals=(n,)), backend))  # the key of its largest point: n
