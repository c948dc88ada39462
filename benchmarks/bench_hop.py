"""Benchmark: one hop of a model's path, against the chunk's transmission time, by priority scheme.

Two hosts (network namespaces) each on a userspace Open vSwitch bridge of its own, the two bridges
joined by one link shaped to 100 Mbit/s in both directions with the emulation's htb layout
(`controller.shaping.base_layout`: link, background, best-effort and ACK classes) plus a task class
for the benchmark's port. All is made with names carrying this process's id, and removed on every
exit path.

The hop: host A sends one chunk of the default `mlp` model (19,240 bytes) to host B with the
agents' own transport (`workers.transport`: an `Outbound` sender thread, a `Listener` reader thread
that checks the digest and parses the chunk against the layout); B forwards it back as a relay
forwards a GLOBAL chunk (reader thread -> the round loop's thread -> a sender thread, the payload
re-headed, not copied); A's loop thread takes it in. Per-hop time = half that round trip. Two
chunk sizes: the chunk `orchestrator.runtime.timing.optimal_chunk_bytes` gives the model on a
3-hop path, and the whole model as one chunk (store and forward).

Loads (``--loads``): ``unloaded``; ``cpu``: eight training processes (quick.yaml's 8 locals, each
a site server of its own), each running the agents' own training code (`workers.learning.Learner
.train` on the mlp) in a loop; ``net``: two iperf3 flows at 80 Mbit/s (one each way) in the
background class of the same link; ``loaded``: both, like quick.yaml's runs with background on.
With ``--colocated`` one of each host's trainers runs in the endpoint's own process instead (a
site server relaying for one task while it trains for another: the two share the interpreter lock).

Schemes (`workers.priority.SCHEMES`, set in every process; ovs-vswitchd's threads as the
emulation would set them): ``none`` (everything at nice 0), ``train-niced`` (training at nice +10,
the rest at 0: the agents before SCHED_IDLE), ``network-first`` (the default: training SCHED_IDLE,
network-path threads and ovs-vswitchd at nice -10), ``rt`` (training SCHED_IDLE, network-path
threads SCHED_FIFO 1, ovs-vswitchd at nice -10).

Each load is started once and kept running while the schemes take turns in ``--reps`` interleaved
blocks (the order reversed every other block; the training processes switch scheme between
blocks, the endpoints are started afresh), so that the machine's drift falls on every scheme
alike. Printed per scheme, load and chunk: the median and p90 per-hop time, both as ratios to the
chunk's transmission time (its frame's bytes at 100 Mbit/s; htb's burst, one frame at this rate, lets a
chunk's first frame cross faster than that), the TCP retransmissions and
timeouts in the two namespaces (the background flows' included), and where a hop's time goes:
``send`` (the loop to its sender thread having written the chunk), ``wire`` (the kernel, both
switches, the link, the peer's reader and its checks), ``loop`` (the reader to the peer's loop).
ovs-vswitchd's thread priorities are restored at the end.

Run as root, alone (``flock /tmp/netai-mininet.lock .venv/bin/python benchmarks/bench_hop.py
[--quick] [--json]``).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.htb import ROOT_MAJOR, TASK_PRIO, background_queue, base_layout, classid, htb_args  # noqa: E402
from orchestrator.emulation.datapath_priority import (  # noqa: E402
    DATAPATH_NICE,
    daemon_pids,
    set_threads_nice,
    thread_ids,
)

ADDR_A, ADDR_B = "10.214.0.1", "10.214.0.2"
PORT = 20999
LINK_MBPS = 100.0
TASK_CLASS = 0x10
TASK_MBPS = 50.0
BACKGROUND_MBPS = 80.0
#: Training processes per host (eight in all, as quick.yaml's 8 locals, each a site server of its own).
LOAD_PROCS = 4
MODEL_BYTES = 19_240
PATH_HOPS = 3
#: The datapath's nice value under each scheme.
DATAPATH_BY_SCHEME = {"none": 0, "train-niced": 0, "network-first": DATAPATH_NICE, "rt": DATAPATH_NICE}


def sh(*cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), check=check, capture_output=True, text=True)


class HopNet:
    """Namespaces A and B, bridges a and b, the shaped a-b link (see the module docstring)."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns = {"A": f"netai-hop{tag}a", "B": f"netai-hop{tag}b"}
        self.bridge = {"A": f"nhbr{tag}a", "B": f"nhbr{tag}b"}
        self.host_if = {"A": f"nh{tag}a", "B": f"nh{tag}b"}
        self.link_if = {"A": f"nhl{tag}a", "B": f"nhl{tag}b"}

    def __enter__(self) -> HopNet:
        try:
            self._build()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _build(self) -> None:
        sh("ip", "link", "add", self.link_if["A"], "type", "veth", "peer", "name", self.link_if["B"])
        for side, addr in (("A", ADDR_A), ("B", ADDR_B)):
            ns, br, hif = self.ns[side], self.bridge[side], self.host_if[side]
            sh("ip", "netns", "add", ns)
            sh("ovs-vsctl", "--timeout=10", "add-br", br, "--", "set", "bridge", br, "datapath_type=netdev",
               "external-ids:netai-bench=1")
            sh("ip", "link", "add", hif, "type", "veth", "peer", "name", hif + "p")
            for port in (hif + "p", self.link_if[side]):
                sh("ovs-vsctl", "--timeout=10", "add-port", br, port)
                sh("ethtool", "-K", port, "tx", "off", "rx", "off")
                sh("ip", "link", "set", port, "up")
            sh("ip", "link", "set", hif, "netns", ns)
            sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", hif)
            sh("ip", "-n", ns, "link", "set", hif, "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh(*self.exec(side, "ethtool", "-K", hif, "tx", "off", "rx", "off"))
            # as the emulation's hosts: a lost tail segment costs 10 ms, not Linux's WAN-sized 200 ms
            sh("ip", "-n", ns, "route", "replace", "10.214.0.0/24", "dev", hif, "proto", "kernel", "scope", "link",
               "src", addr, "rto_min", "10ms")
            self._shape(self.link_if[side])

    @staticmethod
    def _shape(dev: str) -> None:
        """The emulation's htb layout on `dev`, and a task class (prio 0) for the benchmark's port."""
        cmds = [*base_layout(dev, LINK_MBPS), background_queue(dev),
                ["class", "add", "dev", dev, "parent", classid(1), "classid", classid(TASK_CLASS),
                 *htb_args(TASK_MBPS, LINK_MBPS, TASK_PRIO)]]
        for where in ("sport", "dport"):
            cmds.append(["filter", "add", "dev", dev, "parent", f"{ROOT_MAJOR}:0", "protocol", "ip", "prio",
                         str(TASK_CLASS), "u32", "match", "ip", "protocol", "6", "0xff", "match", "ip", where,
                         str(PORT), "0xffff", "flowid", classid(TASK_CLASS)])
        for c in cmds:
            sh("tc", *c)

    def __exit__(self, *_exc: object) -> None:
        for side in ("A", "B"):
            sh("ip", "netns", "del", self.ns[side], check=False)
            sh("ovs-vsctl", "--timeout=10", "--if-exists", "del-br", self.bridge[side], check=False)
            sh("ip", "link", "del", self.link_if[side], check=False)

    def exec(self, side: str, *cmd: str) -> list[str]:
        return ["ip", "netns", "exec", self.ns[side], *cmd]


# -- the endpoint processes (run inside a namespace) ----------------------------------------------
def _trainer(index: int, host: str, stop: threading.Event, first: threading.Event) -> threading.Thread:
    """A thread training the mlp in a loop through the agents' own code (`Learner.train`, which runs
    each pass on a thread under the scheme's training priority)."""
    from workers.config import AgentConfig
    from workers.learning import Learner

    cfg = AgentConfig(task=1, site=f"load{index}", host=host, broadcast_port=0, upload_port=0, rounds=1,
                      num_parts=8, part_index=index % 8, local_epochs=1)
    learner = Learner(cfg)

    def loop() -> None:
        while not stop.is_set():
            learner.train()
            first.set()

    t = threading.Thread(target=loop, name=f"trainer{index}", daemon=True)
    t.start()
    return t


def _layout_chunks() -> dict[str, Any]:
    """name -> (chunk spec, tensors, chunks in its layout): the largest chunk of the T(c) layout and the whole model."""
    from orchestrator.runtime.timing import optimal_chunk_bytes
    from workers.data import open_dataset
    from workers.framing import chunk_layout, chunk_view
    from workers.models import build_model

    data = open_dataset("digits")
    template = {k: v.detach().clone() for k, v in
                build_model("mlp", input_shape=data.input_shape, num_classes=data.num_classes).state_dict().items()}
    chunk = optimal_chunk_bytes(MODEL_BYTES, PATH_HOPS + 1, LINK_MBPS)
    layout = chunk_layout(template, chunk)
    tc_spec = max(layout, key=lambda c: c.nbytes)
    whole = chunk_layout(template, None)[0]
    return {"chunk": (tc_spec, chunk_view(template, tc_spec), len(layout)),
            "model": (whole, chunk_view(template, whole), 1)}


def _transport(role: str, events: queue.Queue[tuple[Any, ...]], specs: dict[int, Any]) -> tuple[Any, Any, str]:
    """This endpoint's listener (expecting the other one) and its connection to it."""
    from workers.framing import parse_chunk
    from workers.transport import Listener, Outbound

    me, peer = ("A", "B") if role == "ping" else ("B", "A")
    addr = {"A": ADDR_A, "B": ADDR_B}

    def on_frame(_peer: str, header: Any, payload: bytearray) -> None:
        parse_chunk(payload, specs[header.round], header)  # the reader's checks, as an agent's
        events.put(("frame", header, payload, time.monotonic()))

    listener = Listener(host=addr[me], port=PORT, task=1, kind="broadcast", expected={peer: addr[peer]},
                        max_payload_bytes=1 << 20, on_frame=on_frame,
                        on_lost=lambda p, e: events.put(("lost", p, e)),
                        on_accept=lambda p: events.put(("accepted", p)),
                        on_reject=lambda ip, e, _k: events.put(("rejected", ip, e)))
    out = Outbound(peer=peer, peer_host=addr[peer], port=PORT, local_host=addr[me], task=1, site=me,
                   connect_timeout_s=30.0, on_lost=lambda p, e: events.put(("lost", p, e)),
                   on_connect=lambda p, _s, _a: events.put(("connected", p)))
    return listener, out, me


def _next(events: queue.Queue[tuple[Any, ...]], kinds: tuple[str, ...], timeout_s: float = 30.0) -> tuple[Any, ...]:
    """The next event of one of `kinds`; a lost or rejected connection ends the run."""
    while True:
        ev = events.get(timeout=timeout_s)
        if ev[0] in kinds:
            return ev
        if ev[0] in ("lost", "rejected"):
            raise RuntimeError(f"connection {ev[0]}: {ev[1:]}")


def _ping(out: Any, me: str, events: queue.Queue[tuple[Any, ...]], chunks: dict[str, Any], *, count: int,
          warmup: int, gap_ms: float) -> dict[str, Any]:
    """Send each chunk `warmup + count` times, one at a time; per-hop times (half the round trip)."""
    from workers.framing import Header, LazyFrame

    results: dict[str, Any] = {}
    pause = threading.Event()
    rng = random.Random(1)
    for rnd, name in ((1, "chunk"), (2, "model")):
        spec, tensors, of = chunks[name]
        hops, stamps, nbytes = [], [], 0
        for i in range(warmup + count):
            frame = LazyFrame(Header("GLOBAL", 1, rnd, me, chunk=spec.index, chunks=of), tensors)
            written: list[float] = []
            t0 = time.monotonic()
            out.send(frame, round=rnd, on_sent=lambda w=written: w.append(time.monotonic()))
            got = _next(events, ("frame",))
            t_loop = time.monotonic()
            if i >= warmup:
                hops.append((t_loop - t0) / 2)
                stamps.append([t0, written[0] if written else t0, got[3], t_loop])
            nbytes = frame.nbytes
            pause.wait(gap_ms * (0.5 + rng.random()) / 1000)  # pacing between samples, not readiness
        results[name] = {"frame_bytes": nbytes, "hop_s": hops, "stamps": stamps}
    return results


def _echo(out: Any, me: str, events: queue.Queue[tuple[Any, ...]]) -> None:
    """Forward every chunk back as a relay does (the same payload, its own header) until the ping
    side closes; then print, per chunk, when the reader had it, the loop took it and it was written."""
    from workers.framing import reheader

    stamps: list[list[float]] = []
    while True:
        ev = events.get()
        if ev[0] == "frame":
            row = [ev[3], time.monotonic()]
            stamps.append(row)
            out.send([reheader(ev[1], sender=me), memoryview(ev[2])], round=ev[1].round,
                     on_sent=lambda r=row: r.append(time.monotonic()))
        elif ev[0] in ("lost", "rejected"):
            print(f"echo: connection {ev[0]}: {ev[1:]}", file=sys.stderr, flush=True)
            if ev[0] == "lost":
                print(json.dumps(stamps), flush=True)
                return


def endpoint(role: str, scheme: str, *, trainers: int, count: int, warmup: int, gap_ms: float) -> int:
    """One process of the benchmark: ``ping`` (A), ``echo`` (B) or ``load`` (trainers only)."""
    import torch

    from workers import priority
    from workers.learning import tune_process

    priority.use(scheme)
    tune_process()
    torch.set_num_threads(1)
    stop, first = threading.Event(), threading.Event()
    workers = [_trainer(i + (4 if role == "echo" else 0), ADDR_A if role == "ping" else ADDR_B, stop, first)
               for i in range(trainers)]
    if trainers and not first.wait(120):
        raise TimeoutError("no training pass finished within 120 s")
    if role == "load":
        print("ready", flush=True)
        for line in sys.stdin:  # a scheme's name per line, until the benchmark closes our stdin
            priority.use(line.strip())
        stop.set()
        for w in workers:  # torch must not be mid-pass when the interpreter ends
            w.join(timeout=60)
        return 0
    applied = priority.enter_transfer()  # this thread is the round loop's
    chunks = _layout_chunks()
    events: queue.Queue[tuple[Any, ...]] = queue.Queue()
    listener, out, me = _transport(role, events, {1: chunks["chunk"][0], 2: chunks["model"][0]})
    listener.start()
    out.start()
    try:
        if role == "echo":
            _echo(out, me, events)
            return 0
        _next(events, ("accepted",))
        results = _ping(out, me, events, chunks, count=count, warmup=warmup, gap_ms=gap_ms)
        print(json.dumps({"transfer_priority": applied, "results": results}), flush=True)
        return 0
    finally:
        stop.set()
        out.flush_and_close(2.0)
        listener.close()
        for w in workers:  # torch must not be mid-pass when the interpreter ends
            w.join(timeout=60)


# -- the benchmark (root namespace) ---------------------------------------------------------------
def _python(net: HopNet, side: str, *args: str) -> list[str]:
    return net.exec(side, sys.executable, str(Path(__file__).resolve()), *args)


def _wait_lines(procs: list[subprocess.Popen[str]], timeout_s: float) -> None:
    """Wait until every process printed its ``ready`` line (bounded)."""
    import select

    deadline = time.monotonic() + timeout_s
    waiting = list(procs)
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{len(waiting)} load processes not training within {timeout_s:.0f} s")
        ready, _, _ = select.select([p.stdout for p in waiting], [], [], left)
        for p in [p for p in waiting if p.stdout in ready]:
            assert p.stdout is not None
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a load process failed (status {p.poll()})")
            waiting.remove(p)


def _iperf3(net: HopNet) -> list[subprocess.Popen[str]]:
    """Two background flows at BACKGROUND_MBPS, A->B and B->A, outside the task's class."""
    procs: list[subprocess.Popen[str]] = []
    for src, dst, port in (("A", "B", "5311"), ("B", "A", "5312")):
        dst_ip, src_ip = (ADDR_B, ADDR_A) if dst == "B" else (ADDR_A, ADDR_B)
        procs.append(subprocess.Popen(net.exec(dst, "iperf3", "-s", "-1", "-B", dst_ip, "-p", port),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True))
        deadline = time.monotonic() + 10
        while not sh(*net.exec(dst, "ss", "-Hltn", f"sport = :{port}"), check=False).stdout.strip():
            if time.monotonic() > deadline:
                raise TimeoutError(f"iperf3 server on {dst_ip}:{port} did not listen within 10 s")
            time.sleep(0.05)  # polling the listening socket, bounded above
        procs.append(subprocess.Popen(net.exec(src, "iperf3", "-c", dst_ip, "-B", src_ip, "-p", port, "-b",
                                               f"{BACKGROUND_MBPS:g}M", "-t", "3600"),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True))
    return procs


LOADS = {"unloaded": (False, False), "cpu": (True, False), "net": (False, True), "loaded": (True, True)}


def tcp_counters(net: HopNet, side: str) -> dict[str, int]:
    """The namespace's TCP retransmitted segments and retransmission timeouts (/proc/net of its netns)."""
    out: dict[str, int] = {}
    for path, keys in (("/proc/net/snmp", ("RetransSegs",)), ("/proc/net/netstat", ("TCPTimeouts", "TCPSpuriousRTOs", "TCPLossProbes"))):
        lines = sh(*net.exec(side, "cat", path)).stdout.splitlines()
        for names, values in zip(lines[::2], lines[1::2], strict=False):
            if names.startswith(("Tcp:", "TcpExt:")):
                row = dict(zip(names.split()[1:], values.split()[1:], strict=False))
                out |= {k: int(row[k]) for k in keys if k in row}
    return out


def link_drops(net: HopNet) -> dict[str, int]:
    """Interface -> packets dropped (rx + tx) so far, on every interface of the benchmark's network."""
    out: dict[str, int] = {}
    where = [(None, net.link_if["A"]), (None, net.link_if["B"]), (None, net.host_if["A"] + "p"),
             (None, net.host_if["B"] + "p"), ("A", net.host_if["A"]), ("B", net.host_if["B"])]
    for side, dev in where:
        cmd = ["ip", "-j", "-s", "link", "show", "dev", dev]
        got = json.loads(sh(*(net.exec(side, *cmd) if side else cmd)).stdout)[0]["stats64"]
        out[dev] = int(got["rx"]["dropped"]) + int(got["tx"]["dropped"])
    qdisc = sh("tc", "-s", "-j", "qdisc", "show", "dev", net.link_if["A"]).stdout
    out["htb"] = sum(int(q.get("drops", 0)) for q in json.loads(qdisc))
    return out


def _pair(net: HopNet, scheme: str, *, trainers: int, count: int, warmup: int, gap_ms: float) -> dict[str, Any]:
    """One block: an echo endpoint in B and a ping endpoint in A under `scheme`; the ping's figures,
    with the breakdown and the block's TCP and drop counters."""
    before = {side: tcp_counters(net, side) for side in ("A", "B")}
    drops = link_drops(net)
    common = ["--scheme", scheme, "--trainers", str(trainers), "--count", str(count), "--warmup", str(warmup),
              "--gap-ms", str(gap_ms)]
    echo = subprocess.Popen(_python(net, "B", "--endpoint", "echo", *common), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        ping = subprocess.run(_python(net, "A", "--endpoint", "ping", *common), capture_output=True, text=True,
                              timeout=900)
        if ping.returncode != 0:
            echo.terminate()
            raise RuntimeError(f"the ping endpoint failed ({scheme}):\n{ping.stderr[-3000:]}\n"
                               f"the echo endpoint said:\n{echo.communicate(timeout=10)[1][-3000:]}")
        out: dict[str, Any] = json.loads(ping.stdout.strip().splitlines()[-1])
        echo_out, _ = echo.communicate(timeout=60)
    finally:
        if echo.poll() is None:
            echo.kill()
            echo.wait()
    _breakdown(out, json.loads(echo_out.strip().splitlines()[-1]), warmup=warmup, count=count)
    # every counter of both namespaces: the benchmark's own connections and the background flows
    out["tcp"] = {k: sum(tcp_counters(net, s)[k] - before[s][k] for s in ("A", "B")) for k in before["A"]}
    out["drops"] = {k: v - drops[k] for k, v in link_drops(net).items() if v > drops[k]}
    return out


def _merge(into: dict[str, Any] | None, got: dict[str, Any]) -> dict[str, Any]:
    """Two blocks of one scheme as one: samples appended, counters added."""
    if into is None:
        return got
    for name, r in got["results"].items():
        mine = into["results"][name]
        mine["hop_s"] += r["hop_s"]
        for k, v in r["parts_s"].items():
            mine["parts_s"][k] += v
    for key in ("tcp", "drops"):
        into[key] = {k: into[key].get(k, 0) + got[key].get(k, 0) for k in into[key].keys() | got[key].keys()}
    return into


def measure(net: HopNet, schemes: list[str], load: str, *, reps: int, count: int, warmup: int, gap_ms: float,
            colocated: int = 0, datapath_nice: int | None = None) -> dict[str, dict[str, Any]]:
    """Every scheme under one load (`LOADS`: training processes, background flows), in `reps`
    interleaved blocks of `count` samples each (the order reversed every other block), the load
    kept running throughout and switched between schemes, so that a drift of the machine's state
    falls on every scheme alike. Scheme -> the ping endpoint's figures, blocks merged."""
    cpu, background = LOADS[load]
    procs: list[subprocess.Popen[str]] = []
    got: dict[str, Any] = dict.fromkeys(schemes)
    try:
        if background:
            procs += _iperf3(net)
        loads = [subprocess.Popen(_python(net, side, "--endpoint", "load", "--scheme", schemes[0], "--trainers", "1"),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                 for side in ("A", "B") for _ in range(LOAD_PROCS - colocated)] if cpu else []
        procs += loads
        _wait_lines(loads, 180)
        for rep in range(reps):
            for scheme in schemes if rep % 2 == 0 else schemes[::-1]:
                for p in loads:  # the trainers' next passes run under this scheme
                    assert p.stdin is not None
                    p.stdin.write(scheme + "\n")
                    p.stdin.flush()
                for pid in daemon_pids():
                    set_threads_nice(pid, DATAPATH_BY_SCHEME[scheme] if datapath_nice is None else datapath_nice)
                block = _pair(net, scheme, trainers=colocated if cpu else 0, count=count, warmup=warmup,
                              gap_ms=gap_ms)
                got[scheme] = _merge(got[scheme], block)
        return got
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        stop_procs(procs)


def stop_procs(procs: list[subprocess.Popen[str]]) -> None:
    """SIGTERM every process, then wait for each (SIGKILL after 10 s)."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _breakdown(got: dict[str, Any], echo: list[list[float]], *, warmup: int, count: int) -> None:
    """Per sample and per direction (averaged): the loop to its sender thread having written the
    chunk (``send``), that write to the peer's reader holding the checked chunk (``wire``: the
    kernel, both switches, the link, the reader's wake-up, receive and checks), the reader to the
    peer's loop taking it (``loop``). Both processes read CLOCK_MONOTONIC of one machine."""
    for z, name in enumerate(("chunk", "model")):
        r = got["results"][name]
        parts: dict[str, list[float]] = {"send": [], "wire": [], "loop": []}
        for j, (t0, a_written, a_read, a_loop) in enumerate(r["stamps"]):
            b_read, b_loop, *rest = echo[z * (warmup + count) + warmup + j]
            b_written = rest[0] if rest else b_loop
            parts["send"].append((a_written - t0 + b_written - b_loop) / 2)
            parts["wire"].append((b_read - a_written + a_read - b_written) / 2)
            parts["loop"].append((b_loop - b_read + a_loop - a_read) / 2)
        r["parts_s"] = parts


def _p90(xs: list[float]) -> float:
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(0.9 * len(ys)))]


def summary(scheme: str, load: str, got: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for name, r in got["results"].items():
        hops = sorted(r["hop_s"])
        tx_s = r["frame_bytes"] * 8 / (LINK_MBPS * 1e6)
        median, p90 = statistics.median(hops), _p90(hops)
        rows.append({"scheme": scheme, "load": load, "chunk": name, "frame_bytes": r["frame_bytes"],
                     "samples": len(hops), "tx_ms": tx_s * 1e3, "median_ms": median * 1e3, "p90_ms": p90 * 1e3,
                     "median_ratio": median / tx_s, "p90_ratio": p90 / tx_s,
                     "transfer_priority": got["transfer_priority"], "tcp": got["tcp"], "drops": got["drops"],
                     "parts_ms": {k: {"median": statistics.median(v) * 1e3, "p90": _p90(v) * 1e3}
                                  for k, v in r["parts_s"].items()}})
    return rows


def _datapath_nice() -> dict[tuple[int, int], int]:
    """(pid, tid) -> nice of every ovs-vswitchd thread now (to restore at the end)."""
    return {(pid, tid): os.getpriority(os.PRIO_PROCESS, tid) for pid in daemon_pids() for tid in thread_ids(pid)}


def _restore(saved: dict[tuple[int, int], int]) -> None:
    for (_pid, tid), nice in saved.items():
        try:
            os.setpriority(os.PRIO_PROCESS, tid, nice)
        except OSError:
            pass  # the thread ended meanwhile


def print_table(rows: list[dict[str, Any]]) -> None:
    print(f"one hop over a {LINK_MBPS:g} Mbit/s shaped link between two userspace-OVS hosts, the agents' transport; "
          f"per-hop time = half a round trip; ratio = per-hop time / the chunk frame's transmission time")
    print(f"{'scheme':<15}{'load':<10}{'chunk':<7}{'bytes':>7}{'tx ms':>8}{'median ms':>11}{'p90 ms':>9}"
          f"{'median/tx':>11}{'p90/tx':>9}  transfer threads, TCP retransmissions/timeouts in the run")
    for r in rows:
        print(f"{r['scheme']:<15}{r['load']:<10}{r['chunk']:<7}{r['frame_bytes']:>7}{r['tx_ms']:>8.3f}"
              f"{r['median_ms']:>11.3f}{r['p90_ms']:>9.3f}{r['median_ratio']:>11.2f}{r['p90_ratio']:>9.2f}  "
              f"{r['transfer_priority']}, {r['tcp'].get('RetransSegs')}/{r['tcp'].get('TCPTimeouts')}")
    print("where a hop's time goes (ms, median/p90, averaged over both directions): send = the loop to its "
          "sender having written it; wire = kernel, switches, link, reader and checks; loop = reader to loop")
    for r in rows:
        parts = "  ".join(f"{k} {v['median']:.3f}/{v['p90']:.3f}" for k, v in r["parts_ms"].items())
        print(f"{r['scheme']:<15}{r['load']:<10}{r['chunk']:<7}{parts}")
    by = {(r["scheme"], r["load"], r["chunk"]): r for r in rows}
    for chunk in ("chunk", "model"):
        base, new = by.get(("train-niced", "loaded", chunk)), by.get(("network-first", "loaded", chunk))
        if base and new:
            print(f"loaded, {chunk}: network-first / train-niced: median {new['median_ms'] / base['median_ms']:.2f}, "
                  f"p90 {new['p90_ms'] / base['p90_ms']:.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="60 samples per case instead of 200")
    parser.add_argument("--schemes", default="none,train-niced,network-first,rt")
    parser.add_argument("--loads", default="unloaded,loaded", help=f"of {', '.join(LOADS)}")
    parser.add_argument("--colocated", action="store_true",
                        help="one of each host's trainers in the endpoint's own process (as a site server hosting "
                             "a training role and a relaying one at once)")
    parser.add_argument("--reps", type=int, default=4, help="interleaved blocks per scheme and load")
    parser.add_argument("--datapath-nice", type=int, help="ovs-vswitchd's nice value under every scheme "
                        "(default: each scheme's own)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--endpoint", choices=("ping", "echo", "load"), help=argparse.SUPPRESS)
    parser.add_argument("--scheme", default="network-first", help=argparse.SUPPRESS)
    parser.add_argument("--trainers", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=200, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=20, help=argparse.SUPPRESS)
    parser.add_argument("--gap-ms", type=float, default=5.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.endpoint:
        return endpoint(args.endpoint, args.scheme, trainers=args.trainers, count=args.count, warmup=args.warmup,
                        gap_ms=args.gap_ms)
    from workers.priority import SCHEMES

    schemes = [s.strip() for s in args.schemes.split(",") if s.strip()]
    unknown = [s for s in schemes if s not in SCHEMES]
    loads = [s.strip() for s in args.loads.split(",") if s.strip()]
    unknown += [s for s in loads if s not in LOADS]
    if unknown or not schemes or not loads:
        print(f"bench_hop: unknown schemes or loads {unknown} (schemes: {', '.join(SCHEMES)}; loads: "
              f"{', '.join(LOADS)})", file=sys.stderr)
        return 2
    if os.geteuid() != 0:
        print("bench_hop: run as root (it creates namespaces and raises priorities)", file=sys.stderr)
        return 2
    count = 60 if args.quick else args.count
    saved = _datapath_nice()
    rows: list[dict[str, Any]] = []
    try:
        with HopNet() as net:
            for load in loads:
                got = measure(net, schemes, load, reps=args.reps, count=-(-count // args.reps), warmup=args.warmup,
                              gap_ms=args.gap_ms, colocated=int(args.colocated), datapath_nice=args.datapath_nice)
                rows += [row for scheme in schemes for row in summary(scheme, load, got[scheme])]
    finally:
        _restore(saved)
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))
    else:
        print_table(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
