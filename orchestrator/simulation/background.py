"""Background traffic in the flow-level simulation: the emulation's plan, replayed in simulated time.

The flows are the emulation's own (`orchestrator.scheduling.background_plan.plan_background`, which
the emulation's iperf3 background runs: the same pairs, demand matrix, rates and seed), and so are
their on/off processes (`background_plan.on_off_periods`, flow i seeded ``seed + i``, the same
number of periods). Nothing here is a copy of that plan: it is called.

What the background does to a task, as the emulation's links give it (`controller.htb`): a task's
class is served before the background's (better htb prio), and the background keeps only its
guaranteed share of the link (`controller.htb.BACKGROUND_SHARE`, given by the driver as `share`)
while a task wants the rest. So each flow is an activity along its path at its offered rate,
bounded by its part of that guarantee (`flow_plans`), on and off as its periods say: on a link,
max-min sharing then leaves the tasks the link less the background's guarantee, and the
background the rest when no task wants it. With the CPU model on, the background's bytes also
cost the software switch its per-byte-and-hop work, at the rate the background is offered (a
second activity per flow, through the switch's thread and the machine's cores): that is how a
background slows tasks on links it does not share with them.

What the scheduler is told (`SimBackground.view_mbps`) is the background flows' own traffic per
directed link, in the model's Mbit/s, as the emulated `BackgroundView` measures it from the
background's own flow entries (a pair's entries match both directions): each flow's frames on its
path (its rate over `TCP_PAYLOAD_SHARE`) and its ACKs on the way back (`ACK_WIRE_PER_PAYLOAD`),
never a task's traffic. For an on/off flow it is the long-run mean
(rate x mean_on / (mean_on + mean_off)), the expectation of the emulated view's window average.

This module must not start anything: it only computes.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.scheduling.background_plan import (
    ON_OFF_PERIODS,
    BackgroundConfig,
    BackgroundFlow,
    on_off_periods,
    plan_background,
)
from orchestrator.scheduling.cost import ACK_WIRE_PER_PAYLOAD, TCP_PAYLOAD_SHARE
from topologies.model import NetworkModel
from topologies.plan import EmulationPlan

DirectedLink = tuple[str, str]


@dataclass(frozen=True)
class SimBackground:
    """The background of one simulated run.

    Parameters
    ----------
    flows
        The emulation's planned flows (rates in emulated Mbit/s).
    cfg, seed
        The config's background section and seed (the on/off processes are drawn from them).
    bw_scale
        The emulation plan's scale (emulated Mbit/s per model Mbit/s).
    emulated_rates
        Whether the simulation's links run at the emulated rates (else at the model's capacities).
    share
        The background's guaranteed share of a link (the emulation's `controller.htb.BACKGROUND_SHARE`).
    """

    flows: tuple[BackgroundFlow, ...]
    cfg: BackgroundConfig
    seed: int
    bw_scale: float
    emulated_rates: bool
    share: float

    @classmethod
    def plan(cls, model: NetworkModel, plan: EmulationPlan, cfg: BackgroundConfig, *, topology: str, seed: int,
             emulated_rates: bool, share: float) -> SimBackground | None:
        """The emulation's background plan for this config (None when the background is off)."""
        if not cfg.enabled or cfg.load <= 0:
            return None
        flows = plan_background(model, plan, cfg, topology=topology, seed=seed)
        return cls(tuple(flows), cfg, seed, plan.bw_scale, emulated_rates, share)

    def routed(self, route: Callable[[str, str], Sequence[str]]) -> SimBackground:
        """The same flows on the paths the emulation's controller gives them (`route(src, dst)`):
        its background routes are its own (fewest hops), not the plan's delay paths that scaled
        the rates, and the simulation must load the links the emulated background loads."""
        flows = tuple(replace(f, path=tuple(route(f.src, f.dst))) for f in self.flows)
        return replace(self, flows=flows)

    @property
    def on_off(self) -> bool:
        return self.cfg.pattern == "poisson"

    def duty(self) -> float:
        """The share of time a flow is on, in the long run."""
        if not self.on_off:
            return 1.0
        return self.cfg.mean_on_s / (self.cfg.mean_on_s + self.cfg.mean_off_s)

    def view_mbps(self) -> dict[DirectedLink, float]:
        """What a scheduler is told: the background flows' own mean wire traffic per directed
        link, frames forward and ACKs back, in the model's Mbit/s (see the module docstring)."""
        out: dict[DirectedLink, float] = {}
        for f in self.flows:
            payload = f.rate_mbps / self.bw_scale * self.duty()
            for a, b in itertools.pairwise(f.path):
                out[(a, b)] = out.get((a, b), 0.0) + payload / TCP_PAYLOAD_SHARE
                out[(b, a)] = out.get((b, a), 0.0) + payload * ACK_WIRE_PER_PAYLOAD
        return out

    def sim_rate_mbps(self, flow: BackgroundFlow) -> float:
        """A flow's rate in the simulation's units (emulated or model Mbit/s)."""
        return flow.rate_mbps if self.emulated_rates else flow.rate_mbps / self.bw_scale

    def periods(self, index: int) -> list[tuple[float, float]] | None:
        """Flow `index`'s (on_s, off_s) periods, exactly the emulation's; None for a steady flow."""
        if not self.on_off:
            return None
        return on_off_periods(self.cfg, self.seed + index, ON_OFF_PERIODS)

    def to_spec(self) -> dict[str, Any]:
        """The engine's input: each flow's path, rate (simulation units) and on/off periods."""
        return {"share": self.share, "flows": [
            {"path": list(f.path), "rate_mbps": self.sim_rate_mbps(f), "periods": self.periods(i)}
            for i, f in enumerate(self.flows)]}


def flow_plans(bg: dict[str, Any], link_Bps: dict[DirectedLink, float], switch_ns_per_byte_hop: float
               ) -> list[dict[str, Any]]:
    """The engine's background activities for the spec section `bg` (see the module docstring).

    Per flow, a network activity along its path at its offered rate, bounded by its part of the
    background's guarantee: `share` of its slowest link, split evenly among the background flows
    on its most shared link (under htb's priorities a task leaves the background that much, no
    more). With `switch_ns_per_byte_hop` > 0 (the CPU model), also a CPU activity: the switch's
    work for the offered bytes over its hops, in ns of CPU per second. Both follow the flow's
    on/off periods (None: on all along).

    Parameters
    ----------
    link_Bps
        Each directed link's rate, bytes per second (the engine's units).
    """
    flows = bg["flows"]
    count: dict[DirectedLink, int] = {}
    for f in flows:
        for link in itertools.pairwise(f["path"]):
            count[(str(link[0]), str(link[1]))] = count.get((str(link[0]), str(link[1])), 0) + 1
    plans = []
    for f in flows:
        links = [(str(a), str(b)) for a, b in itertools.pairwise(f["path"])]
        offered = float(f["rate_mbps"]) * 1e6 / 8.0
        if not links or offered <= 0:
            continue
        guarantee = float(bg["share"]) * min(link_Bps[ln] for ln in links) / max(count[ln] for ln in links)
        plans.append({"kind": "net", "links": links, "rate_Bps": min(offered, guarantee), "periods": f["periods"]})
        if switch_ns_per_byte_hop > 0:
            plans.append({"kind": "cpu", "links": [], "rate_Bps": offered * len(links) * switch_ns_per_byte_hop,
                          "periods": f["periods"]})
    return plans
