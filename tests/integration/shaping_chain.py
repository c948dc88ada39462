"""A small copy through one shaped link, for real: three namespaces, a sender, a forwarding "switch"
and a receiver, joined by veths with offloads off as the emulation's ports are. The switch's egress
carries the emulation's htb tree (`controller.htb.base_layout`) and a task class for the copies'
port (`htb_args`, as the controller installs it). Used by `tests/integration/test_shaping_small_copy.py`
and `benchmarks/bench_shaping.py`; needs root and iperf3.
"""

from __future__ import annotations

import contextlib
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from controller.htb import (
    ROOT_MAJOR,
    TASK_PRIO,
    background_queue,
    base_layout,
    classid,
    htb_args,
)

COPY_BYTES = 19_000
MSS, HEADERS = 1448, 66  # TCP payload and Ethernet + IP + TCP (timestamps) headers of a full frame
WIRE_BYTES = COPY_BYTES + math.ceil(COPY_BYTES / MSS) * HEADERS
PORT, TASK_CLASS = 5201, 0x10
NS = ("netai-sc-a", "netai-sc-s", "netai-sc-b")
A_ADDR, B_ADDR = "10.253.1.1", "10.253.2.1"

SERVER = """
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1)
print("ready", flush=True)
c, _ = s.accept(); n = int(sys.argv[3])
while True:
    got = 0
    while got < n:
        b = c.recv(1 << 20)
        if not b:
            sys.exit(0)
        got += len(b)
    c.sendall(b"k")
"""
CLIENT = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2]))); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
data, out = b"x" * int(sys.argv[3]), []
pace = float(sys.argv[5]) if len(sys.argv) > 5 else 0.0
leads = [float(x) for x in sys.argv[6].split(",")] if len(sys.argv) > 6 else [None]
if pace:
    from workers.pacing import Pacer
    pacers = [Pacer(pace) if lead is None else Pacer(pace, lead_share=lead) for lead in leads]
for i in range(int(sys.argv[4])):
    time.sleep(0.2)  # idle: the classes' tokens refill to their burst
    t = time.perf_counter()
    pacers[i % len(pacers)].send(c, [data], last=True) if pace else c.sendall(data)  # one copy, whole
    c.recv(1); out.append(time.perf_counter() - t)
print(" ".join(repr(x) for x in out))
"""
ROOT = Path(__file__).resolve().parents[2]
BG_PORT = 5301


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def in_ns(ns: str, *args: str) -> list[str]:
    return ["ip", "netns", "exec", ns, *args]


@contextlib.contextmanager
def chain() -> Iterator[None]:
    """a -- s -- b, s forwarding; removed on every exit path."""
    for ns in NS:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)
        ip("netns", "add", ns)
    try:
        a, s, b = NS
        ip("link", "add", "sc-a0", "netns", a, "type", "veth", "peer", "name", "sc-s0", "netns", s)
        ip("link", "add", "sc-s1", "netns", s, "type", "veth", "peer", "name", "sc-b0", "netns", b)
        for ns, dev, addr in ((a, "sc-a0", "10.253.1.1/24"), (s, "sc-s0", "10.253.1.2/24"),
                              (s, "sc-s1", "10.253.2.2/24"), (b, "sc-b0", "10.253.2.1/24")):
            ip("-n", ns, "addr", "add", addr, "dev", dev)
            subprocess.run(in_ns(ns, "ethtool", "-K", dev, "tx", "off", "rx", "off", "gso", "off", "tso", "off",
                               "gro", "off"), capture_output=True, check=True)
            ip("-n", ns, "link", "set", dev, "up")
        ip("-n", a, "route", "add", "default", "via", "10.253.1.2")
        ip("-n", b, "route", "add", "default", "via", "10.253.2.2")
        subprocess.run(in_ns(s, "sysctl", "-qw", "net.ipv4.ip_forward=1"), check=True)
        yield
    finally:
        for ns in NS:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, check=False)


def shape(link_mbps: float, task_mbps: float, fixed_burst: int | None = None) -> None:
    dev = "sc-s1"
    cmds = [*base_layout(dev, link_mbps), background_queue(dev),
            ["class", "add", "dev", dev, "parent", classid(1), "classid", classid(TASK_CLASS),
             *htb_args(task_mbps, link_mbps, TASK_PRIO)],
            ["filter", "add", "dev", dev, "parent", f"{ROOT_MAJOR}:0", "protocol", "ip", "prio", str(TASK_CLASS),
             "u32", "match", "ip", "dport", str(PORT), "0xffff", "flowid", classid(TASK_CLASS)]]
    for c in cmds:
        if fixed_burst is not None and "burst" in c:  # the old instrument: one burst and cburst everywhere
            c[c.index("burst") + 1] = c[c.index("cburst") + 1] = str(fixed_burst)
        subprocess.run(in_ns(NS[1], "tc", *c), check=True, capture_output=True)


def unshape() -> None:
    """The switch's egress back to no qdisc of ours (before `shape` again)."""
    subprocess.run(in_ns(NS[1], "tc", "qdisc", "del", "dev", "sc-s1", "root"), capture_output=True, check=False)


def copy_times(tmp_path: Path, copies: int = 6, pace_mbps: float = 0.0, leads: str = "") -> list[float]:
    """Each copy's time from its first byte to the receiver's acknowledgement, seconds, after an idle gap
    each: sent whole, or paced at `pace_mbps` (`workers.pacing.Pacer`); `leads` ("0.5,0": lead shares,
    one pacer each, taken in turn copy after copy; default the pacer's own)."""
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "client.py").write_text(CLIENT)
    server = subprocess.Popen(in_ns(NS[2], sys.executable, str(tmp_path / "server.py"), B_ADDR, str(PORT),
                                  str(COPY_BYTES)), stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "ready"
        out = subprocess.run(in_ns(NS[0], sys.executable, str(tmp_path / "client.py"), B_ADDR, str(PORT),
                                 str(COPY_BYTES), str(copies), str(pace_mbps), *([leads] if leads else [])),
                             capture_output=True, text=True,
                             check=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
        return [float(x) for x in out.stdout.split()]
    finally:
        server.kill()
        server.wait()


@contextlib.contextmanager
def background(load: float, link_mbps: float) -> Iterator[None]:
    """An iperf3 flow from the sender's namespace to the receiver's at `load` x `link_mbps`, paced
    as the emulation's background is (``--fq-rate`` 2 % over its rate), through the switch's egress
    into the background class (htb's default); nothing with `load` 0. Stopped on every exit path."""
    if load <= 0:
        yield
        return
    procs = [subprocess.Popen(in_ns(NS[2], "iperf3", "-s", "-B", B_ADDR, "-p", str(BG_PORT), "-1"),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        time.sleep(0.5)
        bps = load * link_mbps * 1e6
        procs.append(subprocess.Popen(in_ns(NS[0], "iperf3", "-c", B_ADDR, "-p", str(BG_PORT), "-t", "600",
                                            "-b", f"{bps:.0f}", "--fq-rate", f"{bps * 1.02:.0f}"),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        time.sleep(1.0)  # the flow under way before the first copy
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()

