"""Time dilation on the records: every duration the core records is in emulated time.

Under a dilation K (`EmulationPlan.dilated`) the emulated network and the modelled sites run K times
slower than the time they emulate. The run's clock (`RunClock` with ``dilation=K``) already reads
emulated seconds; what the roles measure as differences of their own time stamps (a round's latency
and its parts, set-up figures, overruns) is divided by K by the core (`Lifecycle`'s ``dilation``)
before it computes a round's bounds (which take the round's own training) and records anything.
The bounds' transfers are on the undilated rates (`ControllerNetwork.rate`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from typing import Any

#: Set-up figures measured by the roles in wall seconds (the rest are computed in emulated time).
MEASURED_SETUP_S = ("agents_ready_s", "connect_s")


def undilate_round(r: Any, k: float) -> Any:
    """A round's result with every duration (a float field named ``*_s``) divided by `k`."""
    return replace(r, **{f.name: getattr(r, f.name) / k for f in fields(r)
                         if f.name.endswith("_s") and isinstance(getattr(r, f.name), float)})


def undilate_setup(figures: dict[str, Any], k: float) -> dict[str, Any]:
    """Set-up figures with those the roles measured in wall seconds divided by `k`."""
    return {name: (v / k if name in MEASURED_SETUP_S and isinstance(v, float) else v) for name, v in figures.items()}


def undilate_overruns(overruns: Sequence[dict[str, Any]], k: float) -> list[dict[str, Any]]:
    """Training overruns with their real and modelled seconds divided by `k`."""
    return [o | {"real_s": o["real_s"] / k, "modelled_s": o["modelled_s"] / k} for o in overruns]
