"""Background traffic: iperf3 flows between emulated hosts, routed by the controller.

`plan_background` picks the flows (pure; `orchestrator.scheduling.background_plan`, which the
flow-level simulation replays too).

`BackgroundTraffic` runs them (a context manager): an iperf3 server bound to the destination
host's address, and a client bound to the source's, each started in the host's *network*
namespace only (``nsenter -n``), so the traffic generator is the machine's iperf3 whatever the
host is (a plain Mininet host or a worker container). Clients start once every server listens
(its own socket, read from ``/proc/<pid>/net/tcp`` in the host's namespace and ``/proc/<pid>/fd``): a client that came
first would be refused and its flow never run. ``constant`` and ``demand-matrix`` flows send
at their rate all along, in writes of `WRITE_S` of it (so that a slow flow, as under time dilation,
is not a burst every few seconds) and paced at it (`PACING_HEADROOM`: no catch-up at the link's rate
after a task had the link), ``poisson`` flows alternate exponential on and off periods (seeded). On
exit every iperf3 it started is stopped, and each flow's offered and achieved rates (the client's
sent throughput, TCP) are returned. Traffic only ever goes between emulated hosts.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.procs import stat_fields
from orchestrator.scheduling.background_plan import (  # noqa: F401 -- the plan, importable from here too
    IPERF_BASE_PORT,
    ON_OFF_PERIODS,
    BackgroundConfig,
    BackgroundFlow,
    demand_matrix,
    on_off_periods,
    plan_background,
)

LOG = logging.getLogger(__name__)


LISTEN_TIMEOUT_S = 10.0
_TCP_LISTEN = "0A"
#: The longest one write of a background client lasts at its rate. iperf3 paces ``-b`` by whole
#: writes (``-l``, 128 KB by default for TCP): at the rates of a time-dilated run (a few hundred
#: kbit/s at K = 16) that is a burst every few seconds, and the background view's pieces of under a
#: second never agree (its CV over them 0.2-0.5: the view waited out its 20 s timeout for a new
#: task, unsettled).
WRITE_S = 0.01
#: A write is at least one TCP segment's payload (MSS 1448), at most iperf3's own default.
MIN_WRITE_BYTES = 1448
MAX_WRITE_BYTES = 128 * 1024


#: A client's socket pacing cap (``--fq-rate``: SO_MAX_PACING_RATE, which TCP's own pacing enforces
#: under htb, on the segments' payload) over its flow's rate. iperf3's ``-b`` is an average: a flow
#: held back while a task had the link (htb serves tasks first) caught up at the link's full rate
#: once it was free, and a background view measured then saw the link full (heldout-background:
#: twice the usual background, for one task, which the schedulers were told). Capped, a flow
#: catches up at 2 % of its rate.
PACING_HEADROOM = 1.02


def pacing_mbps(rate_mbps: float) -> float:
    """The pacing cap of a flow at `rate_mbps` (payload): `PACING_HEADROOM` of it."""
    return rate_mbps * PACING_HEADROOM


def write_bytes(rate_mbps: float) -> int:
    """The iperf3 write length (``-l``) of a flow at `rate_mbps`: `WRITE_S` of it, within bounds."""
    return int(min(MAX_WRITE_BYTES, max(MIN_WRITE_BYTES, rate_mbps * 1e6 * WRITE_S / 8)))


def listening(pid: int, ip: str, port: int) -> bool:
    """Whether process `pid` (or one it started) has a TCP socket listening on `ip`:`port`.

    Read from ``/proc/<pid>/net/tcp``, which shows the sockets of `pid`'s network namespace, and
    ``/proc/<pid>/fd``, which shows which of them are its own: another process listening there
    (say a leftover server of an earlier run) does not count. No process is started.
    """
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    # The kernel prints the address as its 32-bit value in host byte order; field 9 is the inode.
    want = f"{struct.unpack('=I', socket.inet_aton(ip))[0]:08X}:{port:04X}"
    inodes = {f[9] for f in (line.split() for line in lines) if len(f) > 9 and f[1] == want and f[3] == _TCP_LISTEN}
    if not inodes:
        return False
    if not inodes.isdisjoint(_socket_inodes(pid)):
        return True
    return any(not inodes.isdisjoint(_socket_inodes(p)) for p in _with_descendants(pid)[1:])


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process `pid` holds open (empty if it is gone)."""
    found: set[str] = set()
    try:
        fds = list(os.scandir(f"/proc/{pid}/fd"))
    except OSError:
        return found
    for fd in fds:
        try:
            link = os.readlink(fd.path)
        except OSError:
            continue  # closed meanwhile
        if link.startswith("socket:[") and link.endswith("]"):
            found.add(link[8:-1])
    return found


def _with_descendants(pid: int) -> list[int]:
    """`pid` first, then the processes it started, and theirs (a wrapper may fork its server)."""
    parent_of: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        fields = stat_fields(int(entry.name)) if entry.name.isdigit() else None
        if fields is not None:  # else not a process, or gone meanwhile
            parent_of[int(entry.name)] = int(fields[1])
    family, i = [pid], 0
    while i < len(family):
        family += [child for child, parent in parent_of.items() if parent == family[i]]
        i += 1
    return family


def wait_listening(servers: Sequence[tuple[subprocess.Popen[Any], str, int, str]],
                   timeout_s: float = LISTEN_TIMEOUT_S) -> None:
    """Wait until every (process, ip, port, name) server listens.

    Raises
    ------
    RuntimeError
        A server exited first (with what it printed, if its output is a pipe), or one did not
        listen within `timeout_s` (named either way).
    """
    deadline = time.monotonic() + timeout_s
    waiting = list(servers)
    while waiting:
        for proc, ip, port, name in list(waiting):
            if listening(proc.pid, ip, port):
                waiting.remove((proc, ip, port, name))
            elif proc.poll() is not None:
                out = proc.stdout.read() if proc.stdout else ""
                said = (out.decode(errors="replace") if isinstance(out, bytes) else out).strip()
                raise RuntimeError(f"iperf3 server {name} ({ip}:{port}) exited with {proc.returncode} before listening"
                                   f"{': ' + said if said else ''}")
        if waiting and time.monotonic() >= deadline:
            raise RuntimeError(f"iperf3 server {waiting[0][3]} ({waiting[0][1]}:{waiting[0][2]}) did not listen "
                               f"within {timeout_s:g} s")
        if waiting:
            time.sleep(0.02)


@dataclass(frozen=True)
class FlowResult:
    src: str
    dst: str
    offered_mbps: float
    achieved_mbps: float | None
    on_s: float


class BackgroundTraffic:
    """Run background flows on an emulation's hosts (see the module docstring).

    Parameters
    ----------
    hosts
        Maps a site to its Mininet host (its shell's ``pid`` and ``IP()`` are used).
    flows
        From `plan_background`.
    """

    def __init__(
        self,
        hosts: Any,
        flows: Sequence[BackgroundFlow],
        cfg: BackgroundConfig,
        *,
        seed: int,
        log_dir: Path,
    ) -> None:
        self.hosts = hosts
        self.flows = list(flows)
        self.cfg = cfg
        self.seed = seed
        self.log_dir = log_dir
        self._servers: list[subprocess.Popen[bytes]] = []
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._results: dict[int, FlowResult] = {}
        self._lock = threading.Lock()
        self._clients: set[subprocess.Popen[bytes]] = set()

    def _popen(self, site: str, cmd: list[str], *, stdout: Any, log_name: str) -> subprocess.Popen[bytes]:
        host = self.hosts(site)
        err = open(self.log_dir / log_name, "ab")
        try:
            return subprocess.Popen(["nsenter", "-t", str(host.pid), "-n", *cmd], stdout=stdout, stderr=err)
        finally:
            err.close()

    def start(self) -> None:
        """Start every server, wait until each listens, then start the flows.

        Raises
        ------
        RuntimeError
            A server did not come up (its servers are stopped first).
        """
        self.log_dir.mkdir(parents=True, exist_ok=True)
        ready = []
        for f in self.flows:
            host = self.hosts(f.dst)
            self._servers.append(
                self._popen(f.dst, ["iperf3", "-s", "-B", host.IP(), "-p", str(f.port)],
                            stdout=subprocess.DEVNULL, log_name=f"server-{host.name}-{f.port}.err")
            )
            ready.append((self._servers[-1], host.IP(), f.port, f"{host.name} of {f.src} -> {f.dst}"))
        try:
            wait_listening(ready)
        except BaseException:
            self.stop()
            raise
        for i, f in enumerate(self.flows):
            t = threading.Thread(target=self._run_flow, args=(i, f), name=f"bg-{f.src}-{f.dst}", daemon=True)
            self._threads.append(t)
            t.start()

    def _client(self, f: BackgroundFlow, duration_s: float) -> subprocess.Popen[bytes]:
        src, dst = self.hosts(f.src), self.hosts(f.dst)
        cmd = ["iperf3", "-c", dst.IP(), "-B", src.IP(), "-p", str(f.port), "-b", f"{f.rate_mbps:.3f}M",
               "--fq-rate", f"{pacing_mbps(f.rate_mbps):.3f}M", "-l", str(write_bytes(f.rate_mbps)), "-t", str(max(1, round(duration_s))) if duration_s else "0", "-J", "--connect-timeout", "5000"]
        # file names from the hosts' names (h1, h2, ..), never from site names
        log_name = f"client-{self.hosts(f.src).name}-{self.hosts(f.dst).name}-{f.port}.err"
        proc = self._popen(f.src, cmd, stdout=subprocess.PIPE, log_name=log_name)
        with self._lock:
            self._clients.add(proc)
        return proc

    def _collect(self, proc: subprocess.Popen[bytes]) -> tuple[float, float] | None:
        out, _ = proc.communicate()
        with self._lock:
            self._clients.discard(proc)
        try:
            doc = json.loads(out.decode())
            end = doc["end"]["sum_sent"]
            return float(end["bytes"]) * 8, float(end["seconds"])
        except (ValueError, KeyError, TypeError):
            LOG.warning("background flow: iperf3 gave no result (exit %s): %s", proc.returncode,
                        out.decode(errors="replace")[-300:].strip() or "no output")
            return None

    def _run_flow(self, index: int, f: BackgroundFlow) -> None:
        bits = secs = 0.0
        if self.cfg.pattern == "poisson":
            for on_s, off_s in on_off_periods(self.cfg, self.seed + index, ON_OFF_PERIODS):
                if self._stop.is_set():
                    break
                got = self._collect(self._client(f, on_s))
                if got:
                    bits, secs = bits + got[0], secs + got[1]
                if self._stop.wait(off_s):
                    break
        else:
            got = self._collect(self._client(f, 0))
            if got:
                bits, secs = got
        achieved = bits / secs / 1e6 if secs > 0 else None
        with self._lock:
            self._results[index] = FlowResult(f.src, f.dst, f.rate_mbps, achieved, secs)

    def stop(self, timeout_s: float = 15.0) -> list[FlowResult]:
        """Stop every client (SIGINT: iperf3 reports what it sent) and server; return the results."""
        self._stop.set()
        with self._lock:
            clients = list(self._clients)
        for proc in clients:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))
        with self._lock:
            leftover = list(self._clients)
        for proc in leftover + self._servers:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=5)
        return [
            self._results.get(i, FlowResult(f.src, f.dst, f.rate_mbps, None, 0.0)) for i, f in enumerate(self.flows)
        ]

    def __enter__(self) -> BackgroundTraffic:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
