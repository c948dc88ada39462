"""Cluster servers on other machines: the controller reached over SSH, tunnels over the underlay.

A far server (`ClusterServer.far`: reached at an address outside loopback) needs three things a
server on this machine does not (docs/cluster.md):

- **The controller, with no new open door.** The controller listens on this machine's loopback
  only. For each far server an ``ssh -N -R 127.0.0.1:P:127.0.0.1:P`` (its own connection, the
  server's key and host key, `ExitOnForwardFailure`) makes port P (the controller's OpenFlow port)
  listen on the far machine's loopback, so its switches' ``tcp:127.0.0.1:P`` is the same string as
  here; the forward ends with the run (and with the machine).
- **Tunnels over the underlay.** A link between two machines is a VXLAN tunnel between the
  machines' underlay addresses (a far server's SSH address; this machine's source address towards
  them), its inner MTU the underlay's MTU less the 50 bytes of VXLAN over IPv4; the hosts'
  interfaces take that MTU too, so that no frame is larger than a tunnel carries.
- **Shaping there.** The controller's tc commands for a far switch's interfaces run on that server
  over its SSH connection (`controller.tc.ClusterTc`, from the file `tc_servers_file` writes).
- **A machine lost mid-run**, found within `LOST_TIMEOUT_S` by design (`lost_within_s`): its forward's
  keepalives end the forward, and a fresh SSH connection that the run looks at without waiting on it
  (`FarSide.poll_lost`) gets what is left of the timeout.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controller.htb import interface_switch
from orchestrator.emulation.cluster import (
    LOCAL,
    ClusterServer,
    ClusterSpec,
    end_process,
    local_underlay,
    own_connection_argv,
    ssh_argv,
    ssh_run,
    ssh_target,
)
from orchestrator.emulation.cluster_deploy import underlay_mtu
from orchestrator.errors import ConfigError
from topologies.mininet_topo import switch_interfaces
from topologies.plan import EmulationPlan

LOG = logging.getLogger("netai.cluster")
#: The bytes VXLAN over IPv4 adds to a frame: outer IPv4 (20), UDP (8), VXLAN (8), inner Ethernet (14).
VXLAN_OVERHEAD = 50
#: How long the controller's forward may take to listen on a far machine.
FORWARD_TIMEOUT_S = 15.0
#: A far machine that stops answering is found lost within this many seconds: mid-run by the design
#: below (`lost_within_s`), at teardown by one SSH call's timeout (`FarSide.mark_lost`).
LOST_TIMEOUT_S = 8.0
#: The controller's forward sends an SSH keepalive every `KEEPALIVE_INTERVAL_S` and ends once
#: `KEEPALIVE_COUNT` have gone unanswered: ssh gives up at the next one, (count + 1) intervals after
#: the machine last answered.
KEEPALIVE_INTERVAL_S = 1
KEEPALIVE_COUNT = 2
#: How often a run looks at the forwards mid-run (`FarSide.poll_lost`: the forwards' and the probes'
#: process states; it never waits on SSH).
LOOK_PERIOD_S = 0.5
#: How long a far server whose forward ended may take to answer a fresh connection before it counts
#: as lost: what is left of `LOST_TIMEOUT_S` once the forward's end and two looks are counted.
PROBE_TIMEOUT_S = LOST_TIMEOUT_S - (KEEPALIVE_COUNT + 1) * KEEPALIVE_INTERVAL_S - 2 * LOOK_PERIOD_S


def lost_within_s() -> float:
    """The latest a far machine that stops answering mid-run is found lost, by design, from the moment
    it last answered: its forward ends (`KEEPALIVE_COUNT` + 1 keepalive intervals), the next look starts
    a probe (`LOOK_PERIOD_S`), the probe gets `PROBE_TIMEOUT_S`, and the first look after that finds the
    machine lost (`LOOK_PERIOD_S`). Equal to `LOST_TIMEOUT_S` by construction; it holds while the run
    looks at least every `LOOK_PERIOD_S` (its loops poll every 0.05-0.1 s)."""
    return (KEEPALIVE_COUNT + 1) * KEEPALIVE_INTERVAL_S + LOOK_PERIOD_S + PROBE_TIMEOUT_S + LOOK_PERIOD_S


@dataclass
class FarSide:
    """What a run with far servers adds: underlay addresses, the inner MTU, the controller's forwards."""

    spec: ClusterSpec
    control_dir: Path
    underlay: dict[str, str]
    underlay_mtu: int
    forwards: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    #: Far servers found lost, mid-run or at teardown (their remains there are not removed: `netai clean`
    #: there once the machine is back); when each was found lost mid-run (`time.monotonic`).
    lost: list[str] = field(default_factory=list)
    lost_at: dict[str, float] = field(default_factory=dict)
    #: The controller's OpenFlow port and the run's id, once forwarded (a forward that ends is made again).
    forwarded: tuple[int, str] | None = None
    #: Far servers whose forward ended: the fresh connection asking whether they answer, and until when.
    probes: dict[str, tuple[subprocess.Popen[bytes], float]] = field(default_factory=dict)
    #: The clock the probes' deadlines and `lost_at` are on (a test's fake one).
    clock: Callable[[], float] = time.monotonic

    @property
    def inner_mtu(self) -> int:
        return self.underlay_mtu - VXLAN_OVERHEAD

    @property
    def far_servers(self) -> list[ClusterServer]:
        return [s for s in self.spec.servers if s.far]

    def to_dict(self) -> dict[str, Any]:
        return {"underlay": self.underlay, "underlay_mtu": self.underlay_mtu, "inner_mtu": self.inner_mtu,
                "controller_forwards": sorted(self.forwards), "lost": self.lost}

    def forward_controller(self, of_port: int, run_id: str) -> None:
        """On every far server, the controller's port on its loopback (see the module docstring).

        Raises
        ------
        RuntimeError
            A forward that ended or did not listen in `FORWARD_TIMEOUT_S`, with ssh's reason.
        """
        self.forwarded = (of_port, run_id)
        for server in self.far_servers:
            self._start_forward(server)
        for server in self.far_servers:
            self._wait_listening(server, of_port)

    def _start_forward(self, server: ClusterServer) -> None:
        assert self.forwarded is not None
        of_port, run_id = self.forwarded
        argv = [a if not a.startswith("ServerAliveInterval=") else f"ServerAliveInterval={KEEPALIVE_INTERVAL_S}"
                for a in own_connection_argv(server, self.control_dir)]
        argv += ["-N", "-o", f"ServerAliveCountMax={KEEPALIVE_COUNT}", "-o", "ExitOnForwardFailure=yes",
                 "-R", f"127.0.0.1:{of_port}:127.0.0.1:{of_port}", ssh_target(server)]
        self.forwards[server.name] = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env={**os.environ, "NETAI_RUN": run_id}, start_new_session=True)

    def _start_probe(self, server: ClusterServer) -> subprocess.Popen[bytes]:
        """A fresh SSH connection running ``true`` there, its connect timeout within the probe's."""
        argv = [a if not a.startswith("ConnectTimeout=") else f"ConnectTimeout={math.ceil(PROBE_TIMEOUT_S)}"
                for a in own_connection_argv(server, self.control_dir)]
        return subprocess.Popen([*argv, ssh_target(server), "true"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def poll_lost(self, net: Any, *, settle: bool = False) -> list[str]:
        """The far servers lost so far, looked at without waiting (`lost_within_s`). A server whose
        controller forward ended gets a fresh SSH connection (a probe); one whose probe fails, or does
        not answer in `PROBE_TIMEOUT_S`, is lost from now on (its nodes marked, so that nothing waits on
        their shells); one that answers gets its forward again. `settle`: wait for the probes under way
        to answer or time out (before a task is admitted, so that it is scheduled knowing them)."""
        for server in self.far_servers:
            proc = self.forwards.get(server.name)
            if server.name in self.lost or proc is None or proc.poll() is None:
                continue
            if server.name not in self.probes:
                self.probes[server.name] = (self._start_probe(server), self.clock() + PROBE_TIMEOUT_S)
            answered = self._probe_answer(server.name, settle)
            if answered is None:
                continue
            del self.probes[server.name]
            if answered == 0:
                LOG.warning("the controller's forward to %s ended; the server answers: forwarding again", server.name)
                self._start_forward(server)
                continue
            LOG.error("cluster server %s is lost: it no longer answers over SSH (%s)", server.name,
                      f"ssh exited {answered}" if answered > 0 else f"no answer in {PROBE_TIMEOUT_S:.0f} s")
            self.lost.append(server.name)
            self.lost_at[server.name] = self.clock()
            self._mark_nodes(net)
        return list(self.lost)

    def _probe_answer(self, name: str, settle: bool) -> int | None:
        """The probe's exit status; -1 once its time is up (it is ended); None while it may still answer."""
        probe, deadline = self.probes[name]
        if settle:
            with contextlib.suppress(subprocess.TimeoutExpired):
                probe.wait(timeout=max(0.0, deadline - self.clock()))
        answered = probe.poll()
        if answered is not None:
            return answered if answered >= 0 else 255  # ended by a signal: no answer either
        if self.clock() < deadline:
            return None
        probe.kill()  # ssh waits on a machine that is gone: nothing to let it finish
        probe.wait()
        return -1

    def _mark_nodes(self, net: Any) -> None:
        for node in [*net.hosts, *net.switches]:
            if getattr(node, "server", None) in self.lost:
                node.lost = True

    def _wait_listening(self, server: ClusterServer, port: int) -> None:
        proc = self.forwards[server.name]
        deadline = time.monotonic() + FORWARD_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                raise RuntimeError(f"the controller's forward to {server.name} ended: {err or proc.returncode}")
            res = ssh_run(server, self.control_dir, ["ss", "-ltnH", f"sport = :{port}"])
            if f"127.0.0.1:{port}" in res.stdout:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the controller's forward to {server.name} did not listen in "
                                   f"{FORWARD_TIMEOUT_S:.0f} s")
            time.sleep(0.2)

    def mark_lost(self, net: Any) -> list[str]:
        """The far servers lost mid-run, and those that no longer answer over SSH now (at teardown);
        their nodes are marked so that teardown does not wait on their shells. Recorded in `lost`."""
        self.poll_lost(net, settle=True)  # a probe under way decides first
        gone = [s.name for s in self.far_servers if s.name not in self.lost
                and ssh_run(s, self.control_dir, ["true"], timeout=LOST_TIMEOUT_S).returncode != 0]
        self.lost += gone
        self._mark_nodes(net)
        return self.lost

    def stop(self) -> None:
        """End the forwards and the probes (idempotent)."""
        for proc in [*self.forwards.values(), *(probe for probe, _ in self.probes.values())]:
            end_process(proc)
        self.probes.clear()


def far_side(spec: ClusterSpec, control_dir: Path) -> FarSide | None:
    """The underlay of a cluster with far servers (None without any): each server's address on it
    and the smallest MTU between this machine and a far server.

    Raises
    ------
    ConfigError
        A cluster that mixes far servers with servers on this machine's loopback (a tunnel between
        them would have no underlay), or a far server with no route from here.
    """
    far = [s for s in spec.servers if s.far]
    if not far:
        return None
    if any(not s.local and not s.far for s in spec.servers):
        raise ConfigError("emulation.cluster mixes servers on other machines with servers on this machine's "
                          "loopback: use one kind")
    underlay = {LOCAL: local_underlay(far[0].host)[0]}
    mtus = []
    for server in far:
        addr = local_underlay(server.host)[0]
        if addr != underlay[LOCAL]:
            raise ConfigError(f"{server.name} is reached from {addr}, {far[0].name} from {underlay[LOCAL]}: "
                              "the far servers must share one underlay network with this machine")
        underlay[server.name] = server.host
        try:
            mtus.append(underlay_mtu(server, control_dir))
        except (RuntimeError, ValueError, OSError) as e:
            raise ConfigError(f"cluster server {server.name}: the underlay's MTU: {e}") from e
    return FarSide(spec, control_dir, underlay, min(mtus))


def tc_servers_file(path: Path, far: FarSide, plan: EmulationPlan, placement: Mapping[str, str]) -> Path:
    """Write where each far switch interface is, and how to reach its server (`controller.tc.ClusterTc`)."""
    servers = {s.name: s for s in far.far_servers}
    site_of = {sw.name: sw.site for sw in plan.switches}
    devices = {}
    for dev in switch_interfaces(plan):
        server = placement[site_of[interface_switch(dev)]]
        if server in servers:
            devices[dev] = server
    argv = {name: [*ssh_argv(s, far.control_dir), ssh_target(s)] for name, s in servers.items()}
    path.write_text(json.dumps({"servers": argv, "devices": devices}, indent=1))
    return path
