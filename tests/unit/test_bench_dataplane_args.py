"""`benchmarks/bench_dataplane.py --bound RATE[@K] ...`: each bound run's link rate and time dilation,
checked before anything starts (a bad value is one line of argparse and exit status 2)."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_dataplane", ROOT / "benchmarks" / "bench_dataplane.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("text", "want"), [("25", (25.0, 1.0)), ("50@2", (50.0, 2.0)), ("12.5@1.5", (12.5, 1.5))])
def test_a_bound_run_is_a_rate_and_its_k(text: str, want: tuple[float, float]) -> None:
    assert _bench().bound_run(text) == want


BAD = ["x", "50@", "@2", "0", "50@0.5", "-5@2", "inf", "50@inf", "nan"]


@pytest.mark.parametrize("text", BAD)
def test_a_bad_bound_run_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"(?i)rate"):
        _bench().bound_run(text)


@pytest.mark.parametrize("text", ["x", "50@0.5", "-5@2"])
def test_a_bad_bound_run_is_one_line_and_exit_2_before_anything_starts(text: str) -> None:
    # Execute: as a user would (argparse refuses before the root check and any Mininet); "=" keeps a
    # value that starts with "-" a value
    res = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_dataplane.py"), f"--bound={text}"],
                         capture_output=True, text=True, timeout=120)

    # Assert
    assert res.returncode == 2
    assert "argument --bound: " in res.stderr.splitlines()[-1] and text in res.stderr.splitlines()[-1]
