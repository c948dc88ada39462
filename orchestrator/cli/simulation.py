"""`netai calibrate` and `netai validate CONFIG`: the flow-level simulation against the emulation.

`calibrate` finds this host's time dilation K (auto-dilation trials of a fixed set), runs the set
emulated at K (needs root, minutes) and stores K and the parameters fitted on it with the host's
identity and the project's version (`orchestrator.experiment.calibrate`). `validate` runs a config
emulated (at the host's K when the config sets none) and simulated on the same tasks, prints how
far apart they are and records it in the user's store of validations (`orchestrator.experiment.validate`);
it exits 1 when the emulated reference was not faithful. Input is checked
before anything starts; progress goes to standard output, one line per step.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import AUTO_MAX_TIME_DILATION, MAX_TIME_DILATION, ExperimentConfig

BACKENDS = ("auto", "docker", "process")


def _store(args: argparse.Namespace) -> Path:
    from orchestrator.simulation.calibration import default_path

    return Path(args.calibration) if args.calibration else default_path()


def _check_run_dir(path: str | None) -> Path | None:
    if path is None:
        return None
    run = Path(path)
    if not (run / "results.db").is_file():
        raise ConfigError(f"--emulated-run {path}: no results.db there")
    return run


def _check_root(reused: Path | None) -> None:
    if reused is None and os.geteuid() != 0:
        raise ConfigError("the emulated run needs root (Mininet): run as root, or give --emulated-run")


def cmd_calibrate(args: argparse.Namespace) -> int:
    from orchestrator.experiment.calibrate import calibrate

    reused = _check_run_dir(args.emulated_run)
    _check_root(reused)
    store = _store(args)
    if store.exists():
        from orchestrator.simulation.calibration import load_all

        try:
            load_all(store)
        except ValueError as e:
            raise ConfigError(str(e)) from e
    cal = calibrate(out_root=Path(args.out), store=store, backend=args.backend, emulated_run=reused,
                    max_time_dilation=args.max_time_dilation, say=lambda line: print(line, flush=True))
    print(f"stored {cal.summary()} in {store}")
    for t in (cal.dilation or {}).get("trials", []):
        print(f"  trial K={t['k']:g}: {'faithful' if t['faithful'] else 'NOT faithful'} ({t['wall_s']:.0f} s)")
    print("parameters: " + ", ".join(f"{k} {v:g}" for k, v in cal.params.items())
          + f"; propagation {'on' if cal.delay_emulated else 'off'} (the emulation's link delay)")
    print(f"{'point':<20}{'emulated ms':>12}{'uncalibrated':>14}{'ratio':>8}{'calibrated':>12}{'ratio':>8}")
    for p in cal.points:
        emu, before, after = p["emulated_s"], p["uncalibrated_s"], p["calibrated_s"]
        print(f"{p['scheduler'] + ', ' + str(p['locals']) + ' locals':<20}{emu * 1e3:>12.1f}"
              f"{before * 1e3:>14.1f}{before / emu:>8.3f}{after * 1e3:>12.1f}{after / emu:>8.3f}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from orchestrator.experiment.config import load_config
    from orchestrator.experiment.validate import validate

    cfg = load_config(args.config)  # every config error here, before anything starts
    if cfg.sweep:
        return _validate_sweep(cfg, args)
    reused = _check_run_dir(args.emulated_run)
    _check_root(reused)
    result = validate(cfg, out_root=Path(args.out), backend=args.backend, emulated_run=reused,
                      calibration_store=_store(args), host_k=not sets_dilation(Path(args.config)),
                      say=lambda line: print(line, flush=True), figures=not args.no_figures)
    print(f"written: {result.out_dir / 'validation.json'}")
    if not result.reference_faithful:
        print("netai: the emulated reference is not faithful: this validation covers no simulated run "
              "(its first line says where)", file=sys.stderr)
        return 1
    return 0


def _validate_sweep(cfg: ExperimentConfig, args: argparse.Namespace) -> int:
    """`netai validate` of a sweep: each entry against its run of ``--emulated-run`` (a sweep's folder)."""
    from orchestrator.experiment.validate_sweep import validate_sweep

    sweep_dir = None if args.emulated_run is None else Path(args.emulated_run)
    if sweep_dir is not None and not (sweep_dir / "sweep.json").is_file():
        raise ConfigError(f"--emulated-run {sweep_dir}: not a sweep's folder (no sweep.json); {cfg.name} has a sweep")
    _check_root(sweep_dir)
    result = validate_sweep(cfg, out_root=Path(args.out), backend=args.backend, emulated_run=sweep_dir,
                            calibration_store=_store(args), say=lambda line: print(line, flush=True),
                            figures=not args.no_figures)
    print(f"sweep {cfg.name}: mean round latency sim/emu over every entry's points: worst error "
          f"{result.worst_error:.2%}, geometric-mean error {result.geomean_error:.2%}")
    print(f"written: {result.out_dir / 'validation.md'}"
          + (f"; figure {result.figure.files[0]}" if result.figure.files else ""))
    if not result.reference_faithful:
        print("netai: an emulated reference is not faithful: its entry's validation covers no simulated run "
              "(its first line says where)", file=sys.stderr)
        return 1
    return 0


def sets_dilation(config: Path) -> bool:
    """Whether the config file sets ``emulation.time_dilation`` itself (a number, auto or host)."""
    import yaml

    raw = yaml.safe_load(config.read_text())
    emulation = raw.get("emulation") if isinstance(raw, dict) else None
    return isinstance(emulation, dict) and "time_dilation" in emulation


def _dilation_cap(v: str) -> float:
    try:
        k = float(v)
    except ValueError:
        k = 0.0
    if not 1 <= k <= MAX_TIME_DILATION:
        raise argparse.ArgumentTypeError(f"must be a number in 1..{MAX_TIME_DILATION:g}, got {v!r}")
    return k


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", default="runs", help="folder for the run folders (default: runs)")
    p.add_argument("--calibration", metavar="FILE",
                   help="the calibration store (default: $NETAI_CALIBRATION, else "
                        "~/.local/state/netai/calibration.json)")
    p.add_argument("--emulated-run", metavar="RUN_DIR",
                   help="use this earlier emulated run (of the same config) instead of running the emulation")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="find this host's time dilation K and fit the simulation at it (needs root, minutes)")
    _common(p)
    p.add_argument("--backend", choices=BACKENDS, default="auto", help="where the emulated workers run")
    p.add_argument("--max-time-dilation", type=_dilation_cap, default=AUTO_MAX_TIME_DILATION, metavar="K",
                   help=f"the largest K the time-dilation trials try (default {AUTO_MAX_TIME_DILATION:g})")
    p.set_defaults(func=cmd_calibrate)
    v = sub.add_parser("validate", help="run a config emulated and simulated on the same tasks and compare")
    v.add_argument("config", help="experiment YAML (engine: emulation), e.g. experiments/quick.yaml")
    _common(v)
    v.add_argument("--backend", choices=BACKENDS, help="override the config's emulation backend")
    v.add_argument("--no-figures", action="store_true",
                   help="the emulated and simulated runs without their plots; the comparison's figure is drawn")
    v.set_defaults(func=cmd_validate)
