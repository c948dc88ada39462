"""The two parts `make test` runs at once (scripts/test.sh; ``NETAI_SUITE_PART``, tests/conftest.py):
together the whole suite, each test in one of them, and beside the rest (at idle CPU priority) only
what needs no network of this host's and no CPU priority of its own."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.conftest import PART_ENV

ROOT = Path(__file__).resolve().parents[2]


def collect(part: str | None) -> subprocess.CompletedProcess[str]:
    """``pytest --collect-only`` of the whole suite with `PART_ENV` set to `part` (None: unset)."""
    env = {k: v for k, v in os.environ.items() if k != PART_ENV}
    if part is not None:
        env[PART_ENV] = part
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)


def node_ids(res: subprocess.CompletedProcess[str]) -> tuple[list[str], int]:
    """The collected test ids, and how many the suite holds in all (pytest's "N/M tests collected")."""
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    total = re.search(r"^\d+/(\d+) tests collected", res.stdout, flags=re.M)
    assert total, res.stdout[-3000:]
    return [line for line in res.stdout.splitlines() if "::" in line], int(total[1])


def test_the_two_parts_are_the_whole_suite_and_beside_holds_no_network_test() -> None:
    # Execute: both collections side by side
    with ThreadPoolExecutor(2) as pool:
        (beside, total), (main, total_too) = pool.map(lambda part: node_ids(collect(part)), ["beside", "main"])

    # Assert: a partition of the whole suite
    assert total == total_too == len(beside) + len(main)
    assert not set(beside) & set(main)
    # beside: the unit tests and the simulation's integration tests; never root, Docker or the guest
    assert not [n for n in beside if n.startswith(("tests/docker/", "tests/guest/"))]
    assert {n.split("::")[0] for n in beside if n.startswith("tests/integration/")} == {
        "tests/integration/test_kill_campaign.py", "tests/integration/test_resume_sweep.py"}
    assert "tests/integration/test_kill_campaign.py::test_kill_campaign_on_the_simulation" in beside
    assert "tests/integration/test_kill_campaign.py::test_kill_campaign_on_the_emulation" in main
    # every unit test is beside but those that read back CPU priorities: they stay at normal priority
    in_main = {n.split("::")[0] for n in main if n.startswith("tests/unit/")}
    assert in_main == {"tests/unit/test_train_priority.py", "tests/unit/test_datapath_priority.py"}
    assert "tests/unit/test_suite_parts.py::test_an_unknown_part_is_refused_before_any_test_is_collected" in beside


def test_an_unknown_part_is_refused_before_any_test_is_collected() -> None:
    res = collect("both")

    assert res.returncode == 4  # pytest's usage error
    assert f"{PART_ENV} must be 'beside' or 'main', not 'both'" in res.stdout + res.stderr
    assert "collected" not in res.stdout
