"""The pipelined lower bound of one procedure of a schedule, and the round's joint bound.

The figures of `orchestrator.scheduling.cost` that bound every execution of a schedule (any chunk
size, any order, relays cutting through or storing). A *copy* on a directed link l: one overlay
edge of procedure p whose path crosses l; the link must carry the whole model (``S`` bits) once per
copy. A link sends one bit at a time at ``rate(l)``; a bit then needs the link's propagation delay
to reach the far end.

``pipelined`` (the lower bound, `pipelined_bound_s`). For each copy j on l (overlay edge e,
l its i-th link) two propagation times, in seconds:

- ``up_j``: the earliest a bit of j can be at the tail of l. Broadcast: the propagation from G
  along e's overlay chain to the tail of l. Upload: the largest, over the locals of the subtree
  that feeds e (its sender and everything below it), of the propagation from that local to the
  tail of l, because an aggregator cannot send bit k before it has bit k of every child.
- ``down_j``: from the tail of l (l's own delay included) to where j's last bit is needed.
  Broadcast: the deepest local that e feeds. Upload: G.

Then, with J(rho, kappa) the copies on l with ``up_j >= rho`` and ``down_j >= kappa``::

    T_p = max over links l, over rho among the up_j and kappa among the down_j of l, of
          rho + |J(rho, kappa)| * S / rate(l) + kappa

Why this is a lower bound of every execution (any chunk size, any order in which a link serves
what waits for it, relays cutting through or storing): bits exist at time 0 only at G (broadcast)
or at the locals (upload), and every bit of copy j travels the links of j's own overlay chain,
so no bit of a copy in J is at the tail of l before rho. l sends the |J| * S bits of J one at a
time, so the last of them leaves no earlier than rho + |J| * S / rate(l). That bit belongs to
some j in J and is needed (every local needs every bit of the model; G's aggregate needs every
bit of every child's stream), so it still travels down_j >= kappa. Any fixed (rho, kappa) thus
bounds the procedure; T_p is the largest of these bounds.

Why not simply "largest n_p(l) * S / rate(l) on a chain + the chain's propagation": a copy of
another chain that reaches l earlier (smaller up) can cross l before this chain's copy arrives,
and one bound for a nearer site (smaller down) can cross after it and still be in time, so the
chain waits for neither. Taking (rho, kappa) = (up, down) of a chain's own copy counts only the
copies that cannot get out of its way on l. Where all copies on each link have the same up and
down (e.g. unicast copies from G to sites at the same depth), that is all n_p(l) copies, and
T_p is the largest, over the chains, of the largest n_p(l) * S / rate(l) on the chain + the
chain's propagation. T_p treats each link on its own: a single chain reaches it as chunks
shrink (within 1% with 200 chunks on 3 hops, see tests/unit/test_scheduling_bounds.py); links
that interact can keep every execution above it.

``joint`` (every local trains, its update uncompressed) ties the procedures together through
each local λ. λ trains only once it holds the whole model, and G's aggregate needs every bit of
λ's update, which then crosses every link of λ's upload chain. One copy alone on a chain of links
needs S / (the chain's slowest rate) + the chain's propagation; call that b(λ) on λ's broadcast
chain and u(λ) on its upload chain. Then the link bound above holds with wider windows:

- broadcast copy j on l: down'_j = the largest, over the locals λ that j feeds, of the
  propagation from the tail of l to λ + u(λ) (after the last bit of J reaches λ, λ trains and its
  update still reaches G);
- upload copy j on l: up'_j = the largest, over the locals λ that feed j, of b(λ) + the
  propagation from λ to the tail of l (no bit of j exists before each such λ has trained).

``joint`` is the larger of the two link bounds taken with these windows (training left out: the
round adds the shortest local training once). It is never below either procedure's T_p, and it
is what a serial link shows: n unicast copies from G on one link cost n * S / rate before the
last local trains, and that local's update still needs u(λ) after it.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import NamedTuple

from orchestrator.scheduling.schedule import DirectedLink, OverlayEdge, Procedure, Schedule
from topologies.model import NetworkModel

RateFn = Callable[[str, str], float]


def capacity_rate(model: NetworkModel) -> RateFn:
    return lambda u, v: model.link(u, v).capacity_mbps


def check_not_blocked(schedule: Schedule) -> None:
    if schedule.blocked:
        raise ValueError(f"task {schedule.task_id} is blocked: it has no round to bound")



class CopyWindow(NamedTuple):
    """One copy on a directed link (see the module docstring), in seconds."""

    up_s: float
    """Propagation before any bit of the copy can be at the tail of the link."""
    down_s: float
    """Propagation from the tail of the link (its own delay included) to where the copy's last
    bit is needed."""


class _Tree(NamedTuple):
    """One procedure's overlay tree hanging from G (see `_walk`)."""

    edges: list[OverlayEdge]
    toward_g: dict[str, OverlayEdge]
    """Each node's edge on its side toward G."""
    near: dict[str, float]
    """Propagation (s) between G and the node along its overlay chain."""
    deepest_first: list[str]
    """The nodes other than G, every node before its parent."""


def _walk(model: NetworkModel, schedule: Schedule, procedure: Procedure, propagation: bool) -> _Tree:
    """Check that `procedure`'s edges form a tree from G and walk it (raises ValueError)."""
    edges = schedule.edges_of(procedure)
    g = schedule.global_site
    broken = f"task {schedule.task_id}: {procedure} edges do not form a tree from G"
    # Both procedures are walked as a tree hanging from G: "toward G" is the sender's side for
    # the broadcast and the receiver's side for the upload (its mirror image).
    toward_g: dict[str, OverlayEdge] = {}
    for e in edges:
        child = e.dst if procedure == "broadcast" else e.src
        if child == g or child in toward_g:
            raise ValueError(broken)
        toward_g[child] = e
    near: dict[str, float] = {g: 0.0}
    hops: dict[str, int] = {g: 0}
    for start in toward_g:
        chain: list[str] = []
        node = start
        while node not in near:
            if node not in toward_g or len(chain) > len(edges):
                raise ValueError(broken)
            chain.append(node)
            node = _parent(toward_g[node], procedure)
        for node in reversed(chain):
            parent = _parent(toward_g[node], procedure)
            near[node] = near[parent] + _delay_s(model, toward_g[node].path, propagation)
            hops[node] = hops[parent] + 1
    return _Tree(edges, toward_g, near, sorted(toward_g, key=hops.__getitem__, reverse=True))


def _parent(e: OverlayEdge, procedure: Procedure) -> str:
    return e.src if procedure == "broadcast" else e.dst


def _delay_s(model: NetworkModel, path: tuple[str, ...], propagation: bool) -> float:
    return model.path_delay_ms(path) / 1e3 if propagation else 0.0


def _farthest(model: NetworkModel, tree: _Tree, procedure: Procedure, propagation: bool,
              at: Callable[[str], float | None]) -> dict[str, float | None]:
    """Per node x: the largest, over the nodes y of x's subtree (x included) with a figure
    ``at(y)``, of ``at(y)`` + the propagation between x and y; None if no node of it has one."""
    far: dict[str, float | None] = {n: at(n) for n in tree.near}
    for node in tree.deepest_first:  # every child is final before its parent reads it
        own = far[node]
        if own is None:
            continue
        e = tree.toward_g[node]
        parent = _parent(e, procedure)
        via = _delay_s(model, e.path, propagation) + own
        was = far[parent]
        far[parent] = via if was is None else max(was, via)
    return far


def _windows(model: NetworkModel, tree: _Tree, procedure: Procedure, propagation: bool,
             before: Callable[[OverlayEdge], float | None], after: Callable[[OverlayEdge], float | None],
             ) -> dict[DirectedLink, list[CopyWindow]]:
    """Every copy's window per directed link, from what comes before the edge's first link and
    after its last (copies for which either is None are left out)."""
    windows: dict[DirectedLink, list[CopyWindow]] = {}
    for e in tree.edges:
        first, last = before(e), after(e)
        if first is None or last is None:
            continue
        total = _delay_s(model, e.path, propagation)
        done = 0.0
        for i, link in enumerate(e.links()):
            windows.setdefault(link, []).append(CopyWindow(first + done, total - done + last))
            done += _delay_s(model, e.path[i : i + 2], propagation)
    return windows


def copy_windows(
    model: NetworkModel, schedule: Schedule, procedure: Procedure, *, propagation: bool = True
) -> dict[DirectedLink, list[CopyWindow]]:
    """The `CopyWindow` of every copy of `procedure`, per directed link.

    Raises
    ------
    ValueError
        If the procedure's edges do not form a tree from G.
    """
    tree = _walk(model, schedule, procedure, propagation)
    # far: the largest propagation between a node and a node of its subtree (0 at a leaf)
    far = _farthest(model, tree, procedure, propagation, lambda n: 0.0)
    # The broadcast's data comes from G's side and is needed in the subtree below e.dst; the
    # upload's comes from the subtree below e.src and is needed at G.
    if procedure == "broadcast":
        return _windows(model, tree, procedure, propagation, lambda e: tree.near[e.src], lambda e: far[e.dst])
    return _windows(model, tree, procedure, propagation, lambda e: far[e.src], lambda e: tree.near[e.dst])


def _chain_s(tree: _Tree, procedure: Procedure, bits: float, rate: RateFn, g: str) -> dict[str, float]:
    """Per node of `tree`: one copy of `bits` alone on the node's overlay chain between G and it
    (the bits over the chain's slowest rate + its propagation); b(λ) and u(λ) of the module docstring."""
    slowest: dict[str, float] = {g: float("inf")}
    for node in reversed(tree.deepest_first):  # parents first
        e = tree.toward_g[node]
        slowest[node] = min([slowest[_parent(e, procedure)], *(rate(u, v) for u, v in e.links())])
    return {n: (bits / (slowest[n] * 1e6) if slowest[n] != float("inf") else 0.0) + tree.near[n] for n in tree.near}


def joint_bound_s(
    model: NetworkModel,
    schedule: Schedule,
    model_bytes: int,
    *,
    rate: RateFn | None = None,
    propagation: bool = True,
) -> float:
    """Lower bound (s) of a round of `schedule` in which every local trains, its training left out
    (``joint`` of the module docstring).

    Raises
    ------
    ValueError
        If the schedule is blocked or a procedure's edges are not a tree from G.
    """
    check_not_blocked(schedule)
    rate = rate or capacity_rate(model)
    bits = model_bytes * 8.0
    g, locals_ = schedule.global_site, set(schedule.local_sites)
    down = _walk(model, schedule, "broadcast", propagation)
    up = _walk(model, schedule, "upload", propagation)
    b, u = _chain_s(down, "broadcast", bits, rate, g), _chain_s(up, "upload", bits, rate, g)
    # after the broadcast: each local's whole update still reaches G; before the upload: each
    # local got the whole model
    then_up = _farthest(model, down, "broadcast", propagation, lambda n: u.get(n) if n in locals_ else None)
    first_down = _farthest(model, up, "upload", propagation, lambda n: b.get(n) if n in locals_ else None)
    windows = [
        _windows(model, down, "broadcast", propagation, lambda e: down.near[e.src], lambda e: then_up[e.dst]),
        _windows(model, up, "upload", propagation, lambda e: first_down[e.src], lambda e: up.near[e.dst]),
    ]
    return max((_link_bound_s(ws, bits / (rate(*link) * 1e6)) for w in windows for link, ws in w.items()),
               default=0.0)


def _link_bound_s(windows: list[CopyWindow], serial_s: float) -> float:
    """Largest rho + |J| * serial_s + kappa over the subsets J of one link's copies, with rho the
    smallest up and kappa the smallest down in J (the module docstring's bound for one link).

    For rho the up of the m-th copy by decreasing up, every J with smallest up >= rho lies among
    the first m; among those, the k with the largest downs give kappa = the k-th largest down.
    Every such (J, rho, kappa) is a valid bound, and the best one is among them.
    """
    best = 0.0
    by_up = sorted(windows, key=lambda w: w.up_s, reverse=True)
    downs: list[float] = []
    for w in by_up:
        bisect.insort(downs, -w.down_s)  # kept descending in down_s
        rho = w.up_s  # the smallest up so far
        for count, neg_kappa in enumerate(downs, start=1):
            best = max(best, rho + count * serial_s - neg_kappa)
    return best


def pipelined_bound_s(
    model: NetworkModel,
    schedule: Schedule,
    procedure: Procedure,
    model_bytes: int,
    *,
    rate: RateFn | None = None,
    propagation: bool = True,
) -> float:
    """Lower bound (s) of one procedure over every execution of `schedule`: T_p of the module
    docstring. `propagation=False` leaves out fiber delay.

    Raises
    ------
    ValueError
        If the schedule is blocked or the procedure's edges are not a tree from G.
    """
    check_not_blocked(schedule)
    rate = rate or capacity_rate(model)
    bits = model_bytes * 8.0
    windows = copy_windows(model, schedule, procedure, propagation=propagation)
    return max(
        (_link_bound_s(ws, bits / (rate(u, v) * 1e6)) for (u, v), ws in windows.items()), default=0.0
    )
