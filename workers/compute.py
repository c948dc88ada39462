"""Emulated compute: a local's training lasts what its emulated site would take, not what the host does.

A round's training time in the emulated timeline is ``(train_s_per_round + train_s_per_example x
examples x epochs) / site_speed x time_dilation``: the task's modelled cost (seconds of one emulated
core per round, whatever its examples, and per example and epoch, as the experiment sets it:
counted from the model by default, `orchestrator.runtime.compute_model`), the site's emulated cores
(its ``cpu``, at most the role's training threads), and the emulation's time dilation. Real training still runs, for real accuracy: when it ends early, the local holds its
update until the modelled end (`hold`); when it overruns (the host is too small for what it
emulates), the round keeps the real time and the local logs ``train_overrun``, so that the run can
say the round did not measure the emulated site (docs/fidelity.md, "Fidelity").

With both figures 0 (``compute.timing: measured``) training takes what it takes.
This module imports no torch.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from workers.config import check_cost
from workers.events import now as events_clock
from workers.events import to_monotonic


@dataclass(frozen=True)
class TrainingCost:
    """A task's modelled training cost in seconds of one emulated core: per example and epoch, and
    per round (the fixed part). Both 0: not modelled. Raises ValueError unless finite and >= 0."""

    s_per_example: float = 0.0
    s_per_round: float = 0.0

    def __post_init__(self) -> None:
        for name in ("s_per_example", "s_per_round"):
            check_cost(name, getattr(self, name))

    @property
    def modelled(self) -> bool:
        return self.s_per_example > 0 or self.s_per_round > 0


#: No modelled compute: training takes what it takes on this host.
NOT_MODELLED = TrainingCost()


def modelled_s(train_s_per_example: float, examples: int, epochs: int, *, train_s_per_round: float,
               site_speed: float, time_dilation: float) -> float | None:
    """The wall seconds one round's training lasts on the emulated site; None when not modelled."""
    if (train_s_per_example <= 0 and train_s_per_round <= 0) or examples <= 0:
        return None
    return (train_s_per_round + train_s_per_example * examples * epochs) / site_speed * time_dilation


def hold(started_t: float, modelled: float | None, *, emit: Callable[..., float], round_: int,
         sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = events_clock) -> float:
    """Wait until `started_t` + `modelled` (the modelled end of training), or log ``train_overrun``
    when training already ran past it; the overrun in seconds (0 when none or not modelled).
    `started_t` and `clock` are the event clock's (`workers.events.now`)."""
    if modelled is None:
        return 0.0
    now = clock()
    end = started_t + modelled
    if now > end:
        emit("train_overrun", round=round_, real_s=now - started_t, modelled_s=modelled)
        return now - end
    while now < end:  # the engine thread would be training now: nothing else waits on it
        sleep(end - now)
        now = clock()
    return 0.0


def ready_since(started_t: float, modelled: float | None, overrun: float) -> float:
    """When a training's update was ready, on CLOCK_MONOTONIC (a sender's ``ready_at``): at its
    modelled end (`started_t` + `modelled`, the event clock's), which `hold` woke up a moment after
    (that moment is the host's); after an overrun, or where training is not modelled, now."""
    if modelled is None or overrun > 0:
        return time.monotonic()
    return min(time.monotonic(), to_monotonic(started_t + modelled))
