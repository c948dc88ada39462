"""Where the host's CPU went during a run, by component, from /proc.

`CpuAccount` is sampled about once a second (by `orchestrator.experiment.link_recorder`) and sums the
CPU time (user + system) each process used since the account began, per component:

- ``switches``: ovs-vswitchd (the userspace datapath's threads; next to nothing on the kernel datapaths);
- ``kernel forwarding``: the host's softirq time (``/proc/stat``), where the kernel moves packets: the
  tc datapath's and the kernel module's forwarding, every veth's receive side, htb's timers;
- ``site servers``: the run's ``workers.site_server`` processes (training, and relaying models) and
  their fork server;
- ``background``: the run's iperf3 processes;
- ``controller``: the run's controller (``osken-manager``) and the ``tc`` processes it runs;
- ``docker``: the container runtime (dockerd, containerd and its shims);
- ``orchestrator``: this process (the lifecycle, recorders, dashboard);
- ``other``: whatever else the host was busy with (the host's busy time less the above).

A process that started after the account did is counted whole; one that ended between two samples
loses what it used since the last one (a second at most). Processes are the run's by the mark every
child of the emulation carries (`orchestrator.emulation.cleanup.ENV_RUN`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.emulation.cleanup import process_run_id

COMPONENTS = ("switches", "kernel forwarding", "site servers", "background", "controller", "docker", "orchestrator",
              "other")
#: The container runtime's processes (the docker backend's site servers run under them).
DOCKER_COMMS = frozenset({"dockerd", "containerd", "containerd-shim", "containerd-shim-runc-v2", "runc", "docker-proxy"})
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def proc_stat(pid: int, proc: Path = Path("/proc")) -> tuple[str, int, int] | None:
    """(comm, user + system ticks, start time in ticks since boot) of `pid` (None if it is gone)."""
    try:
        text = (proc / str(pid) / "stat").read_text()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    rest = text[text.rindex(")") + 2:].split()
    return comm, int(rest[11]) + int(rest[12]), int(rest[19])


def _cpu_line(proc: Path) -> list[int] | None:
    """The all-CPUs line of /proc/stat, in ticks: user, nice, system, idle, iowait, irq, softirq, steal, ..."""
    try:
        return [int(x) for x in (proc / "stat").read_text().splitlines()[0].split()[1:]]
    except (OSError, ValueError, IndexError):
        return None


def _busy(fields: list[int]) -> int:
    return sum(fields[:8]) - fields[3] - (fields[4] if len(fields) > 4 else 0)


def host_ticks(proc: Path = Path("/proc")) -> tuple[int, int] | None:
    """(busy, softirq) ticks of all CPUs since boot, from /proc/stat."""
    fields = _cpu_line(proc)
    return None if fields is None else (_busy(fields), fields[6])


def host_busy(proc: Path = Path("/proc")) -> tuple[int, int] | None:
    """(busy, all) ticks of all CPUs since boot, from /proc/stat: busy / all is the host's CPU use."""
    fields = _cpu_line(proc)
    return None if fields is None else (_busy(fields), sum(fields[:8]))


def classify(comm: str, cmdline: str) -> str | None:
    """The component of one of the run's processes (None: not one the account names)."""
    if "workers.site_server" in cmdline or "workers.forkserver" in cmdline:
        return "site servers"
    if comm == "iperf3":
        return "background"
    if "osken-manager" in cmdline or "ryu-manager" in cmdline or comm == "tc":  # tc: the controller's shaping, filters
        return "controller"
    return None


def cmdline(pid: int, proc: Path = Path("/proc")) -> str:
    """Process `pid`'s command line, its arguments joined by spaces ("" if it is gone)."""
    try:
        return (proc / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _boot_ticks(proc: Path) -> int:
    """Ticks since boot now (from /proc/uptime)."""
    try:
        return int(float((proc / "uptime").read_text().split()[0]) * CLK_TCK)
    except (OSError, ValueError, IndexError):
        return 0


@dataclass
class CpuAccount:
    """CPU seconds by component since the account began (see the module docstring)."""

    run_id: str
    proc: Path = Path("/proc")
    own_pid: int = field(default_factory=os.getpid)
    _seen: dict[int, tuple[int, int]] = field(default_factory=dict)  # pid -> (its start, ticks counted to)
    _kind: dict[tuple[int, int], str | None] = field(default_factory=dict)  # (pid, start) -> component
    _ticks: dict[str, int] = field(default_factory=dict)
    _host0: tuple[int, int] | None = None
    _host: tuple[int, int] | None = None
    _started: int = 0

    def __post_init__(self) -> None:
        self._started = _boot_ticks(self.proc)
        self._host0 = self._host = host_ticks(self.proc)
        self.sample()

    def _component(self, pid: int, comm: str) -> str | None:
        """The component of `pid` (looked at once per process; another run's processes are none)."""
        if pid == self.own_pid:
            return "orchestrator"
        if comm == "ovs-vswitchd":
            return "switches"
        if comm in DOCKER_COMMS:
            return "docker"
        component = classify(comm, cmdline(pid, self.proc))
        if component is None:
            return None
        mark = process_run_id(pid)
        return component if mark in (None, self.run_id) else None  # containers' processes carry no mark

    def sample(self) -> None:
        """Add what every process of the account used since the last sample."""
        for entry in self.proc.iterdir():
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            st = proc_stat(pid, self.proc)
            if st is None:
                continue
            comm, ticks, start = st
            if (pid, start) not in self._kind:
                self._kind[(pid, start)] = self._component(pid, comm)
            component = self._kind[(pid, start)]
            if component is None:
                continue
            if pid not in self._seen or self._seen[pid][0] != start:  # new to the account
                self._seen[pid] = (start, 0 if start >= self._started else ticks)
            last = self._seen[pid][1]
            self._ticks[component] = self._ticks.get(component, 0) + max(0, ticks - last)
            self._seen[pid] = (start, ticks)
        host = host_ticks(self.proc)
        if host is not None:
            self._host = host

    def seconds(self) -> dict[str, float]:
        """CPU seconds by component (`COMPONENTS`), ``other`` the host's busy time not named."""
        out = {c: self._ticks.get(c, 0) / CLK_TCK for c in COMPONENTS[:-1] if c != "kernel forwarding"}
        busy = softirq = 0.0
        if self._host0 is not None and self._host is not None:
            busy = (self._host[0] - self._host0[0]) / CLK_TCK
            softirq = (self._host[1] - self._host0[1]) / CLK_TCK
        out["kernel forwarding"] = softirq
        out["other"] = max(0.0, busy - sum(out.values()))
        return {c: round(out[c], 3) for c in COMPONENTS}

    def environment(self) -> dict[str, float]:
        """The figures as flat environment entries: ``cpu_s_<component>`` (spaces as underscores)."""
        return {"cpu_s_" + c.replace(" ", "_"): v for c, v in self.seconds().items()}
