"""Integration-test helpers.

- Each test's report is kept on its item (``item.rep_call``), so fixtures can dump flows and
  controller logs when a test failed.
- `figures` collects measured figures (bring-up seconds, iperf ratios); they are printed in the
  terminal summary of every run, passing or not.
- `sshd` (from `tests.integration.sshd`): an sshd on 127.0.0.1 with keys made for the test.
- `machines` (from `tests.integration.machines`): test machines, containers on an internal network.
- Every `netai` a test started (`tests.integration.test_experiment.netai`) and left running, because
  it failed before its end, is interrupted after it, so that its network does not stand in the way
  of the next test's.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from tests.integration.machines import machines  # noqa: F401 - a fixture for the tests of this folder
from tests.integration.sshd import sshd  # noqa: F401 - a fixture for the tests of this folder

_FIGURES: list[str] = []


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"rep_{report.when}", report)


@pytest.fixture(autouse=True)
def _end_started_runs() -> Generator[None, None, None]:
    from tests.integration.test_experiment import end_started

    yield
    end_started()


@pytest.fixture
def figures() -> list[str]:
    """Append a line to have it printed in the run's terminal summary."""
    return _FIGURES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _FIGURES:
        terminalreporter.section("netai measured figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
