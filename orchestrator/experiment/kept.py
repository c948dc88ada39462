"""The last trial's emulation, kept up for the run that goes on at its K (``time_dilation: auto``).

A trial (`orchestrator.experiment.calibration`) judges one emulation: the switches, controller and
site servers one bring-up made. Bringing the run up again afterwards cost a bring-up (about 20 s of
wall time at paper.yaml's 14 sites) and measured another emulation than the one judged: in
paper.yaml's sweep of 2026-11-30 the same task's relay chains carried 1.4 % of a round in its
5-locals trial and 5.8 % in the run brought up after it (docs/fidelity.md, "Choosing K"). So each
trial runs on an emulation of its own, brought up here (`KeptEmulation.bring_up`, the one before
torn down first: one is up at a time), and the run at the K chosen takes the last one if that
trial was faithful at that K (`KeptEmulation.take`; the runner tears down a cap's trial that was
not: what failed there stays with its emulation), else brings up its own. The run's sessions then record
no bring-up of their own (`SessionEnd.reused`).

This module owns the kept emulation's lifetime; it runs no trial and no session.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from orchestrator.experiment.session import Hosting


class KeptEmulation:
    """At most one emulation up between trials and the run: the last trial's, at its K. Torn down by
    `close` (on every exit path of its owner: use it as a context manager)."""

    def __init__(self) -> None:
        self.k: float | None = None
        self.hosting: Hosting | None = None
        self._stack: contextlib.ExitStack | None = None

    def bring_up(self, k: float, make: Callable[[], AbstractContextManager[Hosting]]) -> Hosting:
        """The emulation `make` brings up, for a trial at K = `k` (the one kept before torn down first)."""
        self.close()
        with contextlib.ExitStack() as stack:
            hosting = stack.enter_context(make())
            self._stack, self.hosting, self.k = stack.pop_all(), hosting, k
        return hosting

    def take(self, k: float) -> Hosting | None:
        """The emulation kept at K = `k` for the run to go on on; None when there is none at that K
        (one at another K is torn down: the run brings up its own)."""
        if self.hosting is not None and self.k == k:
            return self.hosting
        self.close()
        return None

    def close(self) -> None:
        """Tear the kept emulation down, if there is one."""
        stack, self._stack, self.hosting, self.k = self._stack, None, None, None
        if stack is not None:
            stack.close()

    def __enter__(self) -> KeptEmulation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def fresh_dir(base: Path) -> Path:
    """`base`, or `base`-2, -3, ... : the first that does not exist, created (a trial's emulation's logs
    never meet an earlier one's, e.g. a resumed run's trials at the same K)."""
    path, n = base, 1
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")
