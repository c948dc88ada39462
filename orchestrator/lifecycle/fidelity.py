"""What tells whether a round measured the emulated network or the host: per-hop figures of the
broadcast tree, computed the same way for every engine from the records the core already keeps.

A *hop* is one broadcast edge in one round: ``hop_s`` is the child's receive time (it holds the
whole global model) minus its parent's. Its *floor* is what the emulated network alone allows:
the child cannot finish before the parent's last chunk has crossed the edge (one chunk at the
edge's share of its slowest link, plus its propagation where delay is emulated), nor before the
whole model has crossed the edge since the round started (G starts with the whole model; a relay
forwards as it receives). ``overhead_s = hop_s - floor_s`` is what the instrument added (software,
CPU waits). docs/architecture.md, "Fidelity", says how the verdict reads these.

A *link rate* (`link_rate_rows`) is what a shaped link delivered while the task's broadcast saturated
it: G sends every copy from the round's start, so each directed link that is the bottleneck of G's
broadcast edges is busy with the task's copies until the last child behind it holds the model. Its
``rate_share`` is the time those copies take at the link's configured rate (under dilation the
dilated one: the rate is the undilated rate and the times are emulated) over the time they took.
Only links carrying at least `SATURATING_BYTES` count, so that the part the links' htb burst passes
at the veth's speed is small.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from orchestrator.scheduling import Schedule
from orchestrator.scheduling.cost import RateFn, link_copies, overlay_edge_s
from orchestrator.scheduling.schedule import DirectedLink, OverlayEdge
from topologies.model import NetworkModel

#: Bytes of the task's copies a link must carry from the round's start to count as saturated: ten
#: times the links' htb burst (15 KB, `controller/htb.py`), which passes at the veth's speed.
SATURATING_BYTES = 150_000


def hop_rows(model: NetworkModel, schedule: Schedule, node_rows: Sequence[Mapping[str, Any]], *,
             chunk_bytes: int, model_bytes: int, rate: RateFn, propagation: bool) -> list[dict[str, Any]]:
    """One row per broadcast edge and round that both ends logged: round, parent, child, hop_s,
    chunk_s (one chunk over the edge), floor_s and overhead_s (seconds).

    Parameters
    ----------
    node_rows
        The ``node_rounds`` rows of the task (`received_s` per site and round, on any one clock).
    chunk_bytes
        The chunk size the task's transfers used (0: whole models, store and forward).
    """
    received = {(r["site"], r["round"]): r.get("received_s") for r in node_rows}
    g = schedule.global_site
    copies = link_copies(schedule, "broadcast")
    out = []
    for e in schedule.edges_of("broadcast"):
        chunk = chunk_bytes if 0 < chunk_bytes < model_bytes else model_bytes
        chunk_s = overlay_edge_s(model, e, copies, chunk, rate=rate, propagation=propagation)
        whole_s = overlay_edge_s(model, e, copies, model_bytes, rate=rate, propagation=propagation)
        for (site, rnd), child_t in received.items():
            if site != e.dst or child_t is None:
                continue
            parent_t, start_t = received.get((e.src, rnd)), received.get((g, rnd))
            if parent_t is None or start_t is None:
                continue
            floor = max(chunk_s, start_t + whole_s - parent_t)
            hop = child_t - parent_t
            out.append({"round": rnd, "parent": e.src, "child": e.dst, "hop_s": hop, "chunk_s": chunk_s,
                        "floor_s": floor, "overhead_s": hop - floor})
    return sorted(out, key=lambda r: (r["round"], r["child"]))


def _bottlenecks(schedule: Schedule, rate: RateFn) -> dict[DirectedLink, list[OverlayEdge]]:
    """G's broadcast edges by the directed link that limits each (its copies over its rate)."""
    copies = link_copies(schedule, "broadcast")
    out: dict[DirectedLink, list[OverlayEdge]] = {}
    for e in schedule.edges_of("broadcast"):
        links = e.links()
        if e.src == schedule.global_site and links:
            out.setdefault(max(links, key=lambda ln: copies[ln] / rate(*ln)), []).append(e)
    return out


def link_rate_rows(model: NetworkModel, schedule: Schedule, node_rows: Sequence[Mapping[str, Any]], *,
                   model_bytes: int, rate: RateFn, propagation: bool) -> list[dict[str, Any]]:
    """One row per round and saturated directed link (see the module docstring): round, a, b, bytes,
    expected_s (the copies at the configured rate, plus propagation where delay is emulated),
    measured_s (the round's start to the last child behind the link holding the model) and
    rate_share (expected over measured: 1 is the configured rate, TCP's headers alone give about 0.96)."""
    received = {(r["site"], r["round"]): r.get("received_s") for r in node_rows}
    g = schedule.global_site
    copies = link_copies(schedule, "broadcast")
    rounds = sorted(rnd for site, rnd in received if site == g)
    out = []
    for (a, b), edges in sorted(_bottlenecks(schedule, rate).items()):
        nbytes = copies[(a, b)] * model_bytes
        if nbytes < SATURATING_BYTES:
            continue
        expected = overlay_edge_s(model, edges[0], copies, model_bytes, rate=rate, propagation=propagation)
        for rnd in rounds:
            start, ends = received.get((g, rnd)), [received.get((e.dst, rnd)) for e in edges]
            if start is None or any(t is None for t in ends):
                continue
            measured = max(t for t in ends if t is not None) - start
            if measured > 0:
                out.append({"round": rnd, "a": a, "b": b, "bytes": nbytes, "expected_s": expected,
                            "measured_s": measured, "rate_share": expected / measured})
    return sorted(out, key=lambda r: (r["round"], r["a"], r["b"]))


def training_rows(events: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """Every modelled training of a task's roles (``train_end`` with its real and modelled seconds,
    `workers.rounds`): round, site, real_s, modelled_s. Real over modelled is how much of its emulated
    time the host's training used: above 1 an overrun, near 1 a margin too thin to trust."""
    return sorted(({"round": int(e["round"]), "site": site, "real_s": float(e["real_s"]),
                    "modelled_s": float(e["modelled_s"])}
                   for site, evs in events.items() for e in evs
                   if e.get("event") == "train_end" and "real_s" in e and "modelled_s" in e),
                  key=lambda r: (r["round"], r["site"]))


def overrun_rows(events: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[dict[str, Any]]:
    """The ``train_overrun`` events of a task's roles (`workers.compute`): round, site, real_s, modelled_s."""
    return sorted(({"round": int(e["round"]), "site": site, "real_s": float(e["real_s"]),
                    "modelled_s": float(e["modelled_s"])}
                   for site, evs in events.items() for e in evs if e.get("event") == "train_overrun"),
                  key=lambda r: (r["round"], r["site"]))
