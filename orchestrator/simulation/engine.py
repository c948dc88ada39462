"""The SimGrid side of the flow-level simulation: run in a child process of its own.

``python -m orchestrator.simulation.engine SPEC.json OUT.json`` reads a spec (`spec.SimSpec` as
JSON), builds the platform, runs every task run of the spec one after the other in simulated time
and writes what each node did (the agents' timing events, the same names and meaning as the
emulation's) and the bytes each directed link carried.

Why a process of its own: SimGrid has one engine per process, created once and run once; the
parent (the experiment, a test, the benchmark) may simulate many times. Input and output are JSON
files (no pickling).

Platform. One star zone. Every directed link of the topology is one SimGrid link (a full-duplex
link's two directions are independent, as in the emulation), of bandwidth `rate_mbps` and zero
latency. Every distinct directed path the schedules use gets a pair of endpoint hosts whose route
is exactly that path's links, so a transfer along an overlay edge crosses the links the schedule
chose (SimGrid's own routing would pick one route per pair of sites). Flows that share a link share
its bandwidth max-min (SimGrid's CM02 model without its TCP factors: `network/model:CM02`,
`network/crosstraffic:0`, `network/TCP-gamma:0`; the calibration factors are applied by the spec).

Propagation. Links have no SimGrid latency: a chunk's propagation (the path's fiber delay plus a
per-hop latency, from the spec) is added when its transmission ends, so that the chunks of one
overlay edge stream back to back (one TCP connection) instead of each paying the path's latency.

Actors. One actor per overlay edge of a task (its sender side: a "pump") and one driver. A pump
sends its edge's chunks in order, round after round: chunk k leaves once the sender holds it
(broadcast: it arrived from the parent; upload: every upload child's chunk k arrived and, at a
local, its own training ended) and once chunk k-1 has left, after `alpha_s` of per-chunk work.
Nodes need no actor: their state changes when a pump delivers a chunk (cut-through forwarding,
per-chunk aggregation). Training is not run: a local's training ends `train_s` after the last
chunk of the global model reached it. G aggregates when the last chunk of every upload child
arrived, and starts the next round then.
"""

from __future__ import annotations

import itertools
import json
import math
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CONFIG = ["--cfg=network/model:CM02", "--cfg=network/crosstraffic:0", "--cfg=network/TCP-gamma:0",
          "--cfg=contexts/factory:thread", "--log=root.thres:critical", "--log=xbt_cfg.thres:critical"]


@dataclass
class _Edge:
    procedure: str
    src: str
    dst: str
    path: tuple[str, ...]
    delay_s: float
    src_host: Any = None
    dst_host: Any = None
    sem: Any = None
    #: Ready time of each chunk at the sender, by (round - 1) * chunks + k.
    ready: dict[int, float] = field(default_factory=dict)


class _Run:
    """One task run: its nodes' state, changed by the pumps as chunks arrive."""

    def __init__(self, spec: dict[str, Any], hosts: dict[tuple[str, ...], tuple[Any, Any]],
                 delays: dict[tuple[str, ...], float]) -> None:
        import simgrid

        self.key = spec["key"]
        self.g: str = spec["global"]
        self.locals: set[str] = set(spec["locals"])
        self.rounds: int = int(spec["rounds"])
        self.model_bytes: int = int(spec["model_bytes"])
        self.chunk: int = int(spec["chunk_bytes"])
        self.k = max(1, math.ceil(self.model_bytes / self.chunk))
        self.alpha: float = float(spec["alpha_s"])
        self.train_s: dict[str, float] = {s: float(t) for s, t in spec["train_s"].items()}
        self.edges: list[_Edge] = []
        for e in spec["edges"]:
            path = tuple(e["path"])
            src_host, dst_host = hosts[path]
            self.edges.append(_Edge(e["procedure"], e["src"], e["dst"], path, delays[path], src_host, dst_host,
                                    simgrid.Semaphore(0)))
        self.out_bc: dict[str, list[_Edge]] = {}
        self.out_up: dict[str, _Edge] = {}
        self.up_children: dict[str, int] = {}
        for e in self.edges:
            if e.procedure == "broadcast":
                self.out_bc.setdefault(e.src, []).append(e)
            else:
                self.out_up[e.src] = e
                self.up_children[e.dst] = self.up_children.get(e.dst, 0) + 1
        self.events: dict[str, list[dict[str, Any]]] = {}
        # Per node and round: broadcast chunks received; per node and chunk index: upload parts in, ready time.
        self.got_bc: dict[tuple[str, int], int] = {}
        self.up_count: dict[tuple[str, int], int] = {}
        self.up_ready: dict[tuple[str, int], float] = {}
        self.up_last: dict[tuple[str, int], float] = {}
        self.done = simgrid.Semaphore(0)
        self.start_s = 0.0
        self.end_s = 0.0
        self.link_bytes: dict[tuple[str, str], int] = {}

    def chunk_size(self, k: int) -> int:
        return self.chunk if k < self.k - 1 else self.model_bytes - self.chunk * (self.k - 1)

    def event(self, site: str, name: str, rnd: int, t: float, **extra: Any) -> None:
        self.events.setdefault(site, []).append({"event": name, "round": rnd, "t": t, "site": site, **extra})

    # -- state changes --------------------------------------------------------------------------------
    def start_round(self, rnd: int, t: float) -> None:
        self.event(self.g, "round_start", rnd, t)
        base = (rnd - 1) * self.k
        for e in self.out_bc.get(self.g, []):
            for k in range(self.k):
                e.ready[base + k] = t
                e.sem.release()

    def broadcast_arrived(self, node: str, idx: int, t: float) -> None:
        for e in self.out_bc.get(node, []):
            e.ready[idx] = t
            e.sem.release()
        rnd = idx // self.k + 1
        n = self.got_bc[(node, rnd)] = self.got_bc.get((node, rnd), 0) + 1
        if n < self.k:
            return
        self.event(node, "global_received", rnd, t)
        if node in self.locals:
            end = t + self.train_s.get(node, 0.0)
            self.event(node, "train_start", rnd, t)
            self.event(node, "train_end", rnd, end)
            for k in range(self.k):
                self.upload_part(node, (rnd - 1) * self.k + k, end)

    def upload_part(self, node: str, idx: int, t: float) -> None:
        """One part of chunk `idx` of `node`'s upload (its own update, or a child's chunk) is there at `t`."""
        key = (node, idx)
        need = self.up_children.get(node, 0) + (1 if node in self.locals else 0)
        n = self.up_count[key] = self.up_count.get(key, 0) + 1
        ready = self.up_ready[key] = max(self.up_ready.get(key, 0.0), t)
        if n < need:
            return
        del self.up_count[key], self.up_ready[key]
        rnd = idx // self.k + 1
        if node != self.g:
            e = self.out_up[node]
            e.ready[idx] = ready
            e.sem.release()
            return
        last = self.up_last[(node, rnd)] = max(self.up_last.get((node, rnd), 0.0), ready)
        if idx % self.k == self.k - 1:  # chunks of one round complete in order at G
            self.event(node, "aggregated", rnd, last)
            self.event(node, "round_complete", rnd, last)
            if rnd < self.rounds:
                self.start_round(rnd + 1, last)
            else:
                self.end_s = last
                self.done.release()

    # -- actors ---------------------------------------------------------------------------------------
    def pump(self, e: _Edge) -> None:
        import simgrid

        links = e.src_host.route_to(e.dst_host)[0]
        names = [ln.name for ln in links]
        free = 0.0
        for rnd in range(1, self.rounds + 1):
            for k in range(self.k):
                idx = (rnd - 1) * self.k + k
                e.sem.acquire()
                at = max(e.ready.pop(idx), free) + self.alpha
                if at > simgrid.Engine.clock:
                    simgrid.this_actor.sleep_until(at)
                size = self.chunk_size(k)
                simgrid.Comm.sendto_async(e.src_host, e.dst_host, size).wait()
                free = simgrid.Engine.clock
                for name in names:
                    u, v = name.split(">")
                    self.link_bytes[(u, v)] = self.link_bytes.get((u, v), 0) + size
                arrival = free + e.delay_s
                if e.procedure == "broadcast":
                    self.broadcast_arrived(e.dst, idx, arrival)
                else:
                    self.upload_part(e.dst, idx, arrival)
                if k == self.k - 1 and e.procedure == "upload":
                    self.event(e.src, "update_sent", rnd, free)


def simulate(spec: dict[str, Any]) -> dict[str, Any]:
    """Build the platform of `spec` and run its task runs one after the other (in this process,
    which can hold one SimGrid engine only: call it once per process)."""
    import simgrid
    from simgrid import Actor, Engine, LinkInRoute, NetZone

    wall0 = time.monotonic()
    engine = Engine(["netai-sim", *CONFIG])
    zone = NetZone.create_star_zone("net")
    links = {}
    for ln in spec["links"]:
        bps = float(ln["rate_mbps"]) * 1e6 / 8.0
        links[(ln["a"], ln["b"])] = zone.create_link(f"{ln['a']}>{ln['b']}", bps).set_latency(0).seal()
    ctl = zone.create_host("ctl", 1e9)
    zone.add_route(None, ctl.netpoint, None, None, [], False)
    hosts: dict[tuple[str, ...], tuple[Any, Any]] = {}
    delays: dict[tuple[str, ...], float] = {}
    for i, p in enumerate(spec["paths"]):
        path = tuple(p["path"])
        a, b = zone.create_host(f"p{i}s", 1e9), zone.create_host(f"p{i}d", 1e9)
        route = [LinkInRoute(links[(u, v)]) for u, v in itertools.pairwise(path)]
        zone.add_route(a.netpoint, None, None, None, route, False)
        zone.add_route(None, b.netpoint, None, None, [], False)
        hosts[path] = (a, b)
        delays[path] = float(p["delay_s"])
    zone.seal()
    out: list[dict[str, Any]] = []

    def driver() -> None:
        for run_spec in spec["runs"]:
            run = _Run(run_spec, hosts, delays)
            run.start_s = Engine.clock
            for j, e in enumerate(run.edges):
                Actor.create(f"{run.key}/{j}", ctl, run.pump, e)
            run.start_round(1, run.start_s)
            run.done.acquire()
            if run.end_s > Engine.clock:
                simgrid.this_actor.sleep_until(run.end_s)
            out.append({"key": run.key, "start_s": run.start_s, "end_s": run.end_s, "chunks": run.k, "chunk_bytes": run.chunk,
                        "events": run.events,
                        "link_bytes": [[u, v, n] for (u, v), n in sorted(run.link_bytes.items())]})

    Actor.create("driver", ctl, driver)
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
