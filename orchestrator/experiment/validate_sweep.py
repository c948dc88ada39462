"""`netai validate` of a config with a sweep (docs/simulation.md, "A sweep, validated"): each entry is
validated as a config of its own (`orchestrator.experiment.validate.validate`) against its run of an
emulated sweep (``--emulated-run SWEEP_DIR``) or a new emulated run, each into the store; then every
scheduler's latency ratio against spff, emulated and simulated with their 95 % intervals, is drawn
against the model's size (``regimes_sim_vs_emu``), and the errors are given over all entries' points.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.validate import Validation, validate
from orchestrator.results.agreement import ClaimAgreement, latency_errors
from orchestrator.results.figures import Figure, pyplot, scheduler_colours
from orchestrator.results.regimes import save_size_axes
from orchestrator.results.stats import PairedRatio

Say = Callable[[str], None]
CAPTION = ("Mean round latency of each scheduler over spff's on the same tasks (mean of per-task ratios, 95 % "
           "bootstrap interval) against the model's size, the emulated sweep (filled) and its simulated twins "
           "(hollow, dashed); hollow grey rings: the emulated point was not faithful.")


@dataclass(frozen=True)
class SweepValidation:
    out_dir: Path
    #: Per entry: its name, its model's bytes and its validation.
    entries: list[tuple[str, int, Validation]]
    figure: Figure
    worst_error: float
    geomean_error: float

    @property
    def reference_faithful(self) -> bool:
        return all(v.reference_faithful for _n, _b, v in self.entries)


def entry_runs(cfg: ExperimentConfig, sweep_dir: Path | None) -> list[Path | None]:
    """Each entry's run folder in the emulated sweep `sweep_dir` (None each without one: run anew).

    Raises
    ------
    ConfigError
        If `sweep_dir` lacks a run of an entry: said before anything starts.
    """
    if sweep_dir is None:
        return [None] * len(cfg.sweep)
    from orchestrator.experiment.resume import entry_run_dir

    runs = [entry_run_dir(sweep_dir, run.name) for run in cfg.sweep]
    missing = [run.name for run, d in zip(cfg.sweep, runs, strict=True) if d is None]
    if missing:
        raise ConfigError(f"{sweep_dir} has no run of the sweep's {', '.join(missing)}: pass the folder of a sweep "
                          f"of {cfg.name} (`netai experiment` prints it), or no --emulated-run to run it")
    return list(runs)


def validate_sweep(cfg: ExperimentConfig, *, out_root: Path, backend: str | None = None,
                   emulated_run: Path | None = None, calibration_store: Path | None = None, say: Say = print,
                   validations: Path | None = None, figures: bool = True) -> SweepValidation:
    """Validate every entry of `cfg`'s sweep (see the module docstring); without `figures`, the entries'
    runs draw no plots (`validate`), the sweep's own figure is drawn.

    Raises
    ------
    ConfigError
        Bad input, before anything starts (an entry without its run in `emulated_run`), or what an
        entry's validation raises.
    """
    runs = entry_runs(cfg, emulated_run)
    folder = out_root / f"{cfg.name}-validate-{time.strftime('%Y%m%d-%H%M%S')}"
    folder.mkdir(parents=True, exist_ok=False)
    entries = []
    for i, (run, run_dir) in enumerate(zip(cfg.sweep, runs, strict=True), 1):
        say(f"sweep entry {i} of {len(cfg.sweep)}: {run.name}")
        result = validate(run, out_root=folder, backend=backend, emulated_run=run_dir,
                          calibration_store=calibration_store, say=say, validations=validations, figures=figures)
        entries.append((run.name, result.record.regime.model_bytes[1], result))
    worst, geomean = latency_errors([p for _n, _b, v in entries for p in v.points])
    figure = plot_sweep(entries, folder)
    (folder / "validation.md").write_text("\n".join(sweep_table(entries, worst, geomean)) + "\n")
    return SweepValidation(folder, entries, figure, worst, geomean)


def _claims(entries: Sequence[tuple[str, int, Validation]]) -> dict[str, list[tuple[int, ClaimAgreement, bool]]]:
    """scheduler -> (model bytes, its claim against spff at the entry's most locals, the emulated
    points faithful) per entry."""
    out: dict[str, list[tuple[int, ClaimAgreement, bool]]] = {}
    for _name, size, v in entries:
        top = max((c.n_locals for c in v.claims), default=0)
        for c in v.claims:
            if c.denominator == "spff" and c.n_locals == top:
                out.setdefault(c.numerator, []).append((size, c, v.reference_faithful))
    return {s: sorted(pts, key=lambda p: p[0]) for s, pts in out.items()}


def plot_sweep(entries: Sequence[tuple[str, int, Validation]], out_dir: Path) -> Figure:
    """Both engines' ratios against spff against the model's size (not drawn with one size)."""
    claims = _claims(entries)
    if len({size for _n, size, _v in entries}) < 2 or not claims:
        return Figure("regimes_sim_vs_emu", CAPTION, skipped="the entries do not differ in model size")
    plt = pyplot()
    colours = scheduler_colours([*claims, "spff"])
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for s, pts in claims.items():
        for engine, style, fill in (("emulated", "-", True), ("simulated", "--", False)):
            drawn = [(b, r) for b, c, _ok in pts if (r := getattr(c, engine)) is not None]
            shift = 1.0 if fill else 1.06  # side by side on the log axis
            ax.plot([b * shift for b, _r in drawn], [r.mean for _b, r in drawn], style, color=colours[s],
                    label=f"{s} / spff, {engine}")
            for b, r in drawn:
                ax.errorbar([b * shift], [r.mean], yerr=[[r.mean - r.low], [r.high - r.mean]], fmt="o",
                            color=colours[s], mfc=colours[s] if fill else "white", capsize=3)
        for b, c, ok in pts:
            if not ok and c.emulated is not None:
                ax.plot([b], [c.emulated.mean], "o", ms=12, mfc="none", mec="0.5")
    ax.axhline(1.0, color="0.5", lw=0.8)
    files = save_size_axes(plt, fig, ax, out_dir, "regimes_sim_vs_emu", legend_size=7)
    return Figure("regimes_sim_vs_emu", CAPTION, files)


def _ratio(r: PairedRatio | None) -> str:
    return "-" if r is None else f"{r.mean:.3f} [{r.low:.3f}, {r.high:.3f}]"


def sweep_table(entries: Sequence[tuple[str, int, Validation]], worst: float, geomean: float) -> list[str]:
    """The sweep's validation as Markdown: per entry and scheduler both ratios, whether they overlap,
    the entry's worst point error and its reference's verdict; then the errors over every point."""
    lines = ["| run | model | ratio | emulated [95 % CI] | simulated [95 % CI] | overlap | entry's worst error "
             "| reference |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    claims = _claims(entries)
    for name, size, v in entries:
        for s in sorted(claims):
            for b, c, _ok in claims[s]:
                if b == size:
                    lines.append(f"| {name} | {size / 1e6:.3g} MB | {s} / spff at {c.n_locals} | {_ratio(c.emulated)} "
                                 f"| {_ratio(c.simulated)} | {'yes' if c.overlap else 'NO'} "
                                 f"| {v.record.worst_error:.2%} | {'faithful' if v.reference_faithful else 'NOT faithful'} |")
    return [*lines, "", f"Mean round latency sim/emu over every point of every entry: worst error {worst:.2%}, "
            f"geometric-mean error {geomean:.2%}."]
