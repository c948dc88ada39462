"""`joint`: network and compute scheduling together, by the predicted round time.

The network-only schedulers pick a tree by what its links cost; a round of federated learning
also waits for the slowest local's training, and a local on a loaded site trains slower. `joint`
builds candidate trees (``mst``'s, ``spt``'s, ``steiner``'s with Kou and Mehlhorn, each with delay
and hop weights, and ``spff``'s unicast), and for the physical trees of ``spt`` and ``steiner``
variants that aggregate at every branch point with compute, at none (only G and the locals), or
at none of the loaded ones. It returns the candidate whose predicted round (`predict_round`) is
shortest; on a tie the earlier candidate, so on an idle network it keeps ``mst``'s tree unless
another is strictly faster.

The prediction (`predict_round`) is a critical path over the overlay tree, in seconds:

- broadcast: ``arrival(child) = arrival(parent) + t(e)`` along the broadcast edges from G;
- a local trains once its model arrived: ``ready(i) = arrival(i) + train(i)``;
- upload: the inputs of node n are ``ready(n)`` if n trains and ``done(c) + t(c -> n)`` for each
  upload child c; ``done(n) = max(last input, first input + aggregate(n))``, since n aggregates
  chunk by chunk as its inputs arrive (`workers.rounds`); the round ends at ``done(G)``;

with ``t(e)`` cost.py's store-and-forward time of an overlay edge (`cost.overlay_edge_s`): the
model's bits through each link at the rate the task gets there, shared by its copies on that link,
plus propagation. The rate a task gets on a link is what the link has not reserved for others
(its reserved share `demand_mbps` at least: the shaping lets a task borrow what is idle), so
link load slows a path. With equal training everywhere this is the slowest local's training plus
the communication of its branch; with loaded sites, a slow local on a short branch can finish no
later than a fast one on a long branch, which is the trade the network-only schedulers miss.

Training and aggregation times come from a `TrainingProfile` (CPU seconds per round, per example
and per MB aggregated, measured once per model by `orchestrator.runtime.profiles`) and the sites' load
(`NetworkState.cpu_share`, the task's own roles included): ``train(i) = (cpu_s_per_round +
cpu_s_per_example * examples(i)) / share(i)`` with the round's examples split evenly over the
locals, as the emulation models a site's training (`workers.compute`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.scheduling.base import (
    Scheduler,
    WeightName,
    broadcast_edges_from,
    overlay_from_physical_tree,
    tree_schedule,
    upload_edges_from,
)
from orchestrator.scheduling.cost import link_copies, overlay_edge_s
from orchestrator.scheduling.mst import MST
from orchestrator.scheduling.pipelined import RateFn
from orchestrator.scheduling.schedule import Schedule
from orchestrator.scheduling.spff import SPFF
from orchestrator.scheduling.state import AGGREGATE_CPU, TRAIN_CPU, NetworkState, compute_demand
from orchestrator.scheduling.tasks import Task
from orchestrator.scheduling.trees import SPT, Steiner
from topologies.model import NetworkModel

#: CPU seconds per training example of the default model (``mlp`` on ``digits``, one thread), as
#: `orchestrator.runtime.profiles` measured it on the development machine: a `Joint` built without a
#: profile predicts with these figures, unless an experiment gives it its task's modelled training
#: (`orchestrator.runtime.compute_model.with_training`; `profile_given` says which).
DEFAULT_TRAIN_CPU_S_PER_EXAMPLE = 7e-6
#: CPU seconds a local's round of training costs whatever its examples (set-up, the partial batch's
#: step, the training thread): `orchestrator.runtime.profiles` measured mostly 0.64-1.06 ms for the
#: mlp on digits on a 2-core machine shared with other work (docs/fidelity.md, "Fidelity").
DEFAULT_TRAIN_CPU_S_PER_ROUND = 8e-4
#: Training examples per round of the default task: the 1,438 of ``digits``' training split,
#: ``local_epochs`` = 2 times, split over the locals.
DEFAULT_EXAMPLES_PER_ROUND = 2 * 1438
#: CPU seconds to add one child's update of 1 MB into an aggregate (measured as above).
DEFAULT_AGGREGATE_CPU_S_PER_MB = 2.4e-3


@dataclass(frozen=True)
class TrainingProfile:
    """What one round of a task costs in CPU, independent of where it runs.

    Attributes
    ----------
    train_cpu_s_per_example
        CPU seconds to train on one example (one core, the workers' model code).
    train_cpu_s_per_round
        CPU seconds a local's round of training costs whatever its examples (the fixed part).
    examples_per_round
        Examples the task trains on per round, all locals together (split evenly among them).
    aggregate_cpu_s_per_mb
        CPU seconds to add one child's update of 1 MB (1e6 bytes) into an aggregate.
    """

    train_cpu_s_per_example: float = DEFAULT_TRAIN_CPU_S_PER_EXAMPLE
    train_cpu_s_per_round: float = DEFAULT_TRAIN_CPU_S_PER_ROUND
    examples_per_round: int = DEFAULT_EXAMPLES_PER_ROUND
    aggregate_cpu_s_per_mb: float = DEFAULT_AGGREGATE_CPU_S_PER_MB

    def __post_init__(self) -> None:
        for name in ("train_cpu_s_per_example", "train_cpu_s_per_round", "aggregate_cpu_s_per_mb"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if isinstance(self.examples_per_round, bool) or not isinstance(self.examples_per_round, int) \
                or self.examples_per_round <= 0:
            raise ValueError(f"examples_per_round must be a positive integer, got {self.examples_per_round!r}")

    def train_cpu_s(self, locals_: int) -> float:
        """CPU seconds of one local's training per round when `locals_` locals share the examples:
        the round's fixed cost and its share of the examples."""
        return self.train_cpu_s_per_round + self.train_cpu_s_per_example * self.examples_per_round / max(1, locals_)


@dataclass(frozen=True)
class RoundPrediction:
    """Predicted time of one round of a schedule (see the module docstring), in seconds."""

    round_s: float
    #: Training time of every local, given its site's load.
    train_s: Mapping[str, float] = field(default_factory=dict)
    #: When the broadcast's model is whole at each overlay node.
    arrival_s: Mapping[str, float] = field(default_factory=dict)
    #: Aggregation work at each aggregating node (its children's updates and its own), given its
    #: site's load.
    aggregate_s: Mapping[str, float] = field(default_factory=dict)

    @property
    def slowest_train_s(self) -> float:
        return max(self.train_s.values(), default=0.0)


def predict_round(
    state: NetworkState, task: Task, schedule: Schedule, profile: TrainingProfile | None = None, *,
    site_load: bool = True,
) -> RoundPrediction:
    """Predicted round time of `schedule` on `state` (the task not yet admitted there).
    `site_load=False` predicts as if every site were idle (the network alone).

    Raises
    ------
    ValueError
        If the schedule is blocked or its edges do not form trees from G.
    """
    if schedule.blocked:
        raise ValueError(f"task {schedule.task_id} is blocked: it has no round to predict")
    profile = profile or TrainingProfile()
    model = state.model
    own = compute_demand(schedule)

    def share(site: str) -> float:
        if not site_load:
            return 1.0
        s = state.cpu_share(site, own.get(site, 0.0))
        return s if s > 0 else 1e-9

    def rate(u: str, v: str) -> float:
        return max(schedule.demand_mbps, state.residual_mbps(u, v))

    train_cpu = profile.train_cpu_s(len(schedule.local_sites))
    train = {i: train_cpu / (TRAIN_CPU * share(i)) for i in schedule.local_sites}
    mb = task.model_bytes / 1e6
    children: dict[str, list[str]] = {}
    for child, parent in schedule.upload_parent.items():
        children.setdefault(parent, []).append(child)
    aggregate = {  # a local that aggregates adds its own update too
        n: profile.aggregate_cpu_s_per_mb * mb * (len(kids) + (n in train)) / share(n) for n, kids in children.items()
    }

    arrival = _broadcast_arrival(model, schedule, task.model_bytes, rate)
    round_s = _upload_done(model, schedule, task.model_bytes, rate, children,
                           start={i: arrival.get(i, 0.0) + t for i, t in train.items()}, aggregate=aggregate)
    return RoundPrediction(round_s=round_s, train_s=train, arrival_s=arrival, aggregate_s=aggregate)


def _broadcast_arrival(model: NetworkModel, schedule: Schedule, model_bytes: int, rate: RateFn) -> dict[str, float]:
    """When each node of the broadcast tree holds the whole model (store and forward), from G at 0."""
    copies = link_copies(schedule, "broadcast")
    arrival = {schedule.global_site: 0.0}
    pending = list(schedule.edges_of("broadcast"))
    while pending:
        ready = [e for e in pending if e.src in arrival]
        if not ready:
            raise ValueError(f"task {schedule.task_id}: broadcast edges do not form a tree from G")
        for e in ready:
            arrival[e.dst] = arrival[e.src] + overlay_edge_s(model, e, copies, model_bytes, rate=rate)
            pending.remove(e)
    return arrival


def _upload_done(model: NetworkModel, schedule: Schedule, model_bytes: int, rate: RateFn,
                 children: dict[str, list[str]], *, start: dict[str, float], aggregate: dict[str, float]) -> float:
    """When G holds the round's aggregate: each node's own update is ready at `start` (a local's
    arrival + training), its children's arrive over the upload edges, and it aggregates them."""
    copies = link_copies(schedule, "upload")
    into = {e.src: e for e in schedule.edges_of("upload")}
    done: dict[str, float] = {}

    def finish(node: str, depth: int = 0) -> float:
        if node in done:
            return done[node]
        if depth > len(into) + 1:
            raise ValueError(f"task {schedule.task_id}: upload edges contain a cycle")
        inputs = [start[node]] if node in start else []
        for c in children.get(node, []):
            inputs.append(finish(c, depth + 1) + overlay_edge_s(model, into[c], copies, model_bytes, rate=rate))
        # Aggregation runs chunk by chunk as the inputs arrive: it ends no earlier than the last
        # input, nor than its whole work after the first input is there.
        done[node] = max(max(inputs, default=0.0), min(inputs, default=0.0) + aggregate.get(node, 0.0))
        return done[node]

    return finish(schedule.global_site)


def _physical_parent(schedule: Schedule) -> dict[str, str]:
    """The physical tree (node -> parent) under a tree schedule's broadcast edges."""
    parent: dict[str, str] = {}
    for e in schedule.edges_of("broadcast"):
        for p, c in zip(e.path, e.path[1:], strict=False):
            parent[c] = p
    return parent


class Joint(Scheduler):
    """The candidate tree with the shortest predicted round, given link and site load.

    Parameters
    ----------
    weight
        ``delay`` (default): candidates with their own weights (``mst``'s auxiliary weights, delay
        for ``spt`` and ``steiner``) and with hop weights; ``hops``: hop-weighted candidates only.
    profile
        The task's `TrainingProfile` (default: the defaults of `TrainingProfile`).
    site_load
        False: predict as if every site were idle, i.e. pick by the network alone (a baseline
        that shows what weighing the sites' load adds).
    """

    name = "joint"

    def __init__(
        self, *, weight: WeightName = "delay", profile: TrainingProfile | None = None, site_load: bool = True
    ) -> None:
        if weight not in ("delay", "hops"):
            raise ValueError(f"unknown weight {weight!r}: use 'delay' or 'hops'")
        if profile is not None and not isinstance(profile, TrainingProfile):
            raise ValueError(f"profile must be a TrainingProfile, got {type(profile).__name__}")
        self.weight: WeightName = weight
        self.profile = profile or TrainingProfile()
        #: Whether `profile` was given (else an experiment may set its task's, `with_training`).
        self.profile_given = profile is not None
        self.site_load = bool(site_load)
        hops_only = weight == "hops"
        self.candidates: list[Scheduler] = [
            *([] if hops_only else [MST()]), MST(weight="hops"),
            *([] if hops_only else [SPT(), Steiner(), Steiner(method="mehlhorn")]),
            SPT(weight="hops"), Steiner(weight="hops"), Steiner(weight="hops", method="mehlhorn"),
            *([] if hops_only else [SPFF()]), SPFF(weight="hops"),
        ]

    def options(self, state: NetworkState, task: Task) -> list[Schedule]:
        """Every candidate schedule that is not blocked, in the order ties are settled (first wins);
        or the first blocked one alone when every candidate is blocked."""
        out: list[Schedule] = []
        blocked: Schedule | None = None
        seen: set[tuple[object, ...]] = set()
        for scheduler in self.candidates:
            s = scheduler.schedule(state, task)
            if s.blocked:
                blocked = blocked or s
                continue
            variants = [s]
            if isinstance(scheduler, (SPT, Steiner)):
                variants += self._aggregation_variants(state, task, s)
            for v in variants:
                key = (tuple(sorted(v.broadcast_parent.items())), tuple(sorted(v.upload_parent.items())),
                       tuple(sorted((e.procedure, e.src, e.dst, e.path) for e in v.edges)))
                if key not in seen:
                    seen.add(key)
                    out.append(v)
        return out if out or blocked is None else [blocked]

    def _aggregation_variants(self, state: NetworkState, task: Task, s: Schedule) -> list[Schedule]:
        """The same physical tree aggregating at no branch point, or at none that is loaded."""
        parent = _physical_parent(s)
        terminals = set(task.terminals)
        branch = {p for p in parent.values() if p not in terminals}
        loaded = frozenset(n for n in branch if state.cpu_share(n, AGGREGATE_CPU) < 1.0)
        out = []
        for exclude in (frozenset(branch), loaded):
            if not exclude:
                continue
            overlay = overlay_from_physical_tree(state, task, parent, exclude=exclude)
            v = tree_schedule(name=s.scheduler, state=state, task=task,
                              broadcast=broadcast_edges_from(overlay), upload=upload_edges_from(overlay))
            if not v.blocked:
                out.append(v)
        return out

    def _schedule(self, state: NetworkState, task: Task) -> Schedule:
        best: Schedule | None = None
        best_s = math.inf
        for s in self.options(state, task):
            if s.blocked:
                return Schedule.blocked_for(task, self.name, s.reason)
            t = predict_round(state, task, s, self.profile, site_load=self.site_load).round_s
            if t < best_s * (1 - 1e-9):
                best, best_s = s, t
        assert best is not None
        return dataclasses.replace(best, scheduler=self.name)
