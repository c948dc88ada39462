"""The lifecycle's network port on a live emulation: the controller installs and removes a task's
paths and counts its bytes (`orchestrator.lifecycle.ports.NetworkPort`).

One class serves both a network this process brought up (`orchestrator.emulation.network.Emulation`)
and a running network a later command attaches to (`orchestrator.emulation.running.RunningNetwork`):
both are a controller client and the plan's bandwidth scale.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from orchestrator.emulation.task_paths import task_paths
from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.cost import emulated_rate
from topologies.plan import EmulationPlan

#: Open vSwitch refreshes flow counters about once a second: two reads this far apart that agree are final.
COUNTER_SETTLE_S = 1.2


def measured_background(client: Any, plan: EmulationPlan) -> dict[tuple[str, str], float]:
    """Current load per directed link from the controller's port statistics, in model units."""
    loads: dict[tuple[str, str], float] = {}
    for link in client.link_stats():
        try:
            (a, b), rate = link["link"], float(link["rate_mbps"])
        except (KeyError, TypeError, ValueError):
            continue
        loads[(str(a), str(b))] = rate / plan.bw_scale
    return loads


class ControllerNetwork:
    """`NetworkPort` through the controller's REST client.

    Parameters
    ----------
    client
        The controller client (`orchestrator.emulation.controller_client.ControllerClient`).
    plan
        The emulation plan (its ``bw_scale`` turns model Mbit/s into emulated ones).
    delay_emulated
        Whether the links carry their propagation delay (netem).
    install_ids
        The install ids to hand out (default 1, 2, ...).
    measure_background
        Whether `background` measures the load (an experiment); False: the state the driver built
        stands (an attached task sees the installed tasks' reservations).

    Under time dilation (``plan.time_dilation`` K) `rate` is the undilated rate (the shaped one times
    K): the core's bounds are in emulated time, as its records are.
    """

    def __init__(self, client: Any, plan: EmulationPlan, *, delay_emulated: bool,
                 install_ids: Iterator[int] | None = None, measure_background: bool = True) -> None:
        self.client = client
        self.plan = plan
        self.delay_emulated = delay_emulated
        shaped, k = emulated_rate(plan), plan.time_dilation
        self.rate = shaped if k == 1 else (lambda a, b: shaped(a, b) * k)
        self.counter_settle_s = COUNTER_SETTLE_S
        self._ids = install_ids if install_ids is not None else itertools.count(1)
        self._measure = measure_background
        #: The controller's reply to the last install (its reservation: enforced, and why not).
        self.last_install: dict[str, Any] = {}

    def new_install_id(self) -> int:
        return next(self._ids)

    def install(self, wire: Schedule) -> bool:
        installed = self.last_install = self.client.install_task(task_paths(wire, bw_scale=self.plan.bw_scale))
        return bool(installed.get("reservation", {}).get("enforced"))

    def remove(self, install_id: int) -> None:
        self.client.remove_task(install_id)

    def task_bytes(self, install_id: int) -> int:
        return int(self.client.task_bytes(install_id))

    def background(self, state: NetworkState) -> dict[tuple[str, str], float] | None:
        """Measured load per link less the reservations the state already holds there (the running
        tasks' traffic is counted by their reservations, not twice); None while the controller does
        not answer (it restarts), so that the state's last background stands."""
        if not self._measure:
            return None
        try:
            measured = measured_background(self.client, self.plan)
        except Exception:  # noqa: BLE001 -- the controller restarts: keep what was last measured
            return None
        return {k: max(0.0, v - state.ai_mbps(*k)) for k, v in measured.items()}

