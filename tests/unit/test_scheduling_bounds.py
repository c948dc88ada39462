"""The cost model's figures against an exact event simulation of ideal executions.

`simulate_s` runs one procedure of a schedule chunk by chunk: every overlay edge is a stream of
chunks along its physical path; each directed link sends the chunks waiting at its tail one at a
time at its rate, first come first served, and a chunk reaches the far end the link's
propagation delay later. A node forwards chunk k of the broadcast as soon as it holds all of
chunk k; an upload aggregator sends chunk k once it holds chunk k of every child (a local also
has its own update from the start). One chunk per edge is store-and-forward at every hop; many
small chunks approach cut-through. The simulation is event-driven and exact: no clock, no steps.

The pipelined bound must never exceed any such execution; the tests check it on hand-made
counterexamples to the former formula and, with hypothesis, on random networks, on the real
schedulers' schedules and on random hand-built ones (relays, walks that revisit links).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
from dataclasses import replace
from typing import Any

import networkx as nx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.scheduling import NetworkState, OverlayEdge, Procedure, Schedule, get_scheduler
from orchestrator.scheduling.cost import (
    link_copies,
    procedure_bound_s,
    reference_s,
    round_figures,
    round_lower_bound,
    store_and_forward_s,
)
from orchestrator.scheduling.pipelined import (
    CopyWindow,
    RateFn,
    capacity_rate,
    copy_windows,
    pipelined_bound_s,
)
from orchestrator.scheduling.schedule import DirectedLink
from orchestrator.scheduling.tasks import Task
from tests.unit.plugin_schedulers import ALL_SCHEDULERS, make_scheduler
from topologies.model import NetworkModel

SLACK = 1e-9  # relative: the bound and the simulation add the same delays in other orders
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MB_12_5 = 12_500_000  # bytes: 100 Mbit


def simulate_s(model: NetworkModel, schedule: Schedule, procedure: Procedure, model_bytes: int,
               **options: Any) -> float:
    """Completion time of one procedure of `schedule` in the ideal chunked execution: seconds until
    every local holds the whole model (broadcast) or G holds every chunk of the aggregate (upload).
    `options` are `simulate_nodes`' (``chunks``, ``rate``, ``propagation``, ...)."""
    finish = simulate_nodes(model, schedule, procedure, model_bytes, **options)
    needed = schedule.local_sites if procedure == "broadcast" else (schedule.global_site,)
    assert all(n in finish for n in needed), f"{procedure}: some site never got the model"
    return max(finish[n] for n in needed)


def simulate_nodes(
    model: NetworkModel,
    schedule: Schedule,
    procedure: Procedure,
    model_bytes: int,
    *,
    chunks: int,
    rate: RateFn | None = None,
    propagation: bool = True,
    release: dict[str, float] | None = None,
    whole_copies: bool = False,
) -> dict[str, float]:
    """The ideal chunked execution of one procedure of `schedule`, per node: when each node held the
    whole model (broadcast) or G the whole aggregate (upload).

    Parameters
    ----------
    chunks
        Chunks per model copy, all of the same size.
    rate
        Mbit/s of each directed link; the links' capacities by default.
    propagation
        Whether a chunk takes the link's propagation delay to reach its far end.
    release
        Upload only: each local's own update exists from its release time on (training ended)
        instead of from the start.
    whole_copies
        Broadcast only: G queues its copies whole one after another (as the agents' lanes do)
        instead of chunk by chunk in turn.
    """
    rate = rate or capacity_rate(model)
    chunk_bits = model_bytes * 8.0 / chunks
    edges = schedule.edges_of(procedure)
    hops = [e.links() for e in edges]
    out_of: dict[str, list[int]] = {}
    into: dict[str, list[int]] = {}
    for i, e in enumerate(edges):
        out_of.setdefault(e.src, []).append(i)
        into.setdefault(e.dst, []).append(i)
    Item = tuple[int, int, int]  # (edge index, hop index on its path, chunk index)
    # (time, order, kind, item): kind SENT (a link finished sending), ARRIVED (at the far end), or
    # RELEASED (a local's update exists; item[0] indexes `released`)
    SENT, ARRIVED, RELEASED = 0, 1, 2
    events: list[tuple[float, int, int, Item]] = []
    order = itertools.count()
    waiting: dict[DirectedLink, deque[Item]] = {}
    busy: set[DirectedLink] = set()
    have: dict[tuple[str, int], int] = {}  # (node, chunk) -> contributions received
    finish: dict[str, float] = {}
    released = sorted(release or {})

    def serve(t: float, link: DirectedLink) -> None:
        queue = waiting.get(link)
        if not queue:
            busy.discard(link)
            return
        busy.add(link)
        heapq.heappush(events, (t + chunk_bits / (rate(*link) * 1e6), next(order), SENT, queue.popleft()))

    def at_tail(t: float, item: Item) -> None:
        link = hops[item[0]][item[1]]
        waiting.setdefault(link, deque()).append(item)
        if link not in busy:
            serve(t, link)

    def holds(t: float, node: str, k: int) -> None:
        """`node` holds chunk k of what it sends on (the model, or its aggregate)."""
        if procedure == "upload" and node == schedule.global_site:
            finish[node] = max(finish.get(node, 0.0), t)
        for f in out_of.get(node, []):
            at_tail(t, (f, 0, k))

    def contributed(t: float, node: str, k: int) -> None:
        have[(node, k)] = have.get((node, k), 0) + 1
        if have[(node, k)] == len(into.get(node, ())) + (node in (release or {})):
            holds(t, node, k)

    def delivered(t: float, edge: int, k: int) -> None:
        node = edges[edge].dst
        if procedure == "broadcast":
            finish[node] = max(finish.get(node, 0.0), t)
            holds(t, node, k)
            return
        contributed(t, node, k)

    if whole_copies:
        assert procedure == "broadcast"
        for f in out_of.get(schedule.global_site, []):
            for k in range(chunks):
                at_tail(0.0, (f, 0, k))
    elif release is None:
        senders = [schedule.global_site] if procedure == "broadcast" else [n for n in out_of if n not in into]
        for k in range(chunks):  # round robin over the streams a node starts at time 0
            for node in senders:
                holds(0.0, node, k)
    else:
        assert procedure == "upload"
        for i, node in enumerate(released):
            heapq.heappush(events, (release[node], next(order), RELEASED, (i, 0, 0)))
    while events:
        t, _, kind, (edge, hop, k) = heapq.heappop(events)
        if kind == RELEASED:
            for k in range(chunks):
                contributed(t, released[edge], k)
            continue
        link = hops[edge][hop]
        if kind == SENT:
            serve(t, link)
            delay_s = model.link(*link).delay_ms / 1e3 if propagation else 0.0
            heapq.heappush(events, (t + delay_s, next(order), ARRIVED, (edge, hop, k)))
        elif hop + 1 < len(hops[edge]):
            at_tail(t, (edge, hop + 1, k))
        else:
            delivered(t, edge, k)
    return finish


def simulate_round_s(
    model: NetworkModel, schedule: Schedule, model_bytes: int, *, chunks: int, train_s: float,
    rate: RateFn | None = None, propagation: bool = True, whole_copies: bool = False,
) -> float:
    """A whole round in the ideal chunked execution: the broadcast (G's copies whole one after
    another with `whole_copies`), each local training `train_s` once it holds the whole model,
    then the upload from each local's training end."""
    kw = {"chunks": chunks, "rate": rate, "propagation": propagation}
    got = simulate_nodes(model, schedule, "broadcast", model_bytes, whole_copies=whole_copies, **kw)  # type: ignore[arg-type]
    release = {n: got[n] + train_s for n in schedule.local_sites}
    done = simulate_nodes(model, schedule, "upload", model_bytes, release=release, **kw)  # type: ignore[arg-type]
    return done[schedule.global_site]


def old_pipelined_bound_s(model: NetworkModel, schedule: Schedule, procedure: Procedure, model_bytes: int) -> float:
    """The former formula: largest serialization on any link + the deepest chain's propagation."""
    serial = max(n * model_bytes * 8.0 / (model.link(u, v).capacity_mbps * 1e6)
                 for (u, v), n in link_copies(schedule, procedure).items())
    deepest = max(up + down for ws in copy_windows(model, schedule, procedure).values() for up, down in ws)
    return serial + deepest


def counterexample() -> NetworkModel:
    """G-L1 1 km at 100 Mbit/s; G-M-L2 2 x 100,000 km at 200 Gbit/s, M switching only."""
    return NetworkModel.build(
        "counterexample",
        [{"name": "G"}, {"name": "L1"}, {"name": "L2"}, {"name": "M", "has_compute": False}],
        [
            {"a": "G", "b": "L1", "length_km": 1, "wavelengths": 1, "wavelength_mbps": 100},
            {"a": "G", "b": "M", "length_km": 100_000, "wavelength_mbps": 25_000},
            {"a": "M", "b": "L2", "length_km": 100_000, "wavelength_mbps": 25_000},
        ],
    )


@pytest.mark.parametrize("name", ALL_SCHEDULERS)
def test_old_bound_exceeded_an_achievable_round_the_new_one_does_not(name: str) -> None:
    # Prepare: G->L1 is slow but short, G->M->L2 long but fast: different branches.
    model = counterexample()
    task = Task(1, "G", ("L1", "L2"), demand_mbps=100, model_bytes=MB_12_5)
    s = make_scheduler(name).schedule(NetworkState(model), task)

    # Execute
    achieved = {p: simulate_s(model, s, p, MB_12_5, chunks=1) for p in ("broadcast", "upload")}
    old = {p: old_pipelined_bound_s(model, s, p, MB_12_5) for p in ("broadcast", "upload")}
    new = {p: pipelined_bound_s(model, s, p, MB_12_5) for p in ("broadcast", "upload")}

    # Assert: 100 Mbit at 100 Mbit/s on G-L1 = 1 s, 2 x 0.5 s of fiber on the other branch.
    assert s.path("broadcast", "G", "L2") == ("G", "M", "L2")
    for p in ("broadcast", "upload"):
        assert old[p] == pytest.approx(2.0, rel=1e-4)
        # store-and-forward at M: 2 x (0.5 ms serialization + 0.5 s fiber)
        assert achieved[p] == pytest.approx(1.001, rel=1e-9)
        assert old[p] > achieved[p]
        assert new[p] == pytest.approx(1.0005, rel=1e-9)  # G-M-L2: one 0.5 ms serialization + 1 s
        assert new[p] <= achieved[p]


def crossing_model() -> tuple[NetworkModel, Schedule]:
    r"""X->Y carries two broadcast copies: G->Y (reaches X at once) and F->Z (reaches X after 1 s).

    ::

        G --1 km-- X --1 km, 100 Mbit/s-- Y --1 km-- Z
         \        /
     100,000 km  100,000 km
           \    /
             F
    """
    fast = {"wavelength_mbps": 25_000}
    model = NetworkModel.build(
        "crossing",
        [{"name": n} for n in ("G", "Y", "F", "Z")] + [{"name": "X", "has_compute": False}],
        [
            {"a": "G", "b": "X", "length_km": 1, **fast},
            {"a": "X", "b": "Y", "length_km": 1, "wavelengths": 1, "wavelength_mbps": 100},
            {"a": "Y", "b": "Z", "length_km": 1, **fast},
            {"a": "G", "b": "F", "length_km": 100_000, **fast},
            {"a": "F", "b": "X", "length_km": 100_000, **fast},
        ],
    )
    down = [("G", "Y", ("G", "X", "Y")), ("G", "F", ("G", "F")), ("F", "Z", ("F", "X", "Y", "Z"))]
    schedule = Schedule(
        task_id=1, scheduler="hand", global_site="G", local_sites=("Y", "F", "Z"), demand_mbps=100,
        broadcast_parent={c: p for p, c, _ in down}, upload_parent={c: p for p, c, _ in down},
        edges=tuple(
            [OverlayEdge("broadcast", p, c, path) for p, c, path in down]
            + [OverlayEdge("upload", c, p, tuple(reversed(path))) for p, c, path in down]
        ),
    )
    return model, schedule


def test_a_copy_crossing_a_link_earlier_does_not_delay_a_later_chain() -> None:
    # Prepare: "n(l) * S / rate + the chain's propagation" for chain G->F->Z would be
    # 2 s on X->Y + 1 s of fiber; but G->Y's copy is through X->Y before F->Z's arrives.
    model, s = crossing_model()
    per_chain_with_all_copies = 2 * 1.0 + 1.0

    # Execute
    achieved = simulate_s(model, s, "broadcast", MB_12_5, chunks=100)
    bound = pipelined_bound_s(model, s, "broadcast", MB_12_5)

    # Assert
    assert achieved < per_chain_with_all_copies - 0.9
    assert bound <= achieved
    # F->Z's copy alone: 1 s of fiber G-F-X, 1 s on X->Y, then 10 us of fiber X-Y-Z.
    assert bound == pytest.approx(1.0 + 1.0 + 0.01e-3, rel=1e-9)
    assert achieved / bound < 1.01


def test_upload_copy_windows_wait_for_the_farthest_child() -> None:
    # Prepare: relay H aggregates A (100 km) and B (300 km); H->G is 200 km.
    model = NetworkModel.build(
        "agg",
        [{"name": n} for n in ("G", "A", "B", "H")],
        [{"a": "H", "b": "A", "length_km": 100}, {"a": "H", "b": "B", "length_km": 300},
         {"a": "H", "b": "G", "length_km": 200}],
    )
    up = [("A", "H"), ("B", "H"), ("H", "G")]
    s = Schedule(
        task_id=1, scheduler="hand", global_site="G", local_sites=("A", "B"), demand_mbps=1,
        upload_parent=dict(up), edges=tuple(OverlayEdge("upload", c, p, (c, p)) for c, p in up),
    )

    # Execute
    windows = copy_windows(model, s, "upload")
    bound = pipelined_bound_s(model, s, "upload", 1_000_000)

    # Assert: H's aggregate needs B's bits, 1.5 ms away; it still has 1 ms to go to G.
    assert windows[("H", "G")] == [pytest.approx(CopyWindow(1.5e-3, 1e-3))]
    assert windows[("A", "H")] == [pytest.approx(CopyWindow(0.0, 1.5e-3))]
    assert windows[("B", "H")] == [pytest.approx(CopyWindow(0.0, 2.5e-3))]
    assert bound == pytest.approx(8e6 / 80_000e6 + 2.5e-3)


def shared_access() -> tuple[NetworkModel, Schedule]:
    """G-X one 100 Mbit/s wavelength, X-A and X-B fast; unicast both ways (as spff schedules)."""
    model = NetworkModel.build(
        "shared-access",
        [{"name": "G"}, {"name": "A"}, {"name": "B"}, {"name": "X", "has_compute": False}],
        [{"a": "G", "b": "X", "length_km": 1, "wavelengths": 1, "wavelength_mbps": 100},
         {"a": "X", "b": "A", "length_km": 1, "wavelength_mbps": 25_000},
         {"a": "X", "b": "B", "length_km": 1, "wavelength_mbps": 25_000}],
    )
    edges = [OverlayEdge("broadcast", "G", n, ("G", "X", n)) for n in ("A", "B")]
    edges += [OverlayEdge("upload", n, "G", (n, "X", "G")) for n in ("A", "B")]
    s = Schedule(task_id=1, scheduler="hand", global_site="G", local_sites=("A", "B"), demand_mbps=1,
                 broadcast_parent={"A": "G", "B": "G"}, upload_parent={"A": "G", "B": "G"}, edges=tuple(edges))
    return model, s


def test_the_joint_bound_counts_the_last_served_locals_upload_after_a_shared_link() -> None:
    # Prepare: two copies of 100 Mbit cross G->X (2 s); whichever local gets the model last
    # still trains and sends its update back through X->G (1 s).
    model, s = shared_access()
    train = 0.25

    # Execute
    f = round_figures(model, s, MB_12_5, train_s=train, propagation=False)
    achieved = simulate_round_s(model, s, MB_12_5, chunks=200, train_s=train, propagation=False)
    serial = simulate_round_s(model, s, MB_12_5, chunks=200, train_s=train, propagation=False, whole_copies=True)

    # Assert: the procedures alone allow train + 2 s; no execution does better than train + 3 s.
    assert max(f.broadcast.pipelined_s, f.upload.pipelined_s) == pytest.approx(2.0, rel=1e-3)
    assert f.joint_s == pytest.approx(3.0, rel=1e-3)
    assert f.lower_bound.lower_s == pytest.approx(train + 3.0, rel=1e-3)
    assert f.lower_bound.lower_s <= serial < achieved
    assert serial < f.lower_bound.lower_s * 1.01, "copies one after another reach the bound"
    assert achieved == pytest.approx(train + 4.0, rel=1e-2), "shared chunk by chunk, both uploads collide"
    assert replace(f.lower_bound, joint_s=0.0).lower_s == pytest.approx(train + 2.0, rel=1e-3)


def test_the_joint_bound_of_one_chain_is_reached_with_many_chunks() -> None:
    # Prepare: G-A-B-C with C the only local, A and B relays both ways.
    model = line(compute_inside=True)
    path = ("G", "A", "B", "C")
    edges = [OverlayEdge("broadcast", a, b, (a, b)) for a, b in itertools.pairwise(path)]
    edges += [OverlayEdge("upload", b, a, (b, a)) for a, b in itertools.pairwise(path)]
    s = Schedule(task_id=1, scheduler="hand", global_site="G", local_sites=("C",), demand_mbps=1,
                 broadcast_parent={"A": "G", "B": "A", "C": "B"}, upload_parent={"C": "B", "B": "A", "A": "G"},
                 edges=tuple(edges))

    # Execute
    f = round_figures(model, s, MB_12_5, train_s=0.1)
    achieved = simulate_round_s(model, s, MB_12_5, chunks=400, train_s=0.1)

    # Assert: each way, 100 Mbit at 400 Mbit/s + 10.5 ms of fiber.
    assert f.joint_s == pytest.approx(2 * (0.25 + 10.5e-3), rel=1e-6)
    assert f.lower_bound.lower_s <= achieved < f.lower_bound.lower_s * 1.01


def line(compute_inside: bool) -> NetworkModel:
    """G-A-B-C, 300/1200/600 km at 1000/400/2500 Mbit/s."""
    return NetworkModel.build(
        "line",
        [{"name": "G"}, {"name": "A", "has_compute": compute_inside},
         {"name": "B", "has_compute": compute_inside}, {"name": "C"}],
        [{"a": "G", "b": "A", "length_km": 300, "wavelengths": 1, "wavelength_mbps": 1000},
         {"a": "A", "b": "B", "length_km": 1200, "wavelengths": 1, "wavelength_mbps": 400},
         {"a": "B", "b": "C", "length_km": 600, "wavelengths": 1, "wavelength_mbps": 2500}],
    )


@pytest.mark.parametrize("procedure", ["broadcast", "upload"])
@pytest.mark.parametrize("compute_inside", [True, False], ids=["overlay-chain", "one-edge"])
def test_many_chunks_on_one_chain_approach_the_bound(procedure: Procedure, compute_inside: bool) -> None:
    # Prepare: a 3-hop chain, as three overlay edges (mst relays at A and B) or as one.
    model = line(compute_inside)
    locals_ = ("A", "B", "C") if compute_inside else ("C",)
    s = get_scheduler("mst").schedule(NetworkState(model), Task(1, "G", locals_, demand_mbps=400))

    # Execute
    bound = pipelined_bound_s(model, s, procedure, 1_000_000)
    simulated = simulate_s(model, s, procedure, 1_000_000, chunks=200)
    whole = simulate_s(model, s, procedure, 1_000_000, chunks=1)

    # Assert: 8 Mbit through the 400 Mbit/s link = 20 ms, plus 10.5 ms of fiber.
    assert s.depth(procedure) == (3 if compute_inside else 1)
    assert bound == pytest.approx(0.02 + 10.5e-3)
    assert 1.0 <= simulated / bound <= 1.01
    assert whole == pytest.approx(bound + 8e-3 + 3.2e-3)  # whole copies wait at A and B


def test_reference_is_one_copy_through_gs_fastest_access_link_in_its_direction() -> None:
    # Prepare: G's links run 10 and 40 Gbit/s out of G, 20 and 5 Gbit/s into it.
    model = NetworkModel.build(
        "two-armed",
        [{"name": n} for n in ("G", "A", "B")],
        [{"a": "G", "b": "A"}, {"a": "G", "b": "B"}],
    )
    rates = {("G", "A"): 10_000.0, ("A", "G"): 20_000.0, ("G", "B"): 40_000.0, ("B", "G"): 5_000.0}

    # Execute
    down = reference_s(model, "G", "broadcast", 1_000_000, rate=lambda u, v: rates[(u, v)])
    up = reference_s(model, "G", "upload", 1_000_000, rate=lambda u, v: rates[(u, v)])

    # Assert
    assert down == pytest.approx(8e6 / 40_000e6)
    assert up == pytest.approx(8e6 / 20_000e6)


def test_round_figures_carry_the_existing_bounds_and_the_reference() -> None:
    # Prepare
    model, s = crossing_model()

    # Execute
    f = round_figures(model, s, MB_12_5, train_s=0.25)

    # Assert
    assert f.lower_bound == round_lower_bound(model, s, MB_12_5, train_s=0.25)
    assert f.store_and_forward == round_lower_bound(model, s, MB_12_5, train_s=0.25, pipelined=False)
    assert f.upload.store_and_forward_s == store_and_forward_s(model, s, "upload", MB_12_5)
    assert f.broadcast.pipelined_s == procedure_bound_s(model, s, "broadcast", MB_12_5)
    assert f.reference.broadcast_s == pytest.approx(100e6 / 200_000e6)
    assert f.reference.total_s == pytest.approx(2 * 100e6 / 200_000e6 + 0.25)
    for p in (f.broadcast, f.upload):
        assert p.reference_s <= p.pipelined_s <= p.store_and_forward_s


def test_blocked_or_broken_schedules_are_refused() -> None:
    model, _ = crossing_model()
    blocked = Schedule(task_id=2, scheduler="hand", global_site="G", local_sites=("Y",),
                       demand_mbps=1, blocked=True, reason="full")
    cyclic = Schedule(
        task_id=3, scheduler="hand", global_site="G", local_sites=("Y", "Z"), demand_mbps=1,
        edges=(OverlayEdge("broadcast", "Z", "Y", ("Z", "Y")), OverlayEdge("broadcast", "Y", "Z", ("Y", "Z"))),
    )

    with pytest.raises(ValueError, match="blocked"):
        round_figures(model, blocked, 1)
    with pytest.raises(ValueError, match="do not form a tree"):
        pipelined_bound_s(model, cyclic, "broadcast", 1)


# -- random networks and schedules -------------------------------------------------------------


@st.composite
def networks(draw: st.DrawFn) -> tuple[NetworkModel, random.Random]:
    """A connected network of 3..8 sites whose serialization and propagation times are alike:
    lengths 1 km..50,000 km (5 us..250 ms), 100 Mbit/s..40 Gbit/s per direction."""
    n = draw(st.integers(min_value=3, max_value=8))
    rng = random.Random(draw(st.integers(min_value=0, max_value=2**31)))
    edges = {(rng.randrange(k), k) for k in range(1, n)}
    for _ in range(draw(st.integers(min_value=0, max_value=n))):
        a, b = rng.sample(range(n), 2)
        edges.add((min(a, b), max(a, b)))
    compute = set(rng.sample(range(n), rng.randint(2, n)))
    sites = [{"name": f"v{i}", "has_compute": i in compute} for i in range(n)]
    links = [
        {"a": f"v{a}", "b": f"v{b}", "length_km": rng.choice([1, 40, 500, 5000, 50_000]),
         "wavelengths": rng.randint(1, 4), "wavelength_mbps": rng.choice([100, 1000, 10_000])}
        for a, b in sorted(edges)
    ]
    return NetworkModel.build("random", sites, links), rng


def random_rate(model: NetworkModel, rng: random.Random) -> RateFn:
    """Rates that differ by direction (as shaped in an emulation), 0.2..1 x capacity."""
    factor = {(u, v): rng.uniform(0.2, 1.0) for ln in model.iter_links() for u, v in ((ln.a, ln.b), (ln.b, ln.a))}
    return lambda u, v: model.link(u, v).capacity_mbps * factor[(u, v)]


def check_against_simulation(
    model: NetworkModel, s: Schedule, model_bytes: int, chunks: int, rate: RateFn, propagation: bool,
    train_s: float = 0.0,
) -> None:
    """Every execution is at least the bound; the bound lies between reference and S&F; a whole
    round (each local training `train_s`) is at least the round's bound."""
    f = round_figures(model, s, model_bytes, train_s=train_s, rate=rate, propagation=propagation)
    for c, whole in ((chunks, False), (1, False), (chunks, True)):
        whole_round = simulate_round_s(model, s, model_bytes, chunks=c, train_s=train_s, rate=rate,
                                       propagation=propagation, whole_copies=whole)
        assert whole_round >= f.lower_bound.lower_s * (1 - SLACK), (c, whole, whole_round, f.lower_bound)
    assert f.joint_s >= max(f.broadcast.pipelined_s, f.upload.pipelined_s) * (1 - SLACK)
    for procedure in ("broadcast", "upload"):
        bound = pipelined_bound_s(model, s, procedure, model_bytes, rate=rate, propagation=propagation)
        chunked = simulate_s(model, s, procedure, model_bytes, chunks=chunks, rate=rate, propagation=propagation)
        whole = simulate_s(model, s, procedure, model_bytes, chunks=1, rate=rate, propagation=propagation)
        sf = store_and_forward_s(model, s, procedure, model_bytes, rate=rate, propagation=propagation)
        ref = reference_s(model, s.global_site, procedure, model_bytes, rate=rate)

        assert chunked >= bound * (1 - SLACK), (procedure, chunked, bound)
        assert whole >= bound * (1 - SLACK), (procedure, whole, bound)
        assert ref <= bound * (1 + SLACK)
        assert bound <= sf * (1 + SLACK)


@pytest.mark.parametrize("name", ALL_SCHEDULERS)
@SETTINGS
@given(
    data=networks(),
    model_bytes=st.sampled_from([125_000, 1_250_000, 12_500_000]),
    chunks=st.integers(min_value=2, max_value=24),
    propagation=st.booleans(),
    train_s=st.sampled_from([0.0, 0.002, 0.3]),
)
def test_no_execution_of_a_schedulers_schedule_beats_the_bound(
    name: str, data: tuple[NetworkModel, random.Random], model_bytes: int, chunks: int, propagation: bool,
    train_s: float,
) -> None:
    # Prepare: a small demand, so that the empty network admits every task.
    model, rng = data
    chosen = rng.sample(model.compute_sites, rng.randint(2, len(model.compute_sites)))
    task = Task(1, chosen[0], tuple(chosen[1:]), demand_mbps=1.0)

    # Execute
    s = make_scheduler(name).schedule(NetworkState(model), task)

    # Assert
    assert not s.blocked
    check_against_simulation(model, s, model_bytes, chunks, random_rate(model, rng), propagation, train_s)


def random_tree(
    graph: nx.Graph, rng: random.Random, procedure: Procedure, g: str, locals_: list[str], relays: list[str]
) -> list[OverlayEdge]:
    """A random overlay tree over G, the locals and relays (each relay put on an edge, so that it
    has a child), every edge routed on a random walk: a random shortest path, sometimes through
    a detour site so that the walk can revisit links."""
    parent: dict[str, str] = {}
    placed = [g]
    for node in rng.sample(locals_, len(locals_)):
        parent[node] = rng.choice(placed)
        placed.append(node)
    for relay in relays:
        child = rng.choice(list(parent))
        parent[relay], parent[child] = parent[child], relay

    def walk(a: str, b: str) -> tuple[str, ...]:
        weights = {frozenset(e): rng.random() for e in graph.edges}
        w = lambda u, v, _d: weights[frozenset((u, v))]  # noqa: E731
        via = rng.choice(list(graph.nodes)) if rng.random() < 0.3 else a
        first = nx.shortest_path(graph, a, via, weight=w)
        return tuple(first[:-1] + nx.shortest_path(graph, via, b, weight=w))

    out = []
    for child, par in parent.items():
        path = walk(par, child)
        if len(path) < 2:  # a detour that came straight back: take the direct route
            path = tuple(nx.shortest_path(graph, par, child))
        if procedure == "broadcast":
            out.append(OverlayEdge("broadcast", par, child, path))
        else:
            out.append(OverlayEdge("upload", child, par, tuple(reversed(path))))
    return out


@SETTINGS
@given(
    data=networks(),
    model_bytes=st.sampled_from([125_000, 1_250_000, 12_500_000]),
    chunks=st.integers(min_value=2, max_value=24),
    propagation=st.booleans(),
    train_s=st.sampled_from([0.0, 0.002, 0.3]),
)
def test_no_execution_of_a_random_schedule_beats_the_bound(
    data: tuple[NetworkModel, random.Random], model_bytes: int, chunks: int, propagation: bool, train_s: float
) -> None:
    # Prepare: G, locals and relays on random sites; independent broadcast and upload trees.
    model, rng = data
    sites = rng.sample(model.site_names, len(model.site_names))
    g, n_locals = sites[0], rng.randint(1, len(sites) - 1)
    locals_ = sites[1 : 1 + n_locals]
    relays_b = [r for r in sites[1 + n_locals :] if rng.random() < 0.5]
    relays_u = [r for r in sites[1 + n_locals :] if rng.random() < 0.5]
    down = random_tree(model.graph, rng, "broadcast", g, locals_, relays_b)
    up = random_tree(model.graph, rng, "upload", g, locals_, relays_u)
    s = Schedule(
        task_id=1, scheduler="random", global_site=g, local_sites=tuple(locals_), demand_mbps=1.0,
        broadcast_parent={e.dst: e.src for e in down}, upload_parent={e.src: e.dst for e in up},
        edges=(*down, *up),
    )

    # Execute and assert
    check_against_simulation(model, s, model_bytes, chunks, random_rate(model, rng), propagation, train_s)


def test_compressed_updates_keep_only_bounds_that_hold_for_any_update_size() -> None:
    # Prepare
    model, s = shared_access()

    # Execute
    whole = round_figures(model, s, MB_12_5, train_s=0.25)
    compressed = round_figures(model, s, MB_12_5, train_s=0.25, whole_updates=False)

    # Assert: the upload bound is its propagation alone (2 km of fiber), no joint bound; the
    # broadcast and the upload's store-and-forward figure and reference are unchanged
    assert compressed.upload.pipelined_s == pytest.approx(pipelined_bound_s(model, s, "upload", 0))
    assert compressed.upload.pipelined_s < 1e-4 < whole.upload.pipelined_s
    assert compressed.joint_s == 0.0 < whole.joint_s
    assert compressed.broadcast == whole.broadcast
    assert compressed.upload.store_and_forward_s == whole.upload.store_and_forward_s
    assert compressed.lower_bound.lower_s == pytest.approx(0.25 + whole.broadcast.pipelined_s)
