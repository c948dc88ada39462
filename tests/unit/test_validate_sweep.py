"""`netai validate` of a sweep (`orchestrator.experiment.validate_sweep`): bad input refused before
anything starts, and both engines' ratios tabled and drawn against the model's size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import load_config
from orchestrator.experiment.validate_sweep import entry_runs, plot_sweep, sweep_table
from orchestrator.results.agreement import ClaimAgreement
from orchestrator.results.stats import PairedRatio

ROOT = Path(__file__).resolve().parents[2]


def test_a_sweep_folder_without_an_entrys_run_is_refused_naming_the_entries(tmp_path: Path) -> None:
    cfg = load_config(ROOT / "experiments" / "regimes.yaml")
    assert entry_runs(cfg, None) == [None] * len(cfg.sweep)  # no folder: every entry runs anew
    with pytest.raises(ConfigError, match=r"has no run of the sweep's regimes-1, regimes-2"):
        entry_runs(cfg, tmp_path)


def test_the_cli_refuses_a_folder_that_is_not_a_sweeps_in_one_line_before_anything_starts(tmp_path: Path) -> None:
    out = tmp_path / "runs"
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "validate", "experiments/regimes.yaml",
                           "--emulated-run", str(tmp_path), "--out", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "not a sweep's folder (no sweep.json)" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert not out.exists()


def _ratio(mean: float, half: float) -> PairedRatio:
    return PairedRatio(mean=mean, low=mean - half, high=mean + half, tasks=3, rounds=6)


def _entry(name: str, size: int, emu: float, sim: float, faithful: bool = True) -> tuple[str, int, Any]:
    claims = [ClaimAgreement("mst", "spff", 8, _ratio(emu, 0.03), _ratio(sim, 0.03))]
    return name, size, SimpleNamespace(claims=claims, reference_faithful=faithful,
                                       record=SimpleNamespace(worst_error=abs(sim / emu - 1)))


def test_the_table_gives_both_ratios_their_overlap_and_each_references_verdict(tmp_path: Path) -> None:
    entries = [_entry("r-1", 19_000, 0.70, 0.68), _entry("r-2", 2_800_000, 0.45, 0.60, faithful=False)]
    lines = sweep_table(entries, 0.33, 0.10)
    assert lines[2] == ("| r-1 | 0.019 MB | mst / spff at 8 | 0.700 [0.670, 0.730] | 0.680 [0.650, 0.710] | yes "
                        "| 2.86% | faithful |")
    assert lines[3].endswith("| NO | 33.33% | NOT faithful |")
    assert lines[-1] == ("Mean round latency sim/emu over every point of every entry: worst error 33.00%, "
                         "geometric-mean error 10.00%.")
    figure = plot_sweep(entries, tmp_path)
    assert [f.name for f in figure.files] == ["regimes_sim_vs_emu.png", "regimes_sim_vs_emu.svg"]
    assert all(f.stat().st_size > 0 for f in figure.files)
    assert plot_sweep(entries[:1], tmp_path).skipped  # one size: nothing to draw against
