"""The emulation across servers: Mininet's cluster mode, sites placed so that heavy links stay inside one server.

``emulation: {cluster: {servers: [localhost, {ssh: "root@127.0.0.1:2222", key: PATH, known_hosts: PATH}]}}``
in an experiment config (or ``Emulation(plan, cluster=...)``) spreads the emulated sites over
several servers, with Mininet's own cluster classes (`mininet.examples.cluster`, shipped with
Debian's mininet): a site's switch and host on a remote server are a `RemoteOVSSwitch` and a
`RemoteHost`, whose shells and commands run over SSH on that server. This module holds the config,
the placement and the SSH commands; the Mininet classes are in `orchestrator.emulation.cluster_nodes`.

- **Placement** (`place_sites`): each site (its switch and host together) goes to one server. The
  sites are split by recursive Kernighan-Lin bisection (networkx) weighted by the links' emulated
  rates, with server sizes as even as the site count allows, so that the links a server cuts are
  the lightest the bisection finds. `PlacementReport` gives what was cut.
- **Links across servers** are VXLAN tunnels (this kernel has VXLAN, not GRE), shaped with the same
  htb tree as every switch link, so the controller's per-task classes apply to them as to a veth.
  Each end is made by its own server's shell. The tunnels' UDP sockets live in a private network
  namespace of the run (``netai-ul-<run id>``, only loopback), created before the devices are moved
  into the root namespace, so no tunnel endpoint listens on the machine's addresses.
- **SSH**: key authentication with the config's key only (``IdentitiesOnly``), host keys checked
  against the entry's known_hosts file (``StrictHostKeyChecking=yes``, never added), no agent
  forwarding, no ssh_config, one multiplexed connection per server. `check_servers` tries every
  server before anything starts; a refused host key is a `ConfigError` naming the known_hosts file.
  Processes started over SSH (`popen`, `rcmd`, the nodes' shells) are argument lists quoted with
  `shlex.join`, so the far shell splits them back exactly, and carry the run's mark (``NETAI_RUN``)
  for cleanup; what Mininet types into a node's shell (``node.cmd``) is its own commands, of names
  and numbers. Mininet's `ClusterCleanup` hook (``mn -c`` on every server) is never called: the
  project cleans by its marks only. `end_process` ends a process started here (an ssh, a forward,
  a site server): SIGTERM, then SIGKILL after a grace period.

Servers on this machine's loopback (the integration test's sshd on 127.0.0.1) and servers on other
machines (`ClusterServer.far`) are both run; a far server's controller channel, tunnels over the
underlay and shaping are in `orchestrator.emulation.cluster_far` (docs/cluster.md). The site
servers of compute sites on far servers run there (`orchestrator.runtime.far_servers`).
"""

from __future__ import annotations

import ipaddress
import math
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from orchestrator.errors import ConfigError, config_entry, readable_file
from topologies.plan import EmulationPlan

LOCAL = "localhost"
SERVER_KEYS = ("ssh", "key", "known_hosts", "sites")
CLUSTER_KEYS = ("servers",)
#: How long one SSH connection attempt may take.
SSH_CONNECT_TIMEOUT_S = 10
#: How long `end_process` gives a process after SIGTERM, and again after SIGKILL, by default.
STOP_GRACE_S = 5.0
#: What `check_servers` runs on a remote server: the tools the emulation runs there.
TOOL_PROBES = (["mnexec", "-v"], ["ovs-vsctl", "--version"], ["ip", "-V"], ["bridge", "-V"])
#: Environment variables a command started over SSH keeps (the far side's login environment has none
#: of ours): these names and every one the caller set to something other than this process's value.
_FORWARD_ENV = re.compile(r"^(PATH|PYTHONPATH|PYTHON[A-Z_]*|OMP_[A-Z_]+|NETAI_[A-Z_]+)$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SSH_TARGET = re.compile(r"^(?P<user>[A-Za-z_][A-Za-z0-9_.-]*)@(?P<host>[0-9.]+)(?::(?P<port>[0-9]{1,5}))?$")


@dataclass(frozen=True)
class ClusterServer:
    """A server of the cluster: ``localhost`` (this process's machine, where the controller runs) or
    one reached as ``user@ip[:port]`` over SSH with `key`, its host key checked against `known_hosts`."""

    name: str
    user: str = ""
    host: str = ""
    port: int = 22
    key: str = ""
    known_hosts: str = ""
    #: The sites placed on this server when the config says (else `place_sites` chooses).
    sites: tuple[str, ...] = ()

    @property
    def local(self) -> bool:
        return self.name == LOCAL

    @property
    def far(self) -> bool:
        """On another machine (reached at an address outside loopback)."""
        return not self.local and not ipaddress.IPv4Address(self.host).is_loopback

    def to_dict(self) -> Any:
        """The config's form of this entry (`parse_cluster` reads it back)."""
        if self.local:
            return LOCAL
        out: dict[str, Any] = {"ssh": self.name, "key": self.key, "known_hosts": self.known_hosts}
        return out | ({"sites": list(self.sites)} if self.sites else {})


@dataclass(frozen=True)
class ClusterSpec:
    """The servers an emulation is spread over (the first is ``localhost``)."""

    servers: tuple[ClusterServer, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"servers": [s.to_dict() for s in self.servers]}

    def given_placement(self, sites: Sequence[str]) -> dict[str, str] | None:
        """{site: server} when a server lists its ``sites`` (the others stay on localhost), else None."""
        if not any(s.sites for s in self.servers):
            return None
        out = dict.fromkeys(sites, LOCAL)
        for server in self.servers:
            for site in server.sites:
                if site not in out:
                    raise ConfigError(f"emulation.cluster: {server.name} lists {site!r}, which is not a site")
                out[site] = server.name
        return out


def parse_cluster(raw: Any, *, base_dir: Path | None = None) -> ClusterSpec | None:
    """``emulation.cluster`` of a config, checked; None when absent.

    Raises
    ------
    ConfigError
        One line naming the entry and what is wrong with it.
    """
    if raw is None:
        return None
    base = Path.cwd() if base_dir is None else base_dir
    raw = config_entry("emulation.cluster", raw, CLUSTER_KEYS, "servers")
    entries = raw.get("servers")
    if not isinstance(entries, list) or len(entries) < 2:
        raise ConfigError(f"emulation.cluster.servers must list at least two servers, got {entries!r}")
    if entries[0] != LOCAL:
        raise ConfigError("emulation.cluster.servers[0] must be localhost: the controller and the "
                          "orchestrator run there")
    servers = [ClusterServer(LOCAL)]
    for i, entry in enumerate(entries[1:], start=1):
        servers.append(_parse_server(f"emulation.cluster.servers[{i}]", entry, base))
    names = [s.name for s in servers]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"emulation.cluster.servers: {dup[0]} is given twice")
    return ClusterSpec(tuple(servers))


def _parse_server(where: str, entry: Any, base: Path) -> ClusterServer:
    entry = config_entry(where, entry, SERVER_KEYS, "ssh, key, known_hosts and sites")
    listed = entry.get("sites", [])
    if not isinstance(listed, list) or not all(isinstance(x, str) for x in listed):
        raise ConfigError(f"{where}.sites must be a list of site names, got {listed!r}")
    target = entry.get("ssh")
    m = _SSH_TARGET.match(target) if isinstance(target, str) else None
    if m is None:
        raise ConfigError(f"{where}.ssh must be user@ip[:port] (an IPv4 address, no password), got {target!r}")
    try:
        ip = ipaddress.IPv4Address(m["host"])
    except ValueError as e:
        raise ConfigError(f"{where}.ssh: {m['host']!r} is not an IPv4 address") from e
    if ip.is_unspecified or ip.is_multicast:
        raise ConfigError(f"{where}.ssh: {ip} is not a server's address")
    port = int(m["port"] or 22)
    if not 1 <= port <= 65535:
        raise ConfigError(f"{where}.ssh: port {port} is out of range")
    for k in ("key", "known_hosts"):
        if k not in entry:
            raise ConfigError(f"{where}: {k} is required (key authentication, host keys checked)")
    files = {k: readable_file(entry[k], base, f"{where}.{k}") for k in ("key", "known_hosts")}
    for k, path in files.items():
        if any(c.isspace() or c in "%\"'" for c in path):
            raise ConfigError(f"{where}.{k}: ssh cannot take a path with spaces, quotes or '%' ({path!r})")
    return ClusterServer(name=f"{m['user']}@{ip}:{port}", user=m["user"], host=str(ip), port=port,
                         key=files["key"], known_hosts=files["known_hosts"], sites=tuple(listed))


# -- placement --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PlacementReport:
    """Where each site went, and the links whose ends are on different servers."""

    servers: dict[str, list[str]]
    cut: list[tuple[str, str]] = field(default_factory=list)
    cut_mbps: float = 0.0
    total_mbps: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"servers": self.servers, "cut": [list(c) for c in self.cut], "cut_mbps": self.cut_mbps,
                "total_mbps": self.total_mbps}


def site_graph(plan: EmulationPlan) -> nx.Graph:
    """The plan's sites, links weighted by their emulated rate (parallel links add up)."""
    g = nx.Graph()
    g.add_nodes_from(sw.site for sw in plan.switches)
    for ln in plan.links:
        w = g.edges[ln.a, ln.b]["weight"] if g.has_edge(ln.a, ln.b) else 0.0
        g.add_edge(ln.a, ln.b, weight=w + ln.emulated_mbps)
    return g


def place_sites(plan: EmulationPlan, servers: Sequence[str], *, seed: int = 1) -> dict[str, str]:
    """{site: server}: recursive Kernighan-Lin bisection of the site graph weighted by link rate.

    Each split gives the two halves site counts in proportion to their server counts (KL swaps keep
    the sizes), starting from a breadth-first order so that each half starts connected; sites are
    visited in the plan's order, so the placement is deterministic for a seed.
    """
    if not servers:
        raise ConfigError("placing sites needs at least one server")
    g = site_graph(plan)
    out: dict[str, str] = {}
    _split(g, list(g.nodes), list(servers), out, seed)
    return out


def _split(g: nx.Graph, sites: list[str], servers: list[str], out: dict[str, str], seed: int) -> None:
    if len(servers) == 1 or len(sites) <= 1:
        for s in sites:
            out[s] = servers[0]
        return
    k1 = math.ceil(len(servers) / 2)
    n1 = max(1, min(len(sites) - 1, round(len(sites) * k1 / len(servers))))
    sub = g.subgraph(sites)
    order = _bfs_order(sub, sites)
    first, second = set(order[:n1]), set(order[n1:])
    if sub.number_of_edges():
        a, b = nx.community.kernighan_lin_bisection(sub, partition=(first, second), weight="weight", seed=seed)
        # KL keeps the two sizes but may hand the halves back in either order.
        if len(a) != n1:
            a, b = b, a
        if len(a) == n1:
            first, second = a, b
    keep = [s for s in sites if s in first]
    rest = [s for s in sites if s in second]
    _split(g, keep, servers[:k1], out, seed)
    _split(g, rest, servers[k1:], out, seed)


def _bfs_order(g: nx.Graph, sites: list[str]) -> list[str]:
    """Sites in breadth-first order from the first site of the first component, component by component."""
    seen: list[str] = []
    for s in sites:
        if s not in seen:
            seen += [n for n in nx.bfs_tree(g, s) if n not in seen]
    return seen


def checked_placement(plan: EmulationPlan, cluster: ClusterSpec | None, given: Mapping[str, str] | None,
                      host_cls: Any) -> dict[str, str]:
    """{site: server name} of a run in cluster mode (`given`, checked, or `place_sites`'), {} otherwise.

    Raises
    ------
    ConfigError
        A placement without cluster servers, containers in cluster mode, or a placement that does
        not name every site exactly, or names a server the cluster does not have.
    """
    if cluster is None:
        if given:
            raise ConfigError("a placement needs cluster servers")
        return {}
    if host_cls is not None:
        raise ConfigError("cluster mode runs plain Mininet hosts (the process backend), not containers")
    names = [s.name for s in cluster.servers]
    given = given or cluster.given_placement([sw.site for sw in plan.switches])
    placement = dict(given) if given else place_sites(plan, names)
    sites = {sw.site for sw in plan.switches}
    if set(placement) != sites:
        missing = sorted(sites - set(placement)) or sorted(set(placement) - sites)
        raise ConfigError(f"the placement must name every site exactly; check {missing[0]!r}")
    bad = sorted(s for s, srv in placement.items() if srv not in names)
    if bad:
        raise ConfigError(f"site {bad[0]!r} is placed on {placement[bad[0]]!r}, which is not a cluster server")
    return placement

def placement_report(plan: EmulationPlan, placement: Mapping[str, str], servers: Sequence[str]) -> PlacementReport:
    by_server: dict[str, list[str]] = {s: [] for s in servers}
    for sw in plan.switches:
        by_server[placement[sw.site]].append(sw.site)
    cut = [ln for ln in plan.links if placement[ln.a] != placement[ln.b]]  # links across servers
    return PlacementReport(by_server, [(ln.a, ln.b) for ln in cut], round(sum(ln.emulated_mbps for ln in cut), 3),
                           round(sum(ln.emulated_mbps for ln in plan.links), 3))


# -- SSH --------------------------------------------------------------------------------------------
def ssh_argv(server: ClusterServer, control_dir: Path) -> list[str]:
    """``ssh`` with the server's key only, its host key checked, one multiplexed connection (no target);
    no user or system ssh_config applies (``-F /dev/null``: no other identities, forwardings or proxies)."""
    return ["ssh", "-q", "-F", "/dev/null", "-p", str(server.port), "-i", server.key,
            "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none",
            "-o", "ForwardAgent=no", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={server.known_hosts}", "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}", "-o", "ServerAliveInterval=5",
            "-o", f"ControlPath={control_dir}/%C", "-o", "ControlMaster=auto", "-o", "ControlPersist=30"]


def ssh_target(server: ClusterServer) -> str:
    return f"{server.user}@{server.host}"


def check_servers(spec: ClusterSpec, control_dir: Path) -> None:
    """Reach every remote server once (host key, key, the tools the emulation needs there).

    Raises
    ------
    ConfigError
        Naming the server, and the known_hosts file when the host key was refused.
    """
    for server in spec.servers:
        if server.local:
            continue
        # the first probe reaches the server (key, host key); then the tools the emulation runs there
        probes = [["true"], *TOOL_PROBES, *([] if server.user == "root" else [["sudo", "-n", "true"]])]
        for probe in probes:
            argv = [*ssh_argv(server, control_dir), ssh_target(server), shlex.join(probe)]
            argv.remove("-q")  # keep ssh's own reason for a failure
            try:
                res = subprocess.run(argv, capture_output=True, text=True, timeout=3 * SSH_CONNECT_TIMEOUT_S,
                                     stdin=subprocess.DEVNULL, check=False)
            except subprocess.TimeoutExpired as e:
                raise ConfigError(f"cluster server {server.name}: no answer over SSH in {e.timeout:.0f} s") from e
            if res.returncode == 0:
                continue
            err = res.stderr.strip().splitlines()
            why = err[-1] if err else f"exit status {res.returncode}"
            if "host key" in res.stderr.lower() or "REMOTE HOST IDENTIFICATION HAS CHANGED" in res.stderr:
                raise ConfigError(f"cluster server {server.name}: its host key is not the one in "
                                  f"{server.known_hosts} (refused; {why})")
            if probe != ["true"]:
                raise ConfigError(f"cluster server {server.name}: `{shlex.join(probe)}` failed there "
                                  f"(missing, or sudo asks for a password): {why}")
            raise ConfigError(f"cluster server {server.name}: SSH with key {server.key} failed: {why}")


def remote_command(cmd: Sequence[str], *, run_id: str, env: Mapping[str, str] | None = None,
                   cwd: str | None = None, sudo: bool = False) -> str:
    """The one string a far shell splits back into exactly `cmd`, with the run's mark, the forwarded
    environment (see `_FORWARD_ENV`) and the working directory set by ``env``."""
    pre = ["env"]
    if cwd:
        pre += ["-C", str(cwd)]
    extra = {"NETAI_RUN": run_id}
    for k, v in (env or {}).items():
        if _ENV_NAME.match(k) and (_FORWARD_ENV.match(k) or os.environ.get(k) != v):
            extra[k] = v
    pre += [f"{k}={v}" for k, v in sorted(extra.items())]
    return shlex.join([*(["sudo", "-n", "-E"] if sudo else []), *pre, *[str(c) for c in cmd]])


@dataclass(frozen=True)
class SshResult:
    """What a command run over SSH gave: its status, output, and ssh's own reason for a failure."""

    returncode: int
    stdout: str
    stderr: str
    #: The output as it came, undecoded (an archive, say).
    raw: bytes = b""

    @property
    def why(self) -> str:
        lines = self.stderr.strip().splitlines()
        return lines[-1] if lines else f"exit status {self.returncode}"

    @property
    def host_key_refused(self) -> bool:
        return self.returncode == 255 and ("host key" in self.stderr.lower()
                                           or "REMOTE HOST IDENTIFICATION HAS CHANGED" in self.stderr)


def ssh_run(server: ClusterServer, control_dir: Path, argv: Sequence[str], *, input: bytes | None = None,
            timeout: float = 3 * SSH_CONNECT_TIMEOUT_S) -> SshResult:
    """Run `argv` on `server` (quoted with `shlex.join`, no terminal), `input` on its stdin; a timeout
    is exit status 255 with the reason, as ssh reports a connection it could not make."""
    cmd = [*ssh_argv(server, control_dir), ssh_target(server), shlex.join([str(a) for a in argv])]
    cmd.remove("-q")  # keep ssh's own reason for a failure
    try:
        res = subprocess.run(cmd, input=input, capture_output=True, timeout=timeout, check=False,
                             stdin=subprocess.DEVNULL if input is None else None)
    except subprocess.TimeoutExpired:
        return SshResult(255, "", f"no answer over SSH in {timeout:.0f} s")
    return SshResult(res.returncode, res.stdout.decode(errors="replace"), res.stderr.decode(errors="replace"),
                     res.stdout)


def own_connection_argv(server: ClusterServer, control_dir: Path) -> list[str]:
    """`ssh_argv` on a connection of its own, not the multiplexed one (a forward, or a probe of a server
    whose multiplexed connection a lost machine leaves hanging until its keepalives run out), keeping
    ssh's own reason for a failure (no ``-q``)."""
    argv = [a if a != "ControlMaster=auto" else "ControlMaster=no" for a in ssh_argv(server, control_dir)]
    argv = [a if not a.startswith("ControlPath=") else "ControlPath=none" for a in argv]
    argv.remove("-q")
    return argv


def end_process(proc: subprocess.Popen[Any], grace_s: float = STOP_GRACE_S) -> int:
    """End a process of ours that may still run: SIGTERM, up to `grace_s` for it to exit, then SIGKILL
    and up to `grace_s` again. Its exit status (negative: the signal that ended it); one that had
    already exited is only reaped. For an ssh, a forward or a site server started here.

    Raises
    ------
    subprocess.TimeoutExpired
        It outlived SIGKILL by `grace_s` (stuck in the kernel).
    """
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=grace_s)
    return int(proc.returncode)


def local_underlay(far_host: str) -> tuple[str, str]:
    """(this machine's address, its interface) on the route to `far_host`: the underlay's near end.

    Raises
    ------
    ConfigError
        No route to `far_host`.
    """
    res = subprocess.run(["ip", "-o", "route", "get", far_host], capture_output=True, text=True, check=False)
    words = res.stdout.split()
    if res.returncode != 0 or "src" not in words or "dev" not in words:
        raise ConfigError(f"no route from this machine to {far_host}: {res.stderr.strip() or res.stdout.strip()}")
    return words[words.index("src") + 1], words[words.index("dev") + 1]
