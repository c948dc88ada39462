"""What tells whether a round measured the emulated network or the host: per-hop figures of the
broadcast tree, computed the same way for every engine from the records the core already keeps.

A *hop* is one broadcast edge in one round: ``hop_s`` is the child's receive time (it holds the
whole global model) minus its parent's. Its *floor* is what the emulated network alone allows:
the child cannot finish before the parent's last chunk has crossed the edge (one chunk at its
slowest link's rate, plus its propagation where delay is emulated), nor before every link of the
edge has carried, since the round started, as many whole copies as had arrived across it by then
(G starts with the whole model; a relay forwards as it receives). Where G sends several copies
down one link, the first to arrive thus has a floor of one copy and the last of all of them,
whichever order the sender took. The whole model is the bytes that must cross the link: the copy's frame
bytes (its child's ``global_received`` ``nbytes``, `copy_rows`: the chunks with their headers; the
model's bytes where the engine logs none) over the share of the link's rate its transport leaves
them (the network port's ``payload_share``: TCP payload per Ethernet frame at MTU 1500 in the
emulation, whose htb counts frames; the simulation's ``tcp_efficiency``). Without the headers, a
2.8 MB model's edge from G showed 12-14 ms of "overhead" (6 %) at every K, more than one chunk's
time, though the instrument added none. ``overhead_s = hop_s - floor_s`` is what the instrument
added (software, CPU waits). docs/fidelity.md, "Fidelity", says how the verdict reads these.

A *link rate* (`link_rate_rows`) is what a shaped link delivered while it was busy with the task's
broadcast: for each directed link that is the bottleneck of G's broadcast edges and carries at least
`SATURATING_BURSTS` times its burst in copies, per round, the bytes the copies crossing it put on it at the link's
configured rate (under dilation the dilated one: the rate is the undilated rate and the times are
emulated) over the time the link was busy with them. A copy's bytes are the frame bytes its child
received (the ``nbytes`` of its ``global_received``: the chunks with their headers, TCP/IP's not);
it is *in flight* from its first chunk starting on the link (the sender's ``forward_first``
naming the child, `copy_rows`: logged at that start, `workers.transport.Outbound.started_at`)
to its child holding the whole model; the link is *busy* during the
union of its copies' flights. So the sender's own gaps between copies (host software: the link idle
while nothing of the task is in flight on it) are not charged to the link (the per-hop overhead is
what judges them), and neither are the chunks' headers (the task's protocol, not the link), while a
link that delivers less while it carries the copies still shows below 1. Where an engine does not
log a figure, the definition falls back, per copy: its start to the round's start at G, its bytes
to the model's (the simulation logs ``forward_first`` but frames nothing: its transfers carry the
model's bytes at the link's rate times its TCP efficiency). Only links carrying at least
`SATURATING_BURSTS` times its burst in copies (of the model's bytes) count, so that the part the
link's htb burst passes at the veth's speed is small.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from orchestrator.scheduling import Schedule
from orchestrator.scheduling.cost import RateFn, link_copies, overlay_edge_s
from orchestrator.scheduling.schedule import DirectedLink, OverlayEdge
from topologies.model import NetworkModel

#: How many times its burst (the bytes it passes ahead of its rate after an idle gap, the network
#: port's ``link_burst_bytes``) a round's copies must put on a link for it to count as saturated: the
#: part that passes at the port's speed is then at most a tenth. With the emulation's burst of one
#: frame (`controller.htb.burst_bytes`, a 100 Mbit/s link from K = 47) that is 16 KB: one copy of
#: the default mlp counts.
SATURATING_BURSTS = 10
#: The least a round's copies must put on a link to count, whatever its burst (a link that bursts
#: nothing, as in the simulation, still needs a copy's worth): one frame's payload ten times.
SATURATING_FLOOR_BYTES = 14_480


def hop_rows(model: NetworkModel, schedule: Schedule, node_rows: Sequence[Mapping[str, Any]], *,
             chunk_bytes: int, model_bytes: int, rate: RateFn, propagation: bool,
             copies: Mapping[tuple[int, str], Mapping[str, Any]] | None = None,
             payload_share: float = 1.0, burst_bytes: Callable[[str, str], int] = lambda a, b: 0,
             ) -> list[dict[str, Any]]:
    """One row per broadcast edge and round that both ends logged: round, parent, child, hop_s,
    chunk_s (one chunk's payload over the edge, at the edge's share of its links), floor_s and
    overhead_s (seconds).

    The floor holds whatever order the copies sharing a link take (see the module docstring): the
    child's copy cannot be whole before the parent's last chunk crossed the edge alone at the links'
    rate, nor before as many whole copies as had arrived by then across each of its links (its own
    included: its *rank* there) crossed that link since the round started. A floor that charged every
    copy all the copies of the link (the edge's share) was beaten by the copies G sent first. Each
    link lets its burst pass ahead of its rate (`burst_bytes`, the network port's ``link_burst_bytes``):
    the floor leaves it out, so that an ideal run on the shaped link does not beat it.

    Parameters
    ----------
    node_rows
        The ``node_rounds`` rows of the task (`received_s` per site and round, on any one clock).
    chunk_bytes
        The chunk size the task's transfers used (0: whole models, store and forward).
    copies
        `copy_rows` of the task's events: each copy's frame bytes (None, or a copy without them:
        the model's bytes).
    payload_share
        The share of a link's rate left to the copies' bytes by the transport (1: none lost).
    burst_bytes
        What each directed link passes ahead of its rate after an idle gap (0: nothing).
    """
    received = {(r["site"], r["round"]): r.get("received_s") for r in node_rows}
    g = schedule.global_site
    n_copies = link_copies(schedule, "broadcast")
    logged = copies or {}
    delay_s = {e: model.path_delay_ms(e.path) / 1e3 if propagation else 0.0 for e in schedule.edges_of("broadcast")}
    chunk = chunk_bytes if 0 < chunk_bytes < model_bytes else model_bytes
    out = []
    chunks = max(1, -(-model_bytes // chunk))
    for e in schedule.edges_of("broadcast"):
        chunk_s = overlay_edge_s(model, e, n_copies, chunk, rate=rate, propagation=propagation)
        for (site, rnd), child_t in received.items():
            if site != e.dst or child_t is None:
                continue
            parent_t, start_t = received.get((e.src, rnd)), received.get((g, rnd))
            if parent_t is None or start_t is None:
                continue
            copy_bytes = int(logged.get((rnd, site), {}).get("bytes", model_bytes))
            wire = copy_bytes / payload_share
            # The last chunk alone, as its frames cross: its bytes, its share of the copy's framing,
            # and the transport's headers (payload_share).
            last = (chunk + max(0, copy_bytes - model_bytes) / chunks) / payload_share
            alone_s = _shaped_s(e, dict.fromkeys(e.links(), last), rate, burst_bytes) + delay_s[e]
            rank = _arrival_ranks(schedule, e, received, rnd, child_t)
            whole_s = _shaped_s(e, {ln: n * wire for ln, n in rank.items()}, rate, burst_bytes) + delay_s[e]
            floor = max(alone_s, start_t + whole_s - parent_t)
            hop = child_t - parent_t
            out.append({"round": rnd, "parent": e.src, "child": e.dst, "hop_s": hop, "chunk_s": chunk_s,
                        "floor_s": floor, "overhead_s": hop - floor})
    return sorted(out, key=lambda r: (r["round"], r["child"]))


def _shaped_s(e: OverlayEdge, link_bytes: Mapping[DirectedLink, float], rate: RateFn,
              burst_bytes: Callable[[str, str], int]) -> float:
    """The least time each link of `e` takes to carry its bytes, less the burst it passes ahead of
    its rate: the slowest link's."""
    return max((max(0.0, link_bytes[ln] - burst_bytes(*ln)) * 8 / (rate(*ln) * 1e6) for ln in e.links()), default=0.0)


def _arrival_ranks(schedule: Schedule, e: OverlayEdge, received: Mapping[tuple[str, int], float | None], rnd: int,
                   child_t: float) -> dict[DirectedLink, int]:
    """For each link of `e`: how many of the round's broadcast copies crossing it were whole by
    `child_t` (e's own included): the copies the link must have carried by then."""
    out = {}
    for ln in e.links():
        done = [received.get((o.dst, rnd)) for o in schedule.edges_of("broadcast") if ln in o.links()]
        out[ln] = max(1, sum(1 for t in done if t is not None and t <= child_t))
    return out


def _bottlenecks(schedule: Schedule, rate: RateFn) -> dict[DirectedLink, list[OverlayEdge]]:
    """G's broadcast edges by the directed link that limits each (its copies over its rate)."""
    copies = link_copies(schedule, "broadcast")
    out: dict[DirectedLink, list[OverlayEdge]] = {}
    for e in schedule.edges_of("broadcast"):
        links = e.links()
        if e.src == schedule.global_site and links:
            out.setdefault(max(links, key=lambda ln: copies[ln] / rate(*ln)), []).append(e)
    return out


def copy_rows(events: Mapping[str, Sequence[Mapping[str, Any]]],
              clock_of: Callable[[float], float] = float) -> dict[tuple[int, str], dict[str, Any]]:
    """What the roles logged of each broadcast copy, by (round, child): ``start_s``, when its sender
    started its first chunk on the link (the sender's ``forward_first`` naming the child; through `clock_of`,
    e.g. onto the run's clock), and ``bytes``, the frame bytes the child received (its
    ``global_received``'s ``nbytes``). Either is absent where the engine does not log it."""
    out: dict[tuple[int, str], dict[str, Any]] = {}
    for site, evs in events.items():
        for e in evs:
            r, name = e.get("round"), e.get("event")
            if not isinstance(r, int):
                continue
            if name == "forward_first" and "peer" in e and "t" in e:
                out.setdefault((r, str(e["peer"])), {}).setdefault("start_s", clock_of(float(e["t"])))
            elif name == "global_received" and "nbytes" in e:
                out.setdefault((r, site), {}).setdefault("bytes", int(e["nbytes"]))
    return out


def _busy_s(spans: Sequence[tuple[float, float]]) -> float:
    """The length of the union of the intervals `spans`."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def link_rate_rows(model: NetworkModel, schedule: Schedule, node_rows: Sequence[Mapping[str, Any]], *,
                   model_bytes: int, rate: RateFn, propagation: bool,
                   copies: Mapping[tuple[int, str], Mapping[str, Any]] | None = None,
                   burst_bytes: Callable[[str, str], int] = lambda a, b: 0) -> list[dict[str, Any]]:
    """One row per round and saturated directed link (see the module docstring): round, a, b, bytes
    (what the copies crossing it put on it), expected_s (those bytes at the configured rate, plus the
    longest of the copies' propagations where delay is emulated), measured_s (the time the link was
    busy: the union of the copies' flights) and rate_share (expected over measured: 1 is the
    configured rate; TCP/IP's headers alone give about 0.95).

    `copies` is `copy_rows` of the task's events (None: every copy falls back, see the module docstring);
    `burst_bytes` what each directed link passes ahead of its rate (the network port's ``link_burst_bytes``)."""
    received = {(r["site"], r["round"]): r.get("received_s") for r in node_rows}
    g = schedule.global_site
    n_copies = link_copies(schedule, "broadcast")
    rounds = sorted(rnd for site, rnd in received if site == g)
    logged_copies = copies or {}
    out = []
    for (a, b) in sorted(_bottlenecks(schedule, rate)):
        if n_copies[(a, b)] * model_bytes < max(SATURATING_FLOOR_BYTES, SATURATING_BURSTS * burst_bytes(a, b)):
            continue
        crossing = [e for e in schedule.edges_of("broadcast") if (a, b) in e.links()]
        delay = max(overlay_edge_s(model, e, n_copies, 0, rate=rate, propagation=propagation) for e in crossing)
        for rnd in rounds:
            start, spans, nbytes = received.get((g, rnd)), [], 0
            if start is None:
                continue
            for e in crossing:
                end, logged = received.get((e.dst, rnd)), logged_copies.get((rnd, e.dst), {})
                if end is None:
                    break
                spans.append((min(float(logged.get("start_s", start)), end), end))
                nbytes += int(logged.get("bytes", model_bytes))
            measured = _busy_s(spans) if len(spans) == len(crossing) else 0.0
            if measured > 0:
                expected = nbytes * 8.0 / (rate(a, b) * 1e6) + delay
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
