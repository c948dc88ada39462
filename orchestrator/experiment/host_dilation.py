"""This host's time dilation K, from its calibration (``emulation.time_dilation: host``; `netai
validate` for a config that sets no K): docs/fidelity.md, "Fidelity" and "Flow-level simulation".

`netai calibrate` runs the auto-dilation trials once on the calibration set's workload and stores the
K they chose with the host's calibration (`orchestrator.simulation.calibration.Calibration.time_dilation`).
A config that says ``time_dilation: host`` runs at that K without trials of its own; a host with no
such calibration (none, another host's or version's, or one made before K was measured) is a
`ConfigError` before anything starts, naming `netai calibrate`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import AUTO, HOST, ExperimentConfig, parse_config
from orchestrator.simulation.calibration import Calibration, CalibrationMismatch, default_path, find


def host_calibration(store: Path | None = None) -> Calibration:
    """This host's newest calibration for this version (`calibration.find` in `store`, default
    `default_path`), which must carry a K.

    Raises
    ------
    ConfigError
        No calibration of this host and version, or the newest has no K (it says `netai calibrate`).
    """
    path = store or default_path()
    try:
        cal = find(path)
    except (CalibrationMismatch, ValueError) as e:
        raise ConfigError(f"this host's time dilation is unknown: {e}") from None
    if cal.time_dilation is None:
        raise ConfigError(f"this host's time dilation is unknown: its calibration {cal.id} in {path} has none "
                          "(made before `netai calibrate` measured it): run `netai calibrate` on this host")
    return cal


def with_k(cfg: ExperimentConfig, cal: Calibration) -> ExperimentConfig:
    """`cfg` at `cal`'s K (a fixed dilation, the calibration named in ``time_dilation_from``)."""
    if cal.time_dilation is None:
        raise ValueError(f"calibration {cal.id} has no time dilation")
    emulation = replace(cfg.emulation, time_dilation=cal.time_dilation, time_dilation_auto=False,
                        time_dilation_host=False, time_dilation_from=cal.id)
    return replace(cfg, emulation=emulation)


def resolve(cfg: ExperimentConfig, store: Path | None = None) -> ExperimentConfig:
    """`cfg` (and every run of its sweep) with ``time_dilation: host`` replaced by this host's K;
    unchanged without it.

    Raises
    ------
    ConfigError
        ``time_dilation: host`` on a host without a calibration that has a K (`host_calibration`).
    """
    if cfg.sweep:
        cfg = replace(cfg, sweep=tuple(resolve(run, store) for run in cfg.sweep))
    if cfg.engine != "emulation" or not cfg.emulation.time_dilation_host:
        return cfg
    try:
        cal = host_calibration(store)
    except ConfigError as e:
        raise ConfigError(f"emulation.time_dilation: host: {e}") from None
    return with_k(cfg, cal)


def with_dilation(cfg: ExperimentConfig, value: str | None, cap: float | None = None, *, where: str) -> ExperimentConfig:
    """`cfg` with ``emulation.time_dilation`` set to `value` (a number, ``auto`` or ``host``; None: the
    config's own) and, for ``auto``, ``max_time_dilation`` to `cap` (else the config's cap, or the default): `netai experiment
    --time-dilation`, so that a shipped config (``experiments/paper.yaml``) can run dilated without a
    copy. A number or ``host`` is the whole run's K (a K per point of the config is dropped); ``auto``
    keeps the config's ``per_point``. The result is validated as a config is (`parse_config`, errors
    naming `where`).

    Raises
    ------
    ConfigError
        A value that is no K, a cap without ``auto``, a simulated config, or a sweep (its entries set
        their own K).
    """
    if cfg.sweep:
        raise ConfigError(f"{where}: --time-dilation does not apply to a sweep: set time_dilation in its entries")
    if cfg.engine != "emulation":
        raise ConfigError(f"{where}: --time-dilation is the emulation's: this config has engine: {cfg.engine}")
    d = cfg.to_dict()
    k: Any = d["emulation"]["time_dilation"] if value is None else value
    if value is not None and value not in (AUTO, HOST):
        try:
            k = float(value)
        except ValueError:
            raise ConfigError(f"{where}: --time-dilation must be a number, {AUTO} or {HOST}, got {value!r}") from None
    if cap is not None and k != AUTO:
        raise ConfigError(f"{where}: --max-time-dilation is the calibration's cap: it needs --time-dilation {AUTO}")
    d["emulation"]["time_dilation"] = k
    if value is not None and value != AUTO:
        d["emulation"].pop("per_point", None)  # a K given on the command line is the whole run's
    if k != AUTO:
        d["emulation"].pop("max_time_dilation", None)
    elif cap is not None:
        d["emulation"]["max_time_dilation"] = cap
    return parse_config(d, where=where)
