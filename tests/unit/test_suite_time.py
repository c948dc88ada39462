"""scripts/suite_time.sh (make test's time, revision against revision): what it refuses, before it
clones, tags or starts anything, and that a revision whose suite fails is timed and paired all the
same."""

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


@pytest.mark.skipif(os.geteuid() != 0, reason="the script runs as root")
def test_a_revision_whose_suite_fails_is_timed_paired_and_named(tmp_path: Path) -> None:
    # Prepare: a repository with the script, whose CI command fails at the base and passes at the head
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / ".ci").mkdir()
    (repo / "scripts" / "suite_time.sh").write_bytes(SCRIPT.read_bytes())
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org"]
    subprocess.run([*git, "init", "-q"], check=True)
    revs = []
    for code in (3, 0):
        (repo / ".ci" / "run").write_text(f"sleep 0.3\necho '1 passed in 0.3s'\nexit {code}\n")
        subprocess.run([*git, "add", "-A"], check=True)
        subprocess.run([*git, "commit", "-q", "-m", f"exit {code}"], check=True)
        revs.append(subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                                   text=True).stdout.strip())
    work = tmp_path / "tmp"
    work.mkdir()

    # Execute
    res = subprocess.run(["bash", str(repo / "scripts" / "suite_time.sh"), *revs], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "TMPDIR": str(work)})

    # Assert: both runs timed and paired, the failed one named, exit 1
    assert res.returncode == 1, res.stderr
    assert "base " + revs[0][:10] + " run 1: " in res.stdout and "exit status 3" in res.stdout
    assert "head " + revs[1][:10] + " run 1: " in res.stdout and "exit status 0" in res.stdout
    assert "head / base per pair: " in res.stdout
    assert res.stdout.rstrip().splitlines()[-1].startswith("[suite-time] failed: base run 1 ")
