"""The schedulers every property suite runs on: the registered ones and the example plugin
(examples/schedulers/widest_path.py), loaded through the same resolver a config or the CLI uses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from orchestrator.scheduling import SCHEDULERS, Scheduler, resolve_scheduler

ROOT = Path(__file__).resolve().parents[2]
#: The example plugin's file spec, relative to the repository's root.
EXAMPLE_PLUGIN = "examples/schedulers/widest_path.py:WidestPath"
#: Every registered scheduler's name, then the example plugin's spec.
ALL_SCHEDULERS = [*sorted(SCHEDULERS), EXAMPLE_PLUGIN]


def make_scheduler(spec: str, **options: Any) -> Scheduler:
    """The scheduler a spec names (a file spec relative to the repository), with `options`."""
    return resolve_scheduler({"spec": spec, "options": options}, ROOT).build()
