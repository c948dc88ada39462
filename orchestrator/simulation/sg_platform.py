"""The SimGrid platform of a simulation spec: its links and hosts, and the background's actors.

Used by `orchestrator.simulation.engine` only, inside the engine's own process (SimGrid is
imported in the functions). Every directed link of the topology is one SimGrid link; every path a
pair of endpoint hosts whose route is exactly its links; with the CPU model, hosts whose routes put
a transfer's or a training's CPU work through its processes' cores, the switch and the machine's
cores; the background's flows, daemon actors (see the engine's module docstring).
"""

from __future__ import annotations

import itertools
from typing import Any


def links(zone: Any, spec: dict[str, Any]) -> tuple[dict[tuple[str, str], Any], dict[tuple[str, str], float]]:
    """One SimGrid link per directed link of `spec` (no latency: delays are added per path), and
    their rates in bytes/s."""
    links = {}
    rates: dict[tuple[str, str], float] = {}
    for ln in spec["links"]:
        bps = float(ln["rate_mbps"]) * 1e6 / 8.0
        links[(ln["a"], ln["b"])] = zone.create_link(f"{ln['a']}>{ln['b']}", bps).set_latency(0).seal()
        rates[(ln["a"], ln["b"])] = bps
    return links, rates


def background(zone: Any, spec: dict[str, Any], links: dict[tuple[str, str], Any], sink: Any,
                cpu_route: list[Any]) -> tuple[frozenset[tuple[str, str]], list[tuple[Any, dict[str, Any]]]]:
    """The spec's background flows as activities (`background.flow_plans`): per flow, a host whose
    route is a link of its bounded rate and its path (and, with a CPU model and a per-hop cost, one
    whose route is such a link, the switch and the cores). Returns the links the background
    crosses (their task edges are simulated) and (host, plan) pairs for `_start_background`."""
    from simgrid import LinkInRoute

    from orchestrator.simulation.background import flow_plans

    bg = spec.get("background")
    if not bg:
        return frozenset(), []
    rates = {link: float(ln.bandwidth) for link, ln in links.items()}
    ns_hop = 1e9 * float((spec.get("cpu") or {}).get("s_per_byte_hop", 0.0)) if cpu_route else 0.0
    out = []
    for i, plan in enumerate(flow_plans(bg, rates, ns_hop)):
        route = [links[tuple(ln)] for ln in plan["links"]] if plan["kind"] == "net" else cpu_route
        # its bound as a link of its own (Comm.set_rate cannot be set on a host-to-host comm here)
        route = [zone.create_link(f"bg{i}", plan["rate_Bps"]).set_latency(0).seal(), *route]
        host = zone.create_host(f"bg{i}", 1e9)
        zone.add_route(host.netpoint, None, None, None, [LinkInRoute(x) for x in route], False)
        out.append((host, plan))
    crossed = frozenset(tuple(ln) for _, plan in out if plan["kind"] == "net" for ln in plan["links"])
    return crossed, out


def start_background(flows: list[tuple[Any, dict[str, Any]]], sink: Any) -> None:
    """One daemon actor per background activity: on for each on period (its rate bounded by its
    own link), off
    for each off period (a steady flow: on all along); daemons end with the simulation."""
    import simgrid

    def flow(plan: dict[str, Any]) -> None:
        simgrid.Actor.self().daemonize()
        me = simgrid.Actor.self().host
        for on_s, off_s in plan["periods"] or [(1e12, 0.0)]:
            comm = simgrid.Comm.sendto_async(me, sink, int(min(plan["rate_Bps"] * on_s * 2 + 1, 2 ** 62)))
            try:
                comm.wait_for(on_s)
            except simgrid.TimeoutException:
                comm.cancel()
            if off_s > 0:
                simgrid.this_actor.sleep_for(off_s)

    for i, (host, plan) in enumerate(flows):
        simgrid.Actor.create(f"bg{i}", host, flow, plan)


def path_hosts(zone: Any, spec: dict[str, Any], links: dict[tuple[str, str], Any], switch: list[Any] | None
                ) -> tuple[dict[tuple[str, ...], tuple[Any, ...]], dict[tuple[str, ...], float]]:
    """Per path of `spec`: its sending and receiving hosts (and, with a CPU model, the host whose
    work goes through the switch and the machine's cores), and its propagation delay."""
    from simgrid import LinkInRoute

    hosts: dict[tuple[str, ...], tuple[Any, ...]] = {}
    delays: dict[tuple[str, ...], float] = {}
    for i, p in enumerate(spec["paths"]):
        path = tuple(p["path"])
        a, b = zone.create_host(f"p{i}s", 1e9), zone.create_host(f"p{i}d", 1e9)
        route = [LinkInRoute(links[(u, v)]) for u, v in itertools.pairwise(path)]
        zone.add_route(a.netpoint, None, None, None, route, False)
        zone.add_route(None, b.netpoint, None, None, [], False)
        hosts[path] = (a, b)
        if switch is not None:
            w = zone.create_host(f"p{i}w", 1e9)
            zone.add_route(w.netpoint, None, None, None, [LinkInRoute(x) for x in switch], False)
            hosts[path] = (a, b, w)
        delays[path] = float(p["delay_s"])
    return hosts, delays


def ack_hosts(zone: Any, spec: dict[str, Any], links: dict[tuple[str, str], Any]) -> dict[tuple[str, ...], Any]:
    """Per path of `spec`, when its runs model ACKs (``ack_share``): a host whose route is the path's
    links reversed, where a transfer's ACKs go; none otherwise."""
    from simgrid import LinkInRoute

    if not any(float(r.get("ack_share", 0.0)) > 0 for r in spec["runs"]):
        return {}
    out: dict[tuple[str, ...], Any] = {}
    for i, p in enumerate(spec["paths"]):
        path = tuple(p["path"])
        host = out[path] = zone.create_host(f"p{i}a", 1e9)
        zone.add_route(host.netpoint, None, None, None,
                       [LinkInRoute(links[(v, u)]) for u, v in reversed(list(itertools.pairwise(path)))], False)
    return out


def worker_hosts(zone: Any, spec: dict[str, Any], cores: Any) -> dict[tuple[str, str], Any]:
    """The workers' CPU work of each overlay edge of the runs: a host whose route goes through its
    two sites' processes (one core each) and the machine's cores."""
    from simgrid import LinkInRoute

    workers: dict[tuple[str, str], Any] = {}
    procs: dict[str, Any] = {}
    for run_spec in spec["runs"]:
        for e in run_spec["edges"]:
            pair = (e["src"], e["dst"])
            if pair in workers:
                continue
            for site in pair:
                if site not in procs:
                    procs[site] = zone.create_link(f"proc:{site}", 1e9).set_latency(0).seal()
            host = workers[pair] = zone.create_host(f"w:{pair[0]}>{pair[1]}", 1e9)
            zone.add_route(host.netpoint, None, None, None,
                           [LinkInRoute(procs[pair[0]]), LinkInRoute(procs[pair[1]]), LinkInRoute(cores)], False)
    return workers

def trainer_hosts(zone: Any, spec: dict[str, Any], cores: Any) -> dict[str, Any]:
    """The CPU work of each local's training: a host whose route goes through the site's training
    thread (one core) and the machine's cores."""
    from simgrid import LinkInRoute

    trainers: dict[str, Any] = {}
    for run_spec in spec["runs"]:
        for site in run_spec.get("train_cpu_s", {}):
            if site not in trainers:
                thread = zone.create_link(f"train:{site}", 1e9).set_latency(0).seal()
                trainers[site] = zone.create_host(f"t:{site}", 1e9)
                zone.add_route(trainers[site].netpoint, None, None, None,
                               [LinkInRoute(thread), LinkInRoute(cores)], False)
    return trainers
