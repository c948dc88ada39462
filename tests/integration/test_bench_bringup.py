"""The bring-up benchmark runs for real (quick: nobel-us, one pair): both variants come up with every
switch connected, the JSON carries its figures, and neither variant leaves anything behind.

Behaviour only: no time and no ratio is asserted (the machine is shared; the figures are printed).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.test_experiment import leftovers

pytestmark = [pytest.mark.root, pytest.mark.slow]

BENCH = Path(__file__).parents[2] / "benchmarks" / "bench_bringup.py"
NOTHING = {"bridges": [], "veths": [], "controller": [], "containers": []}
SUMMARY_KEYS = ("median_project_enter_s", "median_project_bringup_s", "median_plain_bringup_s", "ratio_median",
                "ratio_min", "ratio_max", "bringup_ratio_median", "median_project_teardown_s",
                "median_plain_teardown_s", "teardown_ratio_median", "limit", "within_limit")


def test_bringup_benchmark_brings_both_variants_up_and_leaves_nothing(figures: list[str]) -> None:
    assert leftovers() == NOTHING  # else what follows would not be this run's

    res = subprocess.run([sys.executable, str(BENCH), "--quick", "--json"], capture_output=True, text=True,
                         timeout=600)

    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout)
    figures.append(f"bring-up on {out['topology']}: project {out['median_project_enter_s']} s, plain Mininet "
                   f"{out['median_plain_bringup_s']} s, ratio {out['ratio_median']}")
    assert (out["topology"], out["switches"], out["hosts"], out["links"]) == ("sndlib/nobel-us", 14, 14, 21)
    for key in SUMMARY_KEYS:
        assert key in out, key
    assert out["limit"] == 1.2
    (rep,) = out["repetitions"]
    assert rep["order"] == ["project", "plain"]
    for variant in ("project", "plain"):
        v = rep[variant]
        assert v["switches_connected"] == 14, (variant, v)
        assert (v["datapath"], v["delay_emulated"]) == (out["datapath"], out["delay_emulated"]), (variant, v)
        assert v["teardown_clean"] is True, (variant, v)
        assert not any(v["leftovers"].values()), (variant, v)
        assert v["bringup_s"] > 0 and v["teardown_s"] > 0, (variant, v)
    assert rep["project"]["enter_s"] >= rep["project"]["bringup_s"] - 0.001  # bringup_s is part of it (rounded)
    assert rep["ratio"] == pytest.approx(rep["project"]["enter_s"] / rep["plain"]["bringup_s"], rel=1e-2)
    assert out["ratio_median"] == rep["ratio"]
    assert out["within_limit"] == (rep["ratio"] <= 1.2)
    assert leftovers() == NOTHING
