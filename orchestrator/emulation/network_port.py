"""The lifecycle's network port on a live emulation: the controller installs and removes a task's
paths and counts its bytes (`orchestrator.lifecycle.ports.NetworkPort`).

One class serves both a network this process brought up (`orchestrator.emulation.network.Emulation`)
and a running network a later command attaches to (`orchestrator.emulation.running.RunningNetwork`):
both are a controller client and the plan's bandwidth scale. The background a scheduler sees is the
background generators' own traffic (`orchestrator.emulation.background_view`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from controller.htb import burst_bytes
from orchestrator.emulation.background_view import BackgroundView
from orchestrator.emulation.task_paths import task_paths
from orchestrator.scheduling import NetworkState, Schedule
from orchestrator.scheduling.cost import TCP_PAYLOAD_SHARE, emulated_rate
from topologies.plan import EmulationPlan

#: Open vSwitch refreshes flow counters about once a second: two reads this far apart that agree are final.
COUNTER_SETTLE_S = 1.2
#: The tc datapath's counters are exact when read: two reads this far apart that agree are final.
LIVE_COUNTER_SETTLE_S = 0.2


def measured_background(view: BackgroundView, key: int | None) -> dict[tuple[str, str], float]:
    """The background generators' own load per directed link (model Mbit/s) that `view` hands out
    for `key`: measured once it has settled, and the same for every scheduler of the task `key`
    (`orchestrator.emulation.background_view`). No task's traffic is in it, running or ended."""
    return dict(view.for_task(key).mbps)


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
    background_view
        What measures it (default: a `BackgroundView` of `client` with the default settings).
    background_per_task
        Measure once per task, so that every scheduler of a task sees the same (the sequential
        mode); False: at each ask, a recent measurement reused (the online mode, where each
        scheduler's trace must wait alike).

    Under time dilation (``plan.time_dilation`` K) `rate` is the undilated rate (the shaped one times
    K): the core's bounds are in emulated time, as its records are.
    """

    def __init__(self, client: Any, plan: EmulationPlan, *, delay_emulated: bool,
                 install_ids: Iterator[int] | None = None, measure_background: bool = True,
                 background_view: BackgroundView | None = None, background_per_task: bool = True,
                 live_counters: bool = False, paced: bool = False) -> None:
        self.client = client
        self.plan = plan
        self.delay_emulated = delay_emulated
        shaped, k = emulated_rate(plan), plan.time_dilation
        self.rate = shaped if k == 1 else (lambda a, b: shaped(a, b) * k)
        self.counter_settle_s = LIVE_COUNTER_SETTLE_S if live_counters else COUNTER_SETTLE_S
        self.payload_share = TCP_PAYLOAD_SHARE  # htb counts Ethernet frames
        # The class's burst, at the dilated rate; none where the senders pace their copies at the
        # link's rate (workers/pacing.py): a paced copy finds the bucket full and crosses at the rate.
        self.link_burst_bytes = (lambda a, b: 0) if paced else (lambda a, b: burst_bytes(shaped(a, b)))
        self._ids = install_ids if install_ids is not None else itertools.count(1)
        self._measure = measure_background
        self.background_view = background_view or BackgroundView(client, plan)
        self._per_task = background_per_task
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

    def background(self, state: NetworkState, task_id: int | None = None) -> dict[tuple[str, str], float] | None:
        """The background's own load per link (`measured_background`), for the task `task_id`
        when measured per task; running tasks are not in it (their reservations count for them).
        None while the controller does not answer (it restarts), so that the state's last
        background stands."""
        if not self._measure:
            return None
        try:
            return measured_background(self.background_view, task_id if self._per_task else None)
        except Exception:  # noqa: BLE001 -- the controller restarts: keep what was last measured
            return None
