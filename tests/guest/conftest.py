"""Guest-test helpers: `figures` collects measured figures, printed in the run's terminal summary
(a section of its own, passing or not)."""

from __future__ import annotations

from typing import Any

import pytest

_FIGURES: list[str] = []


@pytest.fixture(scope="session")
def figures() -> list[str]:
    """Append a line to have it printed in the run's terminal summary."""
    return _FIGURES


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _FIGURES:
        terminalreporter.section("netai stock-kernel figures")
        for line in _FIGURES:
            terminalreporter.write_line(line)
