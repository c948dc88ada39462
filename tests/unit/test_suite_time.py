"""scripts/suite_time.sh (make test's time, revision against revision): what it refuses, before it
clones, tags or starts anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "suite_time.sh"


def _run(*args: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "TMPDIR": str(tmp)})


@pytest.mark.parametrize("args", [(), ("a", "b", "c"), ("--pairs", "0", "HEAD"), ("--pairs", "x", "HEAD"),
                                  ("--pairs", "-1", "HEAD")])
def test_bad_usage_exits_2_with_the_usage_and_leaves_nothing(args: tuple[str, ...], tmp_path: Path) -> None:
    res = _run(*args, tmp=tmp_path)
    assert res.returncode == 2
    assert res.stderr.startswith("usage: ") and res.stdout == ""
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [("no-such-revision",), ("HEAD", "no-such-revision")])
def test_an_unknown_revision_or_a_normal_user_is_refused_before_anything_starts(args: tuple[str, ...],
                                                                               tmp_path: Path) -> None:
    res = _run(*args, tmp=tmp_path)
    assert res.returncode == 2
    why = "unknown revision: no-such-revision" if os.geteuid() == 0 else "run as root"
    assert why in res.stderr, res.stderr
    assert list(tmp_path.iterdir()) == [], "no work folder"
