"""Benchmark: one hop of a model's path on each candidate datapath, against the chunk's transmission time.

The hop is `bench_hop.py`'s (host A sends one chunk of the default mlp to host B with the agents'
own transport, B forwards it back as a relay does; per-hop time = half the round trip), over one
link shaped to 100 Mbit/s with the emulation's htb layout, K = 1. What changes is what forwards
the packets between each host and the link:

- ``user``: Open vSwitch's userspace datapath (``datapath_type=netdev``), checksum offload off on
  every port (TCP needs it there): what the emulation ran on a kernel without the openvswitch module;
- ``afxdp``: the same bridges with ``afxdp-nonpmd`` ports (AF_XDP sockets, generic XDP on veths);
- ``tc``: no switch process at all: each port's ingress qdisc redirects to the other port
  (``u32`` + ``mirred``, `controller.tc_flows`), TSO/GSO off on the hosts, checksum offload on;
- ``user-tso``: the userspace datapath with ``other_config:userspace-tso-enable=true`` and offloads
  on. The setting needs ovs-vswitchd restarted, so it is measured in a second phase, paired with
  ``tc`` again (the ratio to ``tc`` compares across phases); the daemon is restarted without it at
  the end.

Every candidate's network is built at the start (its own namespaces, bridges and link), the load
runs once for all (`bench_hop.py`'s ``loaded``: eight training processes, and two 80 Mbit/s iperf3
flows on the link being measured), and the candidates take turns in ``--reps`` interleaved blocks
(order reversed every other block). A candidate this host cannot build is reported with why.
Printed: per candidate the median and p90 per-hop time as ratios to the chunk's transmission, and
the ratio of each candidate's median to tc's, from the same blocks.

Run as root, alone: ``flock /tmp/netai-mininet.lock .venv/bin/python benchmarks/bench_datapath.py
[--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_hop  # noqa: E402
from bench_hop import ADDR_A, ADDR_B, HopNet, sh  # noqa: E402

CANDIDATES = ("user", "afxdp", "tc", "user-tso")
SCHEME = "network-first"
OVS_CTL = "/usr/share/openvswitch/scripts/ovs-ctl"


class DatapathNet(HopNet):
    """`bench_hop.HopNet` on one candidate datapath (see the module docstring)."""

    def __init__(self, kind: str, index: int) -> None:
        super().__init__()
        tag = f"{os.getpid() % 10000}{index}"
        self.kind = kind
        self.ns = {"A": f"netai-dp{tag}a", "B": f"netai-dp{tag}b"}
        self.bridge = {"A": f"ndbr{tag}a", "B": f"ndbr{tag}b"}
        self.host_if = {"A": f"nd{tag}a", "B": f"nd{tag}b"}
        self.link_if = {"A": f"ndl{tag}a", "B": f"ndl{tag}b"}

    def _build(self) -> None:
        if self.kind == "tc":
            self._build_tc()
            return
        sh("ip", "link", "add", self.link_if["A"], "type", "veth", "peer", "name", self.link_if["B"])
        offload = self.kind == "user-tso"
        for side, addr in (("A", ADDR_A), ("B", ADDR_B)):
            br, hif = self.bridge[side], self.host_if[side]
            self._host(side, addr, checksum_offload=offload, segmentation_offload=offload)
            sh("ovs-vsctl", "--timeout=10", "add-br", br, "--", "set", "bridge", br, "datapath_type=netdev",
               "external-ids:netai-bench=1")
            for port in (hif + "p", self.link_if[side]):
                extra = (["--", "set", "interface", port, "type=afxdp-nonpmd", "options:xdp-mode=generic"]
                         if self.kind == "afxdp" else [])
                sh("ovs-vsctl", "--timeout=10", "add-port", br, port, *extra)
                if not offload:
                    sh("ethtool", "-K", port, "tx", "off", "rx", "off")
                sh("ip", "link", "set", port, "up")
            self._shape(self.link_if[side])
        if self.kind == "afxdp":
            self._check_afxdp()

    def _host(self, side: str, addr: str, *, checksum_offload: bool, segmentation_offload: bool) -> None:
        ns, hif = self.ns[side], self.host_if[side]
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", hif, "type", "veth", "peer", "name", hif + "p")
        sh("ip", "link", "set", hif, "netns", ns)
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", hif)
        sh("ip", "-n", ns, "link", "set", hif, "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        if not checksum_offload:
            sh(*self.exec(side, "ethtool", "-K", hif, "tx", "off", "rx", "off"))
        elif not segmentation_offload:
            sh(*self.exec(side, "ethtool", "-K", hif, "tso", "off", "gso", "off"))
        sh("ip", "-n", ns, "route", "replace", "10.214.0.0/24", "dev", hif, "proto", "kernel", "scope", "link",
           "src", addr, "rto_min", "10ms")

    def _build_tc(self) -> None:
        """Each side's host port and link port redirect to each other at ingress (the tc datapath's filters)."""
        sh("ip", "link", "add", self.link_if["A"], "type", "veth", "peer", "name", self.link_if["B"])
        for side, addr, peer in (("A", ADDR_A, ADDR_B), ("B", ADDR_B, ADDR_A)):
            self._host(side, addr, checksum_offload=True, segmentation_offload=False)
            hp, lk = self.host_if[side] + "p", self.link_if[side]
            for port in (hp, lk):
                sh("ip", "link", "set", port, "up")
                sh("tc", "qdisc", "add", "dev", port, "ingress")
            sh("tc", "filter", "add", "dev", hp, "ingress", "protocol", "ip", "pref", "10", "u32", "match", "ip", "dst",
               f"{peer}/32", "action", "mirred", "egress", "redirect", "dev", lk)
            sh("tc", "filter", "add", "dev", lk, "ingress", "protocol", "ip", "pref", "10", "u32", "match", "ip", "dst",
               f"{addr}/32", "action", "mirred", "egress", "redirect", "dev", hp)
            self._shape(lk)
        for side, peer_side, peer in (("A", "B", ADDR_B), ("B", "A", ADDR_A)):  # no ARP: static, as the emulation's
            mac = json.loads(sh(*self.exec(peer_side, "ip", "-j", "link", "show", self.host_if[peer_side])).stdout)[0]
            sh(*self.exec(side, "ip", "neigh", "replace", peer, "lladdr", mac["address"], "dev", self.host_if[side]))

    def _check_afxdp(self) -> None:
        for side in ("A", "B"):
            for port in (self.host_if[side] + "p", self.link_if[side]):
                err = sh("ovs-vsctl", "--timeout=10", "get", "interface", port, "error").stdout.strip()
                if err not in ("[]", ""):
                    raise RuntimeError(f"afxdp port {port}: {err}")

    def __exit__(self, *_exc: object) -> None:
        super().__exit__()
        for side in ("A", "B"):
            sh("ip", "link", "del", self.host_if[side] + "p", check=False)


def _set_userspace_tso(on: bool) -> None:
    """Set ``userspace-tso-enable`` and restart ovs-vswitchd (the setting is read at start)."""
    sh("ovs-vsctl", "--timeout=10", "set", "Open_vSwitch", ".", f"other_config:userspace-tso-enable={str(on).lower()}")
    sh(OVS_CTL, "--no-ovsdb-server", "restart", "--system-id=random")


def _background(net: HopNet) -> list[subprocess.Popen[str]]:
    procs = bench_hop._iperf3(net)
    time.sleep(1.0)  # the flows at their rate before the block's samples
    return procs


def run_phase(nets: dict[str, DatapathNet], *, reps: int, count: int, warmup: int, gap_ms: float,
              load: bool) -> dict[str, dict[str, Any]]:
    """Interleaved blocks on every net; the training load (in the first net's namespaces) throughout."""
    first = next(iter(nets.values()))
    trainers: list[subprocess.Popen[str]] = []
    got: dict[str, Any] = dict.fromkeys(nets)
    try:
        if load:
            trainers = [subprocess.Popen(bench_hop._python(first, side, "--endpoint", "load", "--scheme", SCHEME,
                                                           "--trainers", "1"),
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                        for side in ("A", "B") for _ in range(bench_hop.LOAD_PROCS)]
            bench_hop._wait_lines(trainers, 180)
        order = list(nets)
        for rep in range(reps):
            for kind in order if rep % 2 == 0 else order[::-1]:
                background = _background(nets[kind]) if load else []
                try:
                    block = bench_hop._pair(nets[kind], SCHEME, trainers=0, count=count, warmup=warmup,
                                            gap_ms=gap_ms)
                finally:
                    bench_hop.stop_procs(background)
                got[kind] = bench_hop._merge(got[kind], block)
        return got
    finally:
        for p in trainers:
            if p.stdin is not None:
                p.stdin.close()
        bench_hop.stop_procs(trainers)


def build(kinds: list[str], offset: int) -> tuple[dict[str, DatapathNet], dict[str, str]]:
    nets, unavailable = {}, {}
    for i, kind in enumerate(kinds):
        net = DatapathNet(kind, offset + i)
        try:
            nets[kind] = net.__enter__()
        except (RuntimeError, subprocess.CalledProcessError) as e:
            detail = getattr(e, "stderr", "") or str(e)
            unavailable[kind] = str(detail).strip().splitlines()[-1][:200] if detail else type(e).__name__
    return nets, unavailable


def rows_of(got: dict[str, Any], load: str, phase: int) -> list[dict[str, Any]]:
    rows = []
    for kind, figures in got.items():
        for row in bench_hop.summary(kind, load, figures):
            row["datapath"], row["phase"] = kind, phase
            rows.append(row)
    return rows


def print_rows(rows: list[dict[str, Any]], unavailable: dict[str, str]) -> None:
    print("one hop over a 100 Mbit/s shaped link, K = 1, the agents' transport, scheme network-first; "
          "ratio = per-hop time / the chunk frame's transmission time")
    print(f"{'phase':<6}{'datapath':<10}{'load':<10}{'chunk':<7}{'tx ms':>7}{'median ms':>11}{'p90 ms':>9}"
          f"{'median/tx':>11}{'p90/tx':>9}{'/ tc':>7}  TCP retransmissions/timeouts")
    tc = {(r["phase"], r["load"], r["chunk"]): r["median_ms"] for r in rows if r["datapath"] == "tc"}
    for r in rows:
        ref = tc.get((r["phase"], r["load"], r["chunk"]))
        vs = f"{r['median_ms'] / ref:.2f}" if ref else "-"
        print(f"{r['phase']:<6}{r['datapath']:<10}{r['load']:<10}{r['chunk']:<7}{r['tx_ms']:>7.3f}"
              f"{r['median_ms']:>11.3f}{r['p90_ms']:>9.3f}{r['median_ratio']:>11.2f}{r['p90_ratio']:>9.2f}{vs:>7}  "
              f"{r['tcp'].get('RetransSegs')}/{r['tcp'].get('TCPTimeouts')}")
    for kind, why in unavailable.items():
        print(f"{kind}: not measured on this host: {why}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 samples per case instead of 200")
    parser.add_argument("--datapaths", default=",".join(CANDIDATES), help=f"of {', '.join(CANDIDATES)}")
    parser.add_argument("--loads", default="unloaded,loaded", help="unloaded, loaded or both")
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.datapaths.split(",") if k.strip()]
    loads = [x.strip() for x in args.loads.split(",") if x.strip()]
    bad = [k for k in kinds if k not in CANDIDATES] + [x for x in loads if x not in ("unloaded", "loaded")]
    if bad or not kinds or not loads:
        print(f"bench_datapath: unknown datapaths or loads {bad} (datapaths: {', '.join(CANDIDATES)}; "
              f"loads: unloaded, loaded)", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench_datapath: run as root (it creates namespaces and bridges)", file=sys.stderr)
        return 2
    count = 60 if args.quick else 200
    per_block = -(-count // args.reps)
    phases = [[k for k in kinds if k != "user-tso"]]
    if "user-tso" in kinds:
        phases.append(["user-tso", "tc"])
    rows: list[dict[str, Any]] = []
    unavailable: dict[str, str] = {}
    for phase, members in enumerate(p for p in phases if p):
        if "user-tso" in members:
            _set_userspace_tso(True)
        try:
            nets, missing = build(members, 10 * phase)
            unavailable |= missing
            try:
                for load in loads:
                    if nets:
                        got = run_phase(nets, reps=args.reps, count=per_block, warmup=20, gap_ms=5.0,
                                        load=load == "loaded")
                        rows += rows_of(got, load, phase + 1)
            finally:
                for net in nets.values():
                    net.__exit__()
        finally:
            if "user-tso" in members:
                _set_userspace_tso(False)
    if args.json:
        print(json.dumps({"rows": rows, "unavailable": unavailable}, indent=1))
    else:
        print_rows(rows, unavailable)
    chunk = [r for r in rows if r["chunk"] == "chunk" and r["load"] == loads[-1]]
    if chunk:
        best = min(chunk, key=lambda r: r["median_ratio"])
        print(f"lowest median hop / chunk ({loads[-1]}): {best['datapath']} {best['median_ratio']:.2f}; "
              f"medians by datapath: {statistics.median([r['median_ratio'] for r in chunk]):.2f} over all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
