"""Benchmark: the FL agent's model transfer throughput against raw iperf3 on the same link.

Creates two network namespaces joined by one unshaped link (names carry this process's id; all is
removed on every exit path): ``veth``, one raw veth pair; ``ovs``, each namespace on a userspace
Open vSwitch bridge, the testbed's own host-to-switch data path. It measures raw TCP goodput with iperf3 in each direction,
then runs a real two-agent task (G in one namespace, one local model in the other) with a model
of >= 40 MB of float32 weights and reads the agents' timing events:

- GLOBAL (G -> L): G's ``round_start`` to L's ``global_received`` (encoding, the transfer on the
  round's open connection, and L's per-chunk digest and template checks, all included);
- UPDATE (L -> G): L's ``train_end`` to G's ``aggregated``, likewise.

Throughput = model bytes / that time (both agents log on CLOCK_MONOTONIC of one machine). The figure
printed is the median over rounds as a ratio to iperf3 in the same direction (targets: >= 0.7 on the
raw veth, >= 0.9 over the testbed's own link).

Placement on two cores: iperf3 has one busy thread per side, which the scheduler keeps on separate
cores; an agent has up to two per side (the connection's reader or sender thread, and the round
loop while it queues or copies chunks), and when the scheduler puts both sides' busy threads on one
core, that stretch runs at half the rate (per-round rates vary about twofold, against iperf3's
steady rate over seconds; a 42 MB model takes about 15 ms at 20 Gbit/s). So the raw veth is
measured twice: as the scheduler places things, and with each side on a core of its own
(``taskset`` for the agents' site servers, ``iperf3 -A`` for iperf3: the same placement for both),
which measures the agent's own transfer path apart from placement.

Run as root: ``sudo .venv/bin/python benchmarks/bench_transfer.py [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from orchestrator.runtime.backends import _LocalServers, new_ctl_dir  # noqa: E402
from orchestrator.runtime.compute import ComputeManager  # noqa: E402
from orchestrator.runtime.summaries import read_events  # noqa: E402
from orchestrator.runtime.task_runner import FLOptions, run_task  # noqa: E402
from orchestrator.scheduling.schedule import Schedule  # noqa: E402

ADDR_A, ADDR_B = "10.213.0.1", "10.213.0.2"


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


class VethPair:
    """Two namespaces joined by one veth pair (``link="veth"``), or each by its own veth pair to a
    userspace Open vSwitch bridge (``link="ovs"``: the testbed's host-to-switch data path, with
    checksum offload off as TCP needs there). A context manager that always removes all of it."""

    def __init__(self, link: str = "veth") -> None:
        if link not in ("veth", "ovs"):
            raise ValueError(f"link must be veth or ovs, got {link!r}")
        self.link = link
        tag = f"{os.getpid() % 100000}"
        self.ns_a, self.ns_b = f"netai-bt{tag}a", f"netai-bt{tag}b"
        self.if_a, self.if_b = f"nbt{tag}a", f"nbt{tag}b"
        self.bridge = f"nbtbr{tag}"

    def __enter__(self) -> VethPair:
        try:
            sh("ip", "netns", "add", self.ns_a)
            sh("ip", "netns", "add", self.ns_b)
            if self.link == "veth":
                sh("ip", "link", "add", self.if_a, "type", "veth", "peer", "name", self.if_b)
            else:
                sh("ovs-vsctl", "--timeout=10", "add-br", self.bridge, "--", "set", "bridge", self.bridge,
                   "datapath_type=netdev", "external-ids:netai-bench=1")
                for ifname in (self.if_a, self.if_b):
                    sh("ip", "link", "add", ifname, "type", "veth", "peer", "name", ifname + "p")
                    sh("ovs-vsctl", "--timeout=10", "add-port", self.bridge, ifname + "p")
                    sh("ethtool", "-K", ifname + "p", "tx", "off", "rx", "off")
                    sh("ip", "link", "set", ifname + "p", "up")
            for ns, ifname, addr in ((self.ns_a, self.if_a, ADDR_A), (self.ns_b, self.if_b, ADDR_B)):
                sh("ip", "link", "set", ifname, "netns", ns)
                sh("ip", "-n", ns, "addr", "add", f"{addr}/30", "dev", ifname)
                sh("ip", "-n", ns, "link", "set", ifname, "up")
                sh("ip", "-n", ns, "link", "set", "lo", "up")
                if self.link == "ovs":
                    sh(*self.exec(ns, "ethtool", "-K", ifname, "tx", "off", "rx", "off"))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *_exc: object) -> None:
        for ns in (self.ns_a, self.ns_b):
            sh("ip", "netns", "del", ns, check=False)  # takes its veth end, and so the pair, with it
        if self.link == "ovs":
            sh("ovs-vsctl", "--timeout=10", "--if-exists", "del-br", self.bridge, check=False)

    def exec(self, ns: str, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", ns, *cmd]


def iperf3_mbps(pair: VethPair, *, seconds: int, reverse: bool, pin: bool = False) -> float:
    """Raw TCP goodput A -> B (or B -> A with `reverse`), Mbit/s, as iperf3's receiver saw it; with
    `pin`, the client runs on core 0 and the server on core 1."""
    port = "5341"
    server = subprocess.Popen(pair.exec(pair.ns_b, "iperf3", "-s", "-1", "-B", ADDR_B, "-p", port,
                                        *(["-A", "1"] if pin else [])),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:  # poll for the server's listening socket, bounded
            out = sh(*pair.exec(pair.ns_b, "ss", "-Hltn", f"sport = :{port}"), check=False).stdout
            if out.strip():
                break
            if time.monotonic() > deadline:
                raise TimeoutError("iperf3 server did not listen within 10 s")
            time.sleep(0.05)
        args = ["iperf3", "-c", ADDR_B, "-B", ADDR_A, "-p", port, "-t", str(seconds), "-J", *(["-A", "0"] if pin else [])]
        if reverse:
            args.append("-R")
        res = sh(*pair.exec(pair.ns_a, *args))
        return float(json.loads(res.stdout)["end"]["sum_received"]["bits_per_second"]) / 1e6
    finally:
        server.kill()
        server.wait()


class NetnsBackend(_LocalServers):
    """G's site server in namespace A, the local model's in namespace B (a site backend)."""

    name = "netns"

    def __init__(self, pair: VethPair, *, log_root: Path, pin: bool = False) -> None:
        self.pair = pair
        #: With `pin`, G's site server runs on core 0 and L's on core 1 (as iperf3's client and server).
        self._cores = {"G": "0", "L": "1"} if pin else {}
        self._where = {"G": (pair.ns_a, ADDR_A), "L": (pair.ns_b, ADDR_B)}
        self._python = sys.executable
        self.log_root = log_root
        self.ctl_dir = new_ctl_dir()

    def address(self, site: str) -> str:
        return self._where[site][1]

    def host_id(self, site: str) -> str:
        return site

    def _popen(self, site: str, cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        pin = ["taskset", "-c", self._cores[site]] if site in self._cores else []
        return subprocess.Popen([*pin, *self.pair.exec(self._where[site][0], *cmd)], **kw)


def run(
    *, rounds: int, iperf_s: int, model: str, hidden: int, chunk_mb: float, log_dir: Path, link: str = "veth",
    pin: bool = False,
) -> dict[str, Any]:
    log_dir.mkdir(parents=True, exist_ok=True)
    schedule = Schedule(task_id=77, scheduler="bench", global_site="G", local_sites=("L",), demand_mbps=1.0,
                        broadcast_parent={"L": "G"}, upload_parent={"L": "G"})
    options = FLOptions(rounds=rounds, model=model, model_args={"hidden": hidden}, local_epochs=1,
                        max_chunk_bytes=int(chunk_mb * 2**20) or None)
    with VethPair(link) as pair:
        raw_ab = iperf3_mbps(pair, seconds=iperf_s, reverse=False, pin=pin)
        raw_ba = iperf3_mbps(pair, seconds=iperf_s, reverse=True, pin=pin)
        with ComputeManager(NetnsBackend(pair, log_root=log_dir, pin=pin), ["G", "L"]) as manager:
            task_dir = manager.task_dir("task")
            result = run_task(schedule, manager=manager, options=options, log_dir=task_dir)
    g = read_events(task_dir / "G.events.jsonl")
    loc = read_events(task_dir / "L.events.jsonl")
    bits = 8 * result.model_bytes

    def at(evs: list[dict[str, Any]], name: str, r: int) -> float:
        return next(float(e["t"]) for e in evs if e["event"] == name and e.get("round") == r)

    # Both agents log on CLOCK_MONOTONIC of one machine: G's round start to L holding the whole
    # GLOBAL, and L's training end to G holding the aggregate (each includes encoding and checks).
    down = [bits / (at(loc, "global_received", r) - at(g, "round_start", r)) / 1e6 for r in range(1, rounds + 1)]
    up = [bits / (at(g, "aggregated", r) - at(loc, "train_end", r)) / 1e6 for r in range(1, rounds + 1)]
    return {
        "link": link,
        "pinned": pin,
        "model": model,
        "model_bytes": result.model_bytes,
        "chunk_bytes": result.chunk_bytes,
        "rounds": rounds,
        "iperf3_mbps": {"G->L": raw_ab, "L->G": raw_ba},
        "agent_mbps": {"G->L": down, "L->G": up},
        "ratio": {"G->L": statistics.median(down) / raw_ab, "L->G": statistics.median(up) / raw_ba},
        "log_dir": str(log_dir),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 rounds, 2 s of iperf3")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=3200, help="width of the 'large' model (3200: 42 MB)")
    parser.add_argument("--chunk-mb", type=float, default=1.0, help="chunk size of a message, MiB (0: one frame)")
    parser.add_argument("--log-dir", type=Path, default=Path("/var/tmp/netai-bench-transfer"))
    parser.add_argument("--link", choices=("veth", "ovs", "both"), default="both",
                        help="veth: one raw veth pair; ovs: through a userspace OVS bridge (the testbed's path)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench_transfer: run as root (it creates network namespaces)", file=sys.stderr)
        return 2
    # (link, pinned): the raw veth as placed by the scheduler and one core per side (see the module docstring)
    pinning = (False, True) if (os.cpu_count() or 1) >= 2 and shutil.which("taskset") else (False,)
    cases = [(link, pin) for link in (("veth", "ovs") if args.link == "both" else (args.link,))
             for pin in (pinning if link == "veth" else (False,))]
    results = [
        run(rounds=3 if args.quick else args.rounds, iperf_s=2 if args.quick else 5, model="large",
            hidden=args.hidden, chunk_mb=args.chunk_mb, log_dir=args.log_dir / f"{link}{'-pinned' if pin else ''}",
            link=link, pin=pin)
        for link, pin in cases
    ]
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for res in results:
        mb = res["model_bytes"] / 1e6
        where = "one core per side" if res["pinned"] else "placed by the scheduler"
        print(f"{res['link']} ({where}): model {res['model']} {mb:.1f} MB of weights, chunks of {res['chunk_bytes']} bytes, "
              f"{res['rounds']} rounds")
        for d in ("G->L", "L->G"):
            agent = res["agent_mbps"][d]
            print(f"  {d}: iperf3 {res['iperf3_mbps'][d]:9.0f} Mbit/s   agent median {statistics.median(agent):9.0f} "
                  f"Mbit/s (min {min(agent):.0f}, max {max(agent):.0f})   ratio {res['ratio'][d]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
