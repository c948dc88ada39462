"""A far machine lost mid-run (docs/cluster.md, "Losing a machine").

A server of the cluster on another machine that stops answering (`Emulation.lost_sites`: its
controller forward ended and a fresh SSH connection to it fails) takes its sites' switches and
hosts with it: every link of those sites is down from then on. `MachineWatch` reports those links
to the `LinkWatcher` (``also_down``), so that the lifecycle's policy treats them as cuts
(`orchestrator.lifecycle.policy.links_changed`): a running task whose paths cross one fails
(policy ``never``, which the sequential mode uses) or moves (online: its rescheduling policy), and
every later schedule is made without them (the lost sites fall out of G's part of the network, and
a task with a local there is blocked). Each lost machine is recorded once in the ``faults`` table
(action ``machine_lost``), and a run that lost a machine ends ``failed`` (`lost_note`): the network
it measured was not the configured one from then on.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

from orchestrator.emulation.cluster_far import LOOK_PERIOD_S
from orchestrator.lifecycle.ports import Link
from topologies.plan import EmulationPlan

LOG = logging.getLogger("netai.cluster")


def links_of(plan: EmulationPlan, sites: Iterable[str]) -> set[Link]:
    """Every link (sorted site pair) with an end at one of `sites`."""
    at = set(sites)
    return {(min(ln.a, ln.b), max(ln.a, ln.b)) for ln in plan.links if ln.a in at or ln.b in at}


class MachineWatch:
    """The links of the sites on far machines lost so far (see the module docstring).

    `record` is called once per lost machine with the fault's fields (``at_s`` on the run's clock,
    from `clock`); `label` is the label its row is recorded under (the driver sets it). `on_lost`,
    when given, is told the machine's sites and why (the site servers there are lost with it). The
    machines are looked at every `period_s` at most (`LOOK_PERIOD_S`, part of the design that finds a
    lost machine within `cluster_far.LOST_TIMEOUT_S`), on `monotonic`'s clock.
    """

    def __init__(self, emu: Any, plan: EmulationPlan, record: Callable[..., None], clock: Callable[[], float],
                 *, period_s: float = LOOK_PERIOD_S, on_lost: Callable[[list[str], str], None] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.emu, self.plan, self.record, self.clock, self.period_s = emu, plan, record, clock, period_s
        self.on_lost, self.monotonic = on_lost, monotonic
        self.label = ""
        #: Lost server -> its sites.
        self.servers: dict[str, list[str]] = {}
        self._links: set[Link] = set()
        self._read = -math.inf
        self._settle = False

    def refresh(self) -> None:
        """Look at the machines again on the next `links`, waiting for a machine being asked whether it
        still answers (before a task is admitted: a site server there may have been found gone before
        the machine was, and the task is to be scheduled knowing)."""
        self._read = -math.inf
        self._settle = True

    def links(self) -> set[Link]:
        """The links down because their machine is lost (looked at again at most every `period_s`)."""
        now = self.monotonic()
        if now - self._read < self.period_s:
            return set(self._links)
        self._read = now
        lost = self.emu.lost_sites(settle=self._settle)
        self._settle = False
        for server in sorted(set(lost.values()) - set(self.servers)):
            sites = sorted(s for s, srv in lost.items() if srv == server)
            self.servers[server] = sites
            cut = links_of(self.plan, sites)
            LOG.error("machine %s lost: its sites %s are gone, %d links down", server, ", ".join(sites), len(cut))
            self.record(self.label, at_s=self.clock(), action="machine_lost", target=server, ok=True,
                        detail=f"sites {', '.join(sites)}; {len(cut)} links down")
            if self.on_lost is not None:
                self.on_lost(sites, f"its machine {server} was lost")
        self._links = links_of(self.plan, lost)
        return set(self._links)


def machine_watch(emu: Any, plan: EmulationPlan, record: Callable[..., None], clock: Callable[[], float],
                  on_lost: Callable[[list[str], str], None] | None = None) -> MachineWatch | None:
    """A `MachineWatch` for an emulation with servers on other machines; None otherwise."""
    info = getattr(emu, "info", None)
    if info is None or "far" not in getattr(info, "cluster", {}):
        return None
    return MachineWatch(emu, plan, record, clock, on_lost=on_lost)


def lost_note(emu: Any) -> str:
    """Why a run that lost a far machine did not measure the configured network ("" if none was lost)."""
    info = getattr(emu, "info", None)
    lost = (getattr(info, "cluster", None) or {}).get("far", {}).get("lost", [])
    return f"machine(s) lost during the run: {', '.join(lost)}" if lost else ""
