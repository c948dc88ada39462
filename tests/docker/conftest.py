"""Container tests run the project's code from the worker image: bring it in step with the checkout
first (seconds when only code changed, nothing when it is current)."""

from __future__ import annotations

import pytest

from orchestrator.runtime.backends import ensure_worker_image


@pytest.fixture(scope="session", autouse=True)
def current_worker_image() -> None:
    ensure_worker_image(quiet=True)
