"""The SimGrid side of the flow-level simulation: run in a child process of its own.

``python -m orchestrator.simulation.engine SPEC OUT`` reads a spec (`spec.build_spec`'s JSON),
builds the platform, runs every task run of the spec one after the other in simulated time and
writes what each node did (the agents' timing events, the same names and meaning as the
emulation's) and the bytes each directed link carried.

Why a process of its own: SimGrid has one engine per process, created once and run once; the
parent may simulate many times. Input and output are JSON files (no pickling).

Platform. One star zone. Every directed link of the topology is one SimGrid link (a full-duplex
link's two directions are independent, as in the emulation), of bandwidth `rate_mbps` and zero
latency. Every distinct directed path the schedules use gets a pair of endpoint hosts whose route
is exactly that path's links (SimGrid's routing would pick one per pair of sites). Flows that share a link share
its bandwidth max-min (SimGrid's CM02 model without its TCP factors: `network/model:CM02`,
`network/crosstraffic:0`, `network/TCP-gamma:0`; the calibration factors are applied by the spec).

Propagation. Links have no SimGrid latency: a chunk's propagation (the path's fiber delay plus a
per-hop latency, from the spec) is added when its transmission ends, so that the chunks of one
overlay edge stream back to back (one TCP connection) instead of each paying the path's latency.

The emulation's shaper (only when the runs have a ``shaper_burst_k`` > 0, a twin of an emulated run):
each segment's first bytes, as many as its bottleneck link's htb bucket holds, cross at once and the
rest at the rate (`orchestrator.simulation.shaper`).

Transfers. A chunk carries its share of the model's bytes and of the copy's frame headers (the run's
``frame_bytes``: fixed, JSON and safetensors headers; 0 when not modelled), on the links and in
their time. Each overlay edge sends its chunks in order, round after round: chunk k leaves once the
sender holds it (broadcast: it arrived from the parent; upload: every upload child's chunk k
arrived and, at a local, its own training ended), `alpha_s` of per-chunk work later, and once
chunk k-1 has left. That work is done one chunk after another and overlaps the transmission of the
chunks before (an agent frames the next chunk while its sender thread and the socket's buffer keep
the link busy): it adds to each node's latency and bounds a transfer at one chunk per `alpha_s`,
but does not add to every chunk's transmission. Nodes forward cut-through and aggregate per
chunk. A local's training ends `train_s` after the last chunk of the global model reached it; G
aggregates when the last chunk of every upload child arrived, and starts the next round then. The sender of a broadcast copy logs
``forward_first`` (naming the child) when the copy's first segment starts, as an agent logs it (its
first chunk's start on the link; the shaped-link rate's flights, `orchestrator.lifecycle.fidelity`).

How it runs. The spec's runs are independent (the sequential mode), so each is one discrete-event
loop in a single SimGrid actor (Python actors are threads; a hand-off per chunk was most of the time):

- an overlay edge whose path shares no directed link with another edge of its run is never
  contended, so its chunks are computed, not simulated: each takes its size over the path's
  slowest link (what SimGrid gives a lone flow), exactly;
- an edge that shares a link is simulated chunk by chunk as a SimGrid communication, started at
  its exact time, so the links it shares are shared max-min;
- the chunks of a transfer may be merged into at most ``max_segments`` segments (0: no merging):
  a segment of q chunks carries their bytes and q x `alpha_s` of work, so one hop's time is
  unchanged and a chain of h hops fills its pipeline with one segment instead of one chunk,
  at most (h - 1) x (q - 1) x (alpha_s + chunk / rate) later per procedure (see
  docs/simulation.md, "Flow-level simulation").

Background (only when the spec has a ``background`` section, `orchestrator.simulation.background`):
each flow is a daemon actor that sends along its path, at most at its rate (a link of its own in
its route), during each of its on periods; with the CPU model, a second one sends its switching
work through the switch and the cores. An edge that crosses a link of the background is simulated.

ACKs (only when the runs have an ``ack_share`` > 0): each path also gets a host whose route is its
links reversed; each segment also sends ``ack_share`` x its bytes there, and has left once both are
done. An edge whose links another edge or the background crosses the other way is then simulated.

CPU (only when the spec has a ``cpu`` section, `spec.SimParams.cpu_cores`). Two more links, "cpu"
of the machine's cores and "switch" of as many (the userspace datapath's threads), in
nanoseconds of CPU per second, and for each path a link of one core: each transmission of a segment
also sends its workers' CPU work (its bytes x the per-byte cost) through the path's core and the
machine's cores, and its switching work (its bytes x its hops x the per-hop cost) through the
switch and the machine's cores; the segment has left once all three are done. Transmissions in flight thus share the
cores and the switch max-min; every edge is then simulated (the CPU is shared by all of them).
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.simulation import sg_platform
from orchestrator.simulation.frames import chunk_sizes
from orchestrator.simulation.shaper import Bucket, give_buckets

CONFIG = ["--cfg=network/model:CM02", "--cfg=network/crosstraffic:0", "--cfg=network/TCP-gamma:0",
          "--cfg=contexts/factory:thread", "--log=root.thres:critical", "--log=xbt_cfg.thres:critical"]



@dataclass
class _Edge:
    procedure: str
    src: str
    dst: str
    links: list[tuple[str, str]]
    delay_s: float
    #: Bytes per second of the path's slowest link (a lone flow's rate).
    rate: float
    #: Shares a directed link with another edge of its run (or the CPU is modelled): simulated by SimGrid.
    contended: bool
    hosts: tuple[Any, Any]
    #: CPU work per byte sent, in nanoseconds (the CPU model): the workers' and the switching of the path's hops.
    cpu_ns_per_byte: float = 0.0
    switch_ns_per_byte: float = 0.0
    #: The hosts whose routes are the path's own core and the machine's cores, the switch, and the
    #: path reversed (where the edge's ACKs go; None: not modelled).
    cpu_host: Any = None
    switch_host: Any = None
    ack_host: Any = None
    #: Ready time at the sender of each segment not sent yet, by (round - 1) * segments + j.
    ready: dict[int, float] = field(default_factory=dict)
    #: The lane's copies before and after this one (sent one after another); rounds whose copy left whole.
    after: _Edge | None = None
    before: _Edge | None = None
    left_rounds: int = 0
    left_at: float = 0.0
    next_idx: int = 0
    #: When the sender's per-segment work (`alpha_s` per chunk) for the last segment ended; the path last free.
    framed: float = 0.0
    free: float = 0.0
    busy: bool = False
    sent_bytes: int = 0
    #: The emulation's shaper at the path's bottleneck (`orchestrator.simulation.shaper`; None: not modelled).
    bucket: Bucket | None = None


def _edges(spec: dict[str, Any], hosts: dict[tuple[str, ...], tuple[Any, ...]], delays: dict[tuple[str, ...], float],
           rates: dict[tuple[str, str], float], cpu: dict[str, float] | None, workers: dict[tuple[str, str], Any],
           varying: frozenset[tuple[str, str]], acks: dict[tuple[str, ...], Any] | None = None) -> list[_Edge]:
    """A run's overlay edges: each simulated (contended) when it shares a directed link with another
    of its edges or with the background, or, with ACKs modelled (`acks`, the paths' reverse hosts),
    when another edge or the background crosses one of its links the other way, or when the CPU is
    modelled; else computed."""
    paths = [tuple(e["path"]) for e in spec["edges"]]
    users: dict[tuple[str, str], list[dict[str, Any]]] = {}  # the edges crossing each directed link
    for e, path in zip(spec["edges"], paths, strict=True):
        for link in itertools.pairwise(path):
            users.setdefault(link, []).append(e)

    def other_way(e: dict[str, Any], link: tuple[str, str]) -> bool:
        """Whether the background or an edge that may run at the same time crosses `link` reversed:
        not `e`'s mirror (the same pair the other way, the other procedure), which starts only
        after `e` has ended (an upload leaves a node once the whole model reached it)."""
        back = (link[1], link[0])
        return back in varying or any(not (f["src"] == e["dst"] and f["dst"] == e["src"]
                                           and f["procedure"] != e["procedure"]) for f in users.get(back, ()))

    edges: list[_Edge] = []
    acks = acks or {}
    for e, path in zip(spec["edges"], paths, strict=True):
        links = list(itertools.pairwise(path))
        two_way = bool(acks) and any(other_way(e, ln) for ln in links)
        work = 0.0 if cpu is None else 1e9 * cpu["s_per_byte"]
        switching = 0.0 if cpu is None else 1e9 * len(links) * cpu["s_per_byte_hop"]
        edges.append(_Edge(e["procedure"], e["src"], e["dst"], links, delays[path], min(rates[ln] for ln in links),
                           cpu is not None or two_way or any(len(users[ln]) > 1 or ln in varying for ln in links),
                           hosts[path][:2], work, switching, workers.get((e["src"], e["dst"])),
                           hosts[path][2] if len(hosts[path]) > 2 else None, acks.get(path)))
    return edges


class _Run:
    """One task run: its nodes' state and its edges' transfers, one discrete-event loop."""

    def __init__(self, spec: dict[str, Any], hosts: dict[tuple[str, ...], tuple[Any, ...]],
                 delays: dict[tuple[str, ...], float], rates: dict[tuple[str, str], float],
                 cpu: dict[str, float] | None = None, workers: dict[tuple[str, str], Any] | None = None,
                 varying: frozenset[tuple[str, str]] = frozenset(), acks: dict[tuple[str, ...], Any] | None = None
                 ) -> None:
        self.key = spec["key"]
        self.g: str = spec["global"]
        self.locals: set[str] = set(spec["locals"])
        self.rounds: int = int(spec["rounds"])
        self.model_bytes: int = int(spec["model_bytes"])
        self.chunk: int = int(spec["chunk_bytes"])
        sizes = chunk_sizes(spec)
        self.k = len(sizes)
        alpha = float(spec["alpha_s"])
        limit = int(spec.get("max_segments", 0))
        per = 1 if limit <= 0 else math.ceil(self.k / limit)
        self.m = math.ceil(self.k / per)
        self.seg_bytes = [sum(sizes[j * per:(j + 1) * per]) for j in range(self.m)]
        self.seg_alpha = [alpha * len(sizes[j * per:(j + 1) * per]) for j in range(self.m)]
        per_chunk = 0.0 if cpu is None else 1e9 * float(cpu.get("s_per_chunk", 0.0))
        #: Fixed CPU work of each segment, in nanoseconds (its chunks' per-chunk cost).
        self.seg_work = [per_chunk * len(sizes[j * per:(j + 1) * per]) for j in range(self.m)]
        self.train_s: dict[str, float] = {s: float(t) for s, t in spec["train_s"].items()}
        #: With the CPU model: each local's training as CPU seconds of one host core (real work).
        self.train_cpu_s: dict[str, float] = {s: float(t) for s, t in spec.get("train_cpu_s", {}).items()} \
            if cpu is not None else {}
        #: Trainings to start as CPU work (node, round, start, modelled end), and the sites' hosts.
        self.trainings: list[tuple[str, int, float, float]] = []
        self.training_of: list[tuple[str, int, float]] = []
        self.trainers: dict[str, Any] = {}
        self.ack_share = float(spec.get("ack_share", 0.0))  # ACK bytes per byte sent, on the path reversed
        self.edges = _edges(spec, hosts, delays, rates, cpu, workers or {}, varying, acks if self.ack_share else None)
        if (burst_k := float(spec.get("shaper_burst_k", 0.0))) > 0:
            give_buckets(self.edges, rates, burst_k, float(spec.get("payload_share", 1.0)))
        self.ahead: dict[tuple[int, int], float] = {}  # a contended segment's bytes its bucket passed at once
        #: Where the CPU work goes (a host with an empty route to it).
        self.sink: Any = None
        self.out_bc: dict[str, list[_Edge]] = {}
        self.out_up: dict[str, _Edge] = {}
        self.up_children: dict[str, int] = {}
        self._chain_lanes(spec.get("lanes", {}))
        self._wire()
        self.events: dict[str, list[dict[str, Any]]] = {}
        self.got_bc: dict[tuple[str, int], tuple[int, float]] = {}
        self.up_count: dict[tuple[str, int], int] = {}
        self.up_ready: dict[tuple[str, int], float] = {}
        self.g_done: dict[int, tuple[int, float]] = {}
        #: Segments that arrived (edge, index, time), not yet handed to their receiver.
        self.arrivals: list[tuple[_Edge, int, float]] = []
        #: Segments of contended edges to hand to SimGrid, by start time.
        self.sends: list[tuple[float, int, _Edge | None, int]] = []
        self.seq = itertools.count()
        self.start_s = 0.0
        self.end_s = 0.0
        self.flying: list[Any] = []
        self.owners: list[tuple[_Edge | None, int]] = []
        self.parts: dict[tuple[int, int], int] = {}

    def event(self, site: str, name: str, rnd: int, t: float, **extra: Any) -> None:
        self.events.setdefault(site, []).append({"event": name, "round": rnd, "t": t, "site": site, **extra})

    # -- state changes --------------------------------------------------------------------------------
    def ready(self, e: _Edge, idx: int, t: float) -> None:
        """Segment `idx` of edge `e` is held by its sender at `t`: send it when it is its turn."""
        e.ready[idx] = t
        self.pump(e)

    def _wire(self) -> None:
        """Each node's outgoing broadcast edges, its upload edge, and how many upload children it has."""
        for edge in self.edges:
            if edge.procedure == "broadcast":
                self.out_bc.setdefault(edge.src, []).append(edge)
            else:
                self.out_up[edge.src] = edge
                self.up_children[edge.dst] = self.up_children.get(edge.dst, 0) + 1

    def _chain_lanes(self, lanes: dict[str, list[list[str]]]) -> None:
        """Link each lane's broadcast edges in their sending order."""
        by = {(e.src, e.dst): e for e in self.edges if e.procedure == "broadcast"}
        for node, node_lanes in lanes.items():
            for lane in node_lanes:
                for a, b in itertools.pairwise(lane):
                    first, second = by[(node, a)], by[(node, b)]
                    first.before, second.after = second, first

    def pump(self, e: _Edge) -> None:
        """Send `e`'s next segments, in order, as far as they are held, the edge is free and (in a
        lane) the copy before it has left whole."""
        while not e.busy and e.next_idx in e.ready and \
                (e.after is None or e.after.left_rounds > e.next_idx // self.m):
            idx = e.next_idx
            j = idx % self.m
            # the sender's per-segment work, one segment after another, overlaps the transmission
            # before it (an agent frames the next chunk while its sender thread and the socket's
            # buffer keep the link busy): it delays a segment's start, and bounds the rate
            e.framed = max(e.ready.pop(idx), e.framed) + self.seg_alpha[j]
            at = max(e.framed, e.free, e.after.left_at if e.after is not None else 0.0)
            e.next_idx += 1
            if j == 0 and e.procedure == "broadcast":  # a copy's first chunk goes (`fidelity.copy_rows`)
                self.event(e.src, "forward_first", idx // self.m + 1, at, peer=e.dst)
            passed = 0.0 if e.bucket is None else e.bucket.ahead(at, self.seg_bytes[j])
            if e.contended:  # SimGrid transmits it, from `at` on
                e.busy = True
                self.ahead[(id(e), idx)] = passed
                heapq.heappush(self.sends, (at, next(self.seq), e, idx))
            else:
                self.sent(e, idx, at + (self.seg_bytes[j] - passed) / e.rate)

    def sent(self, e: _Edge, idx: int, end: float) -> None:
        """Segment `idx` of edge `e` left its sender completely at `end`."""
        e.free = end
        if e.bucket is not None:
            e.bucket.left(end)
        e.sent_bytes += self.seg_bytes[idx % self.m]
        if e.procedure == "upload" and idx % self.m == self.m - 1:
            self.event(e.src, "update_sent", idx // self.m + 1, end)
        if idx % self.m == self.m - 1:
            e.left_rounds, e.left_at = idx // self.m + 1, end
            if e.before is not None:
                self.pump(e.before)  # the lane's next copy goes now
        self.arrivals.append((e, idx, end + e.delay_s))

    def start_round(self, rnd: int, t: float) -> None:
        self.event(self.g, "round_start", rnd, t)
        base = (rnd - 1) * self.m
        for e in self.out_bc.get(self.g, []):
            for j in range(self.m):
                self.ready(e, base + j, t)

    def arrived(self, e: _Edge, idx: int, t: float) -> None:
        if e.procedure == "broadcast":
            self.broadcast_arrived(e.dst, idx, t)
        else:
            self.upload_part(e.dst, idx, t)

    def broadcast_arrived(self, node: str, idx: int, t: float) -> None:
        for e in self.out_bc.get(node, []):
            self.ready(e, idx, t)
        rnd = idx // self.m + 1
        n, last = self.got_bc.pop((node, rnd), (0, t))
        n, t = n + 1, max(last, t)
        if n < self.m:
            self.got_bc[(node, rnd)] = (n, t)
            return
        self.event(node, "global_received", rnd, t)
        if node in self.locals:
            end = t + self.train_s.get(node, 0.0)
            self.event(node, "train_start", rnd, t)
            if self.train_cpu_s.get(node, 0.0) > 0 and node in self.trainers:
                self.trainings.append((node, rnd, t, end))  # ends when its CPU work is done too
                return
            self.trained(node, rnd, end)

    def trained(self, node: str, rnd: int, end: float) -> None:
        """`node`'s training of round `rnd` ended at `end`: its update is ready to go up."""
        self.event(node, "train_end", rnd, end)
        for j in range(self.m):
            self.upload_part(node, (rnd - 1) * self.m + j, end)

    def upload_part(self, node: str, idx: int, t: float) -> None:
        """One part of segment `idx` of `node`'s upload (its own update, or a child's) is there at `t`."""
        key = (node, idx)
        need = self.up_children.get(node, 0) + (1 if node in self.locals else 0)
        n = self.up_count[key] = self.up_count.get(key, 0) + 1
        ready = self.up_ready[key] = max(self.up_ready.get(key, 0.0), t)
        if n < need:
            return
        del self.up_count[key], self.up_ready[key]
        if node != self.g:
            self.ready(self.out_up[node], idx, ready)
            return
        rnd = idx // self.m + 1
        n, last = self.g_done.pop(rnd, (0, ready))
        n, last = n + 1, max(last, ready)
        if n < self.m:
            self.g_done[rnd] = (n, last)
        else:
            self.event(node, "aggregated", rnd, last)
            self.event(node, "round_complete", rnd, last)
            if rnd < self.rounds:
                self.start_round(rnd + 1, last)
            else:
                self.end_s = last

    # -- the loop -------------------------------------------------------------------------------------
    def run(self, start: float) -> None:
        """Run every round from `start` (in the calling actor; SimGrid's clock is at most `start`)."""
        import simgrid

        engine = simgrid.Engine
        self.start_s = start
        self.start_round(1, start)
        arrivals, sends = self.arrivals, self.sends
        #: Activities in flight and what each is part of: (edge, segment index) or (None, training);
        #: per segment in flight, its activities (network, CPU) still running.
        self.flying, self.owners, self.parts = [], [], {}
        while True:
            # Arrivals first, whatever their times: they only compute (node state is a max over
            # times), and whatever they make SimGrid send starts no earlier than they arrive.
            while arrivals:
                self.arrived(*arrivals.pop())
            while self.trainings:  # trainings start as CPU work at their times, like sends
                node, rnd, t, end = self.trainings.pop()
                heapq.heappush(sends, (t, next(self.seq), None, len(self.training_of)))
                self.training_of.append((node, rnd, end))
            if not sends and not self.flying:
                break
            if self.flying and (not sends or sends[0][0] > engine.clock):
                if sends:
                    i = simgrid.Comm.wait_any_for(self.flying, sends[0][0] - engine.clock)
                else:
                    i = simgrid.Comm.wait_any(self.flying)
                if i >= 0:  # a transmission (or its CPU work, or a training) ended before the next start
                    self.finished(i, engine.clock)
                    continue
            at, _, e, idx = heapq.heappop(sends)
            if at > engine.clock:
                simgrid.this_actor.sleep_until(at)
            self.start_activity(e, idx)
        for events in self.events.values():
            events.sort(key=lambda ev: ev["t"])

    def start_activity(self, e: _Edge | None, idx: int) -> None:
        """Hand SimGrid a segment's transmission and its CPU work, or (`e` None) a training's CPU work."""
        import simgrid

        if e is None:
            node = self.training_of[idx][0]
            work = round(1e9 * self.train_cpu_s[node])
            self.flying.append(simgrid.Comm.sendto_async(self.trainers[node], self.sink, work))
            self.owners.append((None, idx))
            return
        size = self.seg_bytes[idx % self.m]
        rest = max(1, round(size - self.ahead.pop((id(e), idx), 0.0)))
        self.flying.append(simgrid.Comm.sendto_async(e.hosts[0], e.hosts[1], rest))
        self.owners.append((e, idx))
        self.parts[(id(e), idx)] = 1
        for host, ns, fixed in ((e.cpu_host, e.cpu_ns_per_byte, self.seg_work[idx % self.m]),
                                (e.switch_host, e.switch_ns_per_byte, 0.0),
                                (e.ack_host, self.ack_share, 0.0)):
            work = round(size * ns + fixed)
            if work and host is not None:  # its CPU work or its ACKs, alongside
                self.flying.append(simgrid.Comm.sendto_async(host, self.sink, work))
                self.owners.append((e, idx))
                self.parts[(id(e), idx)] += 1

    def finished(self, i: int, now: float) -> None:
        """Activity `i` in flight ended at `now`: its segment left once all its parts are done; a
        training ends at the later of its CPU work and its modelled end."""
        self.flying.pop(i)
        e, idx = self.owners.pop(i)
        if e is None:
            node, rnd, end = self.training_of[idx]
            self.trained(node, rnd, max(now, end))
            return
        left = self.parts.pop((id(e), idx)) - 1
        if left:
            self.parts[(id(e), idx)] = left
            return
        e.busy = False
        self.sent(e, idx, now)
        self.pump(e)

    def link_bytes(self) -> list[list[Any]]:
        total: dict[tuple[str, str], int] = {}
        for e in self.edges:
            for link in e.links:
                total[link] = total.get(link, 0) + e.sent_bytes
        return [[u, v, n] for (u, v), n in sorted(total.items()) if n]


def simulate(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the platform of `spec` and run its task runs one after the other (in this process,
    which can hold one SimGrid engine only: call it once per process)."""
    import simgrid
    from simgrid import Actor, Engine, NetZone

    wall0 = time.monotonic()
    engine = Engine(["netai-sim", *CONFIG])
    zone = NetZone.create_star_zone("net")
    links, rates = sg_platform.links(zone, spec)
    ctl = zone.create_host("ctl", 1e9)
    zone.add_route(None, ctl.netpoint, None, None, [], False)
    cpu = spec.get("cpu")
    # The CPU model: the machine's cores as one link (nanoseconds of CPU per second), and for each
    # path a link of one core, so that one transmission's CPU work runs on one core at most.
    cores = zone.create_link("cpu", 1e9 * float(cpu["cores"])).set_latency(0).seal() if cpu else None
    switch = zone.create_link("switch", 1e9 * float(cpu["cores"])).set_latency(0).seal() if cpu else None
    varying, background = sg_platform.background(zone, spec, links, ctl, [switch, cores] if cpu else [])
    hosts, delays = sg_platform.path_hosts(zone, spec, links, [switch, cores] if cpu else None)
    workers = sg_platform.worker_hosts(zone, spec, cores) if cores is not None else {}
    acks = sg_platform.ack_hosts(zone, spec, links)
    trainers = sg_platform.trainer_hosts(zone, spec, cores) if cores is not None else {}
    zone.seal()
    out: list[dict[str, Any]] = []
    clock = [0.0]

    def driver() -> None:
        for run_spec in spec["runs"]:
            run = _Run(run_spec, hosts, delays, rates, cpu, workers, varying, acks)
            run.sink, run.trainers = ctl, trainers
            run.run(max(clock[0], Engine.clock))
            clock[0] = run.end_s
            out.append({"key": run.key, "start_s": run.start_s, "end_s": run.end_s, "chunks": run.k,
                        "chunk_bytes": run.chunk, "segments": run.m, "events": run.events,
                        "link_bytes": run.link_bytes()})
        if clock[0] > Engine.clock:
            simgrid.this_actor.sleep_until(clock[0])

    Actor.create("driver", ctl, driver)
    sg_platform.start_background(background, ctl)
    engine.run()
    return {"runs": out, "sim_end_s": Engine.clock, "wall_s": time.monotonic() - wall0,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m orchestrator.simulation.engine SPEC.json OUT.json", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text())
    Path(argv[1]).write_text(json.dumps(simulate(spec)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
