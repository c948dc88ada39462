"""Mininet's node, switch and link classes for cluster mode: each node on its site's server.

Built on Mininet's own cluster classes (`mininet.examples.cluster`): a node on a remote server is a
`RemoteHost` or `RemoteOVSSwitch` whose commands run over SSH with the server's own options
(`orchestrator.emulation.cluster.ssh_argv`), quoted with `shlex.join` and carrying the run's mark;
a link between servers is a VXLAN tunnel in the run's underlay namespace (see
`orchestrator.emulation.cluster` for the whole design). Mininet is imported only when a run is built.
"""

from __future__ import annotations

import itertools
import os
import shlex
import subprocess
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from itertools import groupby
from operator import attrgetter
from pathlib import Path
from typing import Any

from orchestrator.emulation.cleanup import underlay_netns
from orchestrator.emulation.cluster import (
    LOCAL,
    ClusterServer,
    ClusterSpec,
    remote_command,
    ssh_argv,
    ssh_target,
)
from orchestrator.emulation.cluster_far import FarSide
from topologies.plan import EmulationPlan


def cluster_classes(run_id: str, spec: ClusterSpec, placement: Mapping[str, str], plan: EmulationPlan,
                    control_dir: Path, switch_cls: Any, link_cls: Any,
                    far: FarSide | None = None) -> tuple[Any, Any, Any]:
    """(host, switch, link) constructors for Mininet that put each node on its site's server.

    `switch_cls` is the run's switch class (its bridges tagged), `link_cls` the shaped link class;
    both are extended, not replaced. With `far` (servers on other machines), tunnels run over its
    underlay (`orchestrator.emulation.cluster_far`).
    """
    servers = {s.name: s for s in spec.servers}
    node_server = {sw.name: placement[sw.site] for sw in plan.switches}
    node_server |= {h.name: placement[h.site] for h in plan.hosts}

    def server_of(name: str) -> ClusterServer:
        return servers[node_server[name]]

    ssh_node = _ssh_node_class(run_id, server_of, control_dir)
    cluster_host, cluster_switch = _host_class(ssh_node), _switch_class(ssh_node, switch_cls)

    def _where(name: str) -> dict[str, Any]:
        srv = server_of(name)
        if srv.local:
            return {"server": LOCAL}
        return {"server": srv.name, "serverIP": srv.host, "user": srv.user}

    def host(name: str, *args: Any, **params: Any) -> Any:
        return cluster_host(name, *args, **_where(name), **params)

    def switch(name: str, *args: Any, **params: Any) -> Any:
        return cluster_switch(name, *args, **_where(name), **params)

    return host, switch, _link_class(run_id, link_cls, far)


def _ssh_node_class(run_id: str, server_of: Callable[[str], ClusterServer], control_dir: Path) -> Any:
    """The mixin giving a node RemoteMixin's SSH with the server's own options, quoted commands and
    the run's mark."""
    from mininet.node import Node

    class SshNode:
        """RemoteMixin's SSH, with the server's own options, quoted commands and the run's mark."""

        isRemote: bool
        server: str
        name: str
        pid: int
        #: Its server was lost (`orchestrator.emulation.cluster_far.FarSide.mark_lost`): its shell is
        #: gone, and Mininet would wait on it forever; what teardown sends it is dropped.
        lost: bool = False

        def cmd(self, *args: Any, **kwargs: Any) -> str:
            return "" if self.lost else str(super().cmd(*args, **kwargs))  # type: ignore[misc]

        def rcmd(self, *args: Any, **kwargs: Any) -> str:
            return "" if self.lost else str(super().rcmd(*args, **kwargs))  # type: ignore[misc]

        def _popen(self, cmd: Any, sudo: bool = True, tt: bool = True, **params: Any) -> Any:
            if isinstance(cmd, str):
                cmd = cmd.split()
            if not self.isRemote:
                return Node._popen(self, cmd, **params)  # a local node: plain Mininet
            srv = server_of(self.name)
            env, cwd = params.pop("env", None), params.pop("cwd", None)
            line = remote_command(cmd, run_id=run_id, env=env, cwd=cwd, sudo=sudo and srv.user != "root")
            params.setdefault("stdin", subprocess.DEVNULL)  # never the orchestrator's terminal
            # Its own process group: a Ctrl-C meant for the orchestrator does not cut the SSH session
            # that teardown still needs (RemoteMixin does the same).
            params.update(preexec_fn=os.setpgrp)
            return Node._popen(self, [*ssh_argv(srv, control_dir), *(["-tt"] if tt else []), ssh_target(srv), line],
                               **params)

        def popen(self, *args: Any, **kwargs: Any) -> Any:
            """Mininet's popen, with a terminal on the far side (``ssh -tt``): when the local ssh ends
            (`ProcessHandle.stop` or `kill`), the far process gets the hangup and ends too, where
            without a terminal it would run on. The namespace is entered with ``mnexec -a`` only: with
            ``-d`` mnexec forks and its first process exits at once when it leads its process group,
            as it does over SSH (its own session), so the caller would lose the process it started."""
            kwargs.setdefault("mncmd", ["mnexec", "-a", str(self.pid)])
            if self.isRemote:
                kwargs["tt"] = True
            return Node.popen(self, *args, **kwargs)

    return SshNode


def _host_class(ssh_node: Any) -> Any:
    """RemoteHost over `ssh_node`."""
    from mininet.examples.cluster import RemoteHost

    class ClusterHost(ssh_node, RemoteHost):
        pass

    return ClusterHost


def _switch_class(ssh_node: Any, switch_cls: Any) -> Any:
    """RemoteOVSSwitch over `ssh_node`, with the run's bridge tag (`switch_cls`)."""
    from mininet.examples.cluster import RemoteOVSSwitch
    from mininet.node import OVSSwitch

    class ClusterSwitch(ssh_node, RemoteOVSSwitch, switch_cls):
        """RemoteOVSSwitch (per-server batch start-up and shutdown) with the run's bridge tag."""

        @classmethod
        def batchStartup(cls, switches: Any, **_kwargs: Any) -> Any:
            """Per server, Mininet's batch of ``ovs-vsctl`` commands run as one argument list
            (split, no shell) rather than typed into the first switch's shell as `RemoteOVSSwitch` does: a
            terminal in line mode cuts a line at 4095 bytes, which a server of a dozen switches exceeds.
            The servers' batches run at once (each waits on its own Open vSwitch)."""
            _per_server(switches, lambda members: OVSSwitch.batchStartup(members, run=_runner(members[0])))
            return switches

        @classmethod
        def batchShutdown(cls, switches: Any, **_kwargs: Any) -> Any:
            _per_server(switches, lambda members: OVSSwitch.batchShutdown(members, run=_runner(members[0])))
            return switches

    return ClusterSwitch


def _per_server(switches: Any, each: Callable[[tuple[Any, ...]], Any]) -> None:
    """``each(members)`` for every server's switches, the servers at once (`_at_once`)."""
    key = attrgetter("server")
    _at_once([partial(each, tuple(group)) for _server, group in groupby(sorted(switches, key=key), key)])


def _at_once(calls: Sequence[Callable[[], Any]]) -> None:
    """Run `calls` on threads of their own (a lone call here); the first failure is raised once every
    call has ended."""
    if len(calls) < 2:
        for call in calls:
            call()
        return
    with ThreadPoolExecutor(len(calls)) as pool:
        running = [pool.submit(call) for call in calls]
    for done in running:
        done.result()


def _link_class(run_id: str, link_cls: Any, far: FarSide | None) -> type:
    """The shaped link class `link_cls` (a class or a `functools.partial` of one), as a veth pair
    within a server and a VXLAN tunnel between two servers."""
    from mininet.link import Link

    shaped = link_cls.func if hasattr(link_cls, "func") else link_cls
    link_kw = dict(getattr(link_cls, "keywords", {}) or {})
    # VXLAN ids and UDP ports of the run's tunnels (in the run's own namespace: any free range works)
    vnis, ports = itertools.count(1), itertools.count(47001)

    class ClusterLink(shaped):  # type: ignore[misc,valid-type]
        """A veth pair within a server, a VXLAN tunnel between two servers (see the module docstring)."""

        def __init__(self, node1: Any, node2: Any, **kw: Any) -> None:
            super().__init__(node1, node2, **(link_kw | kw))

        def makeIntfPair(self, intfname1: str, intfname2: str, addr1: Any = None, addr2: Any = None,
                         node1: Any = None, node2: Any = None, deleteIntfs: bool = True) -> Any:
            s1, s2 = getattr(node1, "server", LOCAL), getattr(node2, "server", LOCAL)
            if s1 == s2:
                return Link.makeIntfPair(intfname1, intfname2, addr1, addr2, node1, node2, deleteIntfs=deleteIntfs)
            if node1.inNamespace or node2.inNamespace:
                raise RuntimeError(f"{node1}-{node2}: only links between switches may cross servers")
            vni, p1, p2 = next(vnis), next(ports), next(ports)
            if far is not None:
                ends = (far.underlay[s1], far.underlay[s2])
                made = [partial(_vxlan_underlay, node1, intfname1, vni, (p1, p2), ends, addr1, far.inner_mtu),
                        partial(_vxlan_underlay, node2, intfname2, vni, (p2, p1), ends[::-1], addr2, far.inner_mtu)]
            else:
                made = [partial(_vxlan, node1, intfname1, vni, p1, p2, addr1, run_id),
                        partial(_vxlan, node2, intfname2, vni, p2, p1, addr2, run_id)]
            _at_once(made)  # each end on its own server (each command an SSH session on a far one)
            return None

    return ClusterLink


def _runner(node: Any) -> Any:
    """A ``run`` for Mininet's batch functions: its command line (Mininet's own ``ovs-vsctl`` and
    ``kill`` commands, of names and numbers) split into an argument list and run on `node`'s server,
    in its root namespace, with no terminal and no shell."""

    def run(cmd: str, **_kwargs: Any) -> str:
        out: str = node.rcmd(shlex.split(cmd), tt=False)
        return out

    return run


def _vxlan(node: Any, name: str, vni: int, port: int, peer_port: int, mac: str | None, run_id: str) -> None:
    """One end of a tunnel, made by `node`'s server in the run's underlay namespace, then moved to the
    root namespace (keeping its address and MTU): ``name`` sends to the peer's port on loopback and
    listens on `port`."""
    ns = underlay_netns(run_id)
    _tunnel_end(node, name, [
        ["ip", "-n", ns, "link", "add", name, *_link_attrs(mac, 1500), "type", "vxlan", "id", str(vni),
         "local", "127.0.0.1", "dstport", str(port), "nolearning"],
        ["ip", "-n", ns, "link", "set", name, "netns", "1"],
        ["bridge", "fdb", "append", "00:00:00:00:00:00", "dev", name, "dst", "127.0.0.1", "port", str(peer_port)],
    ])


def _link_attrs(mac: str | None, mtu: int) -> list[str]:
    """A tunnel end's MTU and, if given, its MAC, set as ``ip link add`` makes it (fewer commands: each
    is an SSH session on a far server)."""
    return [*(["address", str(mac)] if mac else []), "mtu", str(mtu)]


def _tunnel_end(node: Any, name: str, steps: list[list[str]]) -> None:
    """Run a tunnel end's `steps` on `node`'s server, then bring it up; any output of a step is its
    error."""
    for argv in [*steps, ["ip", "link", "set", name, "up"]]:
        out = node.rcmd(argv).strip()
        if out:
            raise RuntimeError(f"tunnel end {name} on {node.server}: {shlex.join(argv)}: {out}")


def _vxlan_underlay(node: Any, name: str, vni: int, ports: tuple[int, int], ends: tuple[str, str],
                    mac: str | None, mtu: int) -> None:
    """One end of a tunnel between machines, made by `node`'s server in its root namespace: ``name``
    sends from the underlay address ``ends[0]`` to the peer's ``ends[1]`` (UDP port ``ports[1]``) and
    receives on ``ports[0]``; its MTU is the underlay's less the encapsulation."""
    _tunnel_end(node, name, [
        ["ip", "link", "add", name, *_link_attrs(mac, mtu), "type", "vxlan", "id", str(vni), "local", ends[0],
         "dstport", str(ports[0]), "nolearning"],
        ["bridge", "fdb", "append", "00:00:00:00:00:00", "dev", name, "dst", ends[1], "port", str(ports[1])],
    ])


def create_underlay(run_id: str) -> str:
    """Create the run's underlay namespace (loopback up); returns its name."""
    ns = underlay_netns(run_id)
    for argv in (["ip", "netns", "add", ns], ["ip", "-n", ns, "link", "set", "lo", "up"]):
        res = subprocess.run(argv, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise RuntimeError(f"{shlex.join(argv)}: {res.stderr.strip()}")
    return ns
