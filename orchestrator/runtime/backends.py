"""Site backends: where a compute site's server (`workers.site_server`) runs.

- ``loopback``: plain processes on this machine, each bound to its own 127.0.0.x address; no
  Mininet, no root. For quick checks and unit-level end-to-end tests.
- ``process``: the server from the project's venv in a Mininet host's network namespace
  (``host.popen``), bound to the host's emulated IP. `NamespaceBackend` does the same for the hosts
  of a network another process runs, entering each host's namespace by its pid.
- ``docker``: the server in a container that *is* the Mininet host: `DockerWorkerHost` starts a
  container with ``--network none`` and the site's CPU and memory limits, then runs the node's
  shell with ``mnexec -a <container pid>`` (cwd ``/``), so Mininet wires and configures its
  interfaces like any host's (the way Containernet does it). The server runs by ``docker exec``,
  inside the container's cgroups, so the limits apply to it and to every role it hosts.

Servers are started once per emulation by the computing manager (`orchestrator.runtime.compute`),
with argument lists only; file names come from safe host identifiers (Mininet's ``h1``..), never
from site names. `pick_backend("auto")` is ``docker`` when a Docker daemon answers and the worker
image exists, else ``process``. Every container this module starts carries the label
``org.netai.run`` so a crashed run's leftovers can be found and removed (`remove_containers`).

What this module must not do: start anything listening on a wildcard address, or leave a
container or process behind on any exit path (the computing manager stops every server in a
``finally``; the emulation's teardown removes the containers).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.emulation.cleanup import ENV_RUN
from orchestrator.emulation.cluster import end_process
from orchestrator.errors import ConfigError
from orchestrator.runtime.containers import (
    CONTAINER_CTL_DIR,
    CONTAINER_LOG_DIR,
    DEFAULT_IMAGE,
    docker_client,
    image_exists,
)
from orchestrator.runtime.containers import RUN_LABEL as RUN_LABEL  # re-exported: the callers' names stay
from orchestrator.runtime.containers import SITE_LABEL as SITE_LABEL
from orchestrator.runtime.containers import remove_containers as remove_containers
from orchestrator.runtime.forked import (
    ENV_FORKSERVER,
    PROJECT_ROOT,
    ForkedHandle,
    ForkServerClient,
    ForkServerError,
    launch_fork_server,
    new_ctl_dir,
    server_env,
)

LOG = logging.getLogger("netai.compute")

BACKENDS = ("loopback", "process", "docker")


class ProcessHandle:
    """A site server running as a local `subprocess.Popen` (loopback, or in a Mininet host)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen

    def poll(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        """SIGKILL (a crash, for fault injection)."""
        if self.popen.poll() is None:
            self.popen.kill()

    def stop(self) -> None:
        end_process(self.popen)


class _LocalServers:
    """What the loopback, process and attached backends share: a server is a process of the
    project's venv on this machine's file system (paths are the same inside), forked from one
    warmed fork server (`orchestrator.runtime.forked`) when it starts, else started on its own.
    Subclasses say where it runs."""

    name: str
    log_root: Path
    ctl_dir: Path
    _python: str
    _forks: ForkServerClient | None = None
    _fork_failed: str | None = None
    #: Whether this backend's servers fork from the fork server. A subclass that changes how a server
    #: is started (its `_popen`: pinning, another namespace) starts each on its own unless it says so.
    forked: bool = False

    def _popen(self, site: str, cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def _netns_pid(self, site: str) -> int | None:
        """The process whose network namespace `site`'s server runs in (None: this one)."""
        return None

    def _fork_env(self) -> dict[str, str]:
        return server_env()

    def inside(self, path: Path, site: str | None = None) -> str:
        return str(path.resolve())

    def launch_server(self, site: str, argv: list[str], *, out_name: str) -> ProcessHandle | ForkedHandle:
        out_dir = self.log_root / "servers"
        out_dir.mkdir(parents=True, exist_ok=True)
        forks = self._fork_server(out_dir) if self.forked else None
        if forks is not None:
            try:
                return forks.spawn(argv, netns_pid=self._netns_pid(site), log_file=out_dir / out_name)
            except ForkServerError as e:
                LOG.warning("forking the site server of %r failed (%s): it starts on its own", site, e)
        with open(out_dir / out_name, "ab") as out:
            popen = self._popen(site, [self._python, "-m", "workers.site_server", *argv], stdout=out,
                                stderr=subprocess.STDOUT, cwd=str(PROJECT_ROOT), env=server_env())
        return ProcessHandle(popen)

    def _fork_server(self, out_dir: Path) -> ForkServerClient | None:
        """The fork server, started on first use (or launched early: `forked.early_fork_server`) and connected;
        None where it cannot start (then each server starts on its own, as ``NETAI_FORKSERVER=0`` asks)."""
        if (self._forks is None or self._forks.conn is None) and self._fork_failed is None:
            if os.environ.get(ENV_FORKSERVER, "1") == "0":
                self._fork_failed = f"{ENV_FORKSERVER}=0"
                return None
            try:
                self._forks = self._forks or launch_fork_server(self._python, ctl_dir=self.ctl_dir, out_dir=out_dir,
                                                                env=self._fork_env())
                self._forks.connect()
            except ForkServerError as e:
                self.close()
                self._fork_failed = str(e)
                LOG.warning("no fork server (%s): each site server imports torch on its own", e)
        return self._forks

    def close(self) -> None:
        """Stop the fork server (and any server it forked that still runs)."""
        if self._forks is not None:
            self._forks.close()
            self._forks = None


class LoopbackBackend(_LocalServers):
    """Site servers as local processes on 127.0.0.x addresses (no Mininet, no root).

    Parameters
    ----------
    sites
        The compute sites, in a fixed order: site i gets 127.0.0.(first_octet + i).
    log_root
        Where the servers' output and the tasks' events go (created).
    """

    name = "loopback"
    forked = True

    def __init__(self, sites: Iterable[str], *, log_root: Path, first_octet: int = 2,
                 python: str = sys.executable) -> None:
        sites = list(sites)
        if first_octet + len(sites) > 254:
            raise ConfigError(f"{len(sites)} sites do not fit in 127.0.0.{first_octet}-254")
        self._addr = {s: f"127.0.0.{first_octet + i}" for i, s in enumerate(sites)}
        self._id = {s: f"n{i + 1}" for i, s in enumerate(sites)}
        self._python = python
        self.log_root = log_root
        log_root.mkdir(parents=True, exist_ok=True)
        self.ctl_dir = new_ctl_dir()

    def address(self, site: str) -> str:
        return self._addr[site]

    def host_id(self, site: str) -> str:
        return self._id[site]

    def _popen(self, site: str, cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(cmd, **kw)


class _EmulatedHosts:
    """Sites that are Mininet hosts (plain or containers): their address and safe identifier."""

    _hosts: dict[str, Any]

    def address(self, site: str) -> str:
        try:
            return str(self._hosts[site].IP())
        except KeyError as e:
            raise ConfigError(f"site {site!r} has no emulated host") from e

    def host_id(self, site: str) -> str:
        return str(self._hosts[site].name)


class ProcessBackend(_EmulatedHosts, _LocalServers):
    """Site servers in Mininet hosts' namespaces, from the project's venv.

    Parameters
    ----------
    hosts
        Site -> Mininet host object (``net.get(plan.host(site).name)``).
    log_root
        Where the servers' output and the tasks' events go (created).
    """

    name = "process"
    forked = True

    def __init__(self, hosts: Mapping[str, Any], *, log_root: Path, python: str = sys.executable,
                 forks: ForkServerClient | None = None) -> None:
        self._hosts = dict(hosts)
        self._python, self._forks = python, forks  # `forks`: launched early, not yet connected
        self.log_root = log_root
        log_root.mkdir(parents=True, exist_ok=True)
        self.ctl_dir = new_ctl_dir()

    def _popen(self, site: str, cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        popen: subprocess.Popen[bytes] = self._hosts[site].popen(cmd, **kw)
        return popen

    def _netns_pid(self, site: str) -> int | None:
        return int(self._hosts[site].pid)


def enter_net_namespace(pid: int) -> list[str]:
    """The argument list prefix that runs a command in process `pid`'s network namespace (and no
    other): ``nsenter --net=/proc/PID/ns/net --``, else Mininet's ``mnexec -a PID``.

    Raises
    ------
    ConfigError
        Neither tool is installed.
    """
    nsenter = shutil.which("nsenter")
    if nsenter is not None:
        return [nsenter, f"--net=/proc/{int(pid)}/ns/net", "--"]
    mnexec = shutil.which("mnexec")
    if mnexec is not None:
        return [mnexec, "-a", str(int(pid))]
    raise ConfigError("entering a host's network namespace needs nsenter (util-linux) or mnexec (Mininet)")


class NamespaceBackend(_EmulatedHosts, _LocalServers):
    """Site servers in the network namespaces of hosts another process's emulation owns (``netai task
    run --attach`` on a network ``netai net up`` runs): the process backend, entering each host's
    namespace by its pid (`enter_net_namespace`) instead of through a Mininet object.

    Each server carries the network's run mark (``NETAI_RUN``), so the network's teardown (or
    ``netai clean``) stops any that outlive the attaching process.

    Parameters
    ----------
    hosts
        Site -> its host: pid (the shell holding the namespace), IPv4 address, Mininet name (``h3``).
    log_root
        Where the servers' output and the tasks' events go (created).
    run_id
        The network's run id (the mark).
    """

    name = "attached"
    forked = True

    def __init__(self, hosts: Mapping[str, tuple[int, str, str]], *, log_root: Path, run_id: str,
                 python: str = sys.executable) -> None:
        self._hosts = {site: _NamespaceHost(pid, ip, name) for site, (pid, ip, name) in hosts.items()}
        self._python = python
        self.run_id = run_id
        self.log_root = log_root
        log_root.mkdir(parents=True, exist_ok=True)
        self.ctl_dir = new_ctl_dir()

    def _popen(self, site: str, cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        host = self._hosts[site]
        env = dict(kw.pop("env", None) or os.environ)
        env[ENV_RUN] = self.run_id
        return subprocess.Popen([*enter_net_namespace(host.pid), *cmd], env=env, **kw)

    def _netns_pid(self, site: str) -> int | None:
        return int(self._hosts[site].pid)

    def _fork_env(self) -> dict[str, str]:
        return server_env() | {ENV_RUN: self.run_id}


class _NamespaceHost:
    """What `_EmulatedHosts` asks of a host (``IP()``, ``name``), for a host known by its pid only."""

    def __init__(self, pid: int, ip: str, name: str) -> None:
        self.pid, self.ip, self.name = pid, ip, name

    def IP(self) -> str:  # Mininet's name for it
        return self.ip


# -- Docker (the client, image and labels: `orchestrator.runtime.containers`) ---------------------------
def pick_backend(name: str, *, image: str = DEFAULT_IMAGE) -> str:
    """Resolve ``auto`` to ``docker`` (daemon and image present) or ``process``; check others."""
    if name not in (*BACKENDS, "auto"):
        raise ConfigError(f"unknown backend {name!r}: use auto, {', '.join(BACKENDS)}")
    if name != "auto":
        return name
    if shutil.which("docker") is None:
        return "process"
    try:
        client = docker_client()
    except ConfigError:
        return "process"
    try:
        return "docker" if image_exists(client, image) else "process"
    finally:
        client.close()


#: The checkout's image build script (``<checkout>/scripts``; absent from an installed package).
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_worker_image.sh"


def ensure_worker_image(*, quiet: bool = False) -> None:
    """Rebuild the worker image if its recorded source hash differs from this checkout's
    (``scripts/build_worker_image.sh --if-stale``: about a second when nothing changed, seconds
    when only the project's code did). Without the script (an installed package) nothing happens.

    Raises
    ------
    ConfigError
        If the build fails (its last output lines are in the message).
    """
    if not BUILD_SCRIPT.exists():
        return
    res = subprocess.run(["bash", str(BUILD_SCRIPT), "--if-stale"], capture_output=True, text=True)
    if not quiet and "up to date" not in res.stdout:
        for line in res.stdout.splitlines():
            print(line, file=sys.stderr)
    if res.returncode != 0:
        tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
        raise ConfigError(f"building the worker image failed: {tail}")


class ExecHandle:
    """A site server started by ``docker exec`` in a worker container."""

    def __init__(self, host: Any, exec_id: str) -> None:
        self.host = host
        self.exec_id = exec_id
        #: The container's memory limit (the site's ``memory_mb``), for a server killed for memory.
        self.memory_mb: int | None = getattr(host, "memory_mb", None)

    @property
    def host_pid(self) -> int | None:
        """The server's pid on this machine (not the container's numbering); None once it is gone."""
        with contextlib.suppress(Exception):  # the container is gone, and the server with it
            return int(self.host.dclient.api.exec_inspect(self.exec_id).get("Pid") or 0) or None
        return None

    def memory(self) -> Any:
        """The container's memory cgroup (`runtime.memory.container_memory`); None if it cannot be read."""
        from orchestrator.runtime.memory import container_memory

        return container_memory(self.host.container)

    def poll(self) -> int | None:
        try:
            info = self.host.dclient.api.exec_inspect(self.exec_id)
        except Exception:  # noqa: BLE001 -- the container is gone, and the server with it
            return -9
        if info.get("Running"):
            return None
        code = info.get("ExitCode")
        return -9 if code is None else int(code)

    def stop(self) -> None:
        if self.poll() is None:
            pid = self.host.dclient.api.exec_inspect(self.exec_id).get("Pid")
            if pid:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass


class DockerBackend(_EmulatedHosts):
    """Site servers in the worker containers that are the Mininet hosts (`DockerWorkerHost`).

    Parameters
    ----------
    hosts
        Site -> `DockerWorkerHost`; all mount the same host directories: `log_root` at
        `CONTAINER_LOG_DIR` and `ctl_dir` at `CONTAINER_CTL_DIR` (see `emulation_options`).
    """

    name = "docker"

    def __init__(self, hosts: Mapping[str, Any], *, log_root: Path, ctl_dir: Path) -> None:
        self._hosts = dict(hosts)
        self.log_root = log_root.resolve()
        self.ctl_dir = ctl_dir

    def container(self, site: str) -> Any:
        """The Docker SDK container object of a site's host."""
        return self._hosts[site].container

    def inside(self, path: Path, site: str | None = None) -> str:
        real = path.resolve()
        for host_dir, mount in ((self.log_root, CONTAINER_LOG_DIR), (self.ctl_dir.resolve(), CONTAINER_CTL_DIR)):
            if real.is_relative_to(host_dir):
                rel = real.relative_to(host_dir)
                return mount if str(rel) == "." else f"{mount}/{rel}"
        raise ConfigError(f"{path} is not under a directory the worker containers mount")

    def close(self) -> None:
        """Nothing to stop here: each server runs in its container (the emulation removes them)."""

    def launch_server(self, site: str, argv: list[str], *, out_name: str) -> ExecHandle:
        return ExecHandle(self._hosts[site], self._hosts[site].exec_server(argv))


# -- wiring into the emulation -------------------------------------------------------------------------
def emulation_options(kind: str, *, log_dir: Path, image: str = DEFAULT_IMAGE,
                      clients: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Keyword arguments for `orchestrator.emulation.network.Emulation` that host a backend's servers.

    ``docker``: every host is a `DockerWorkerHost` of `image` with its site's CPU and memory limits,
    mounting `log_dir` (created; the servers' log root) at `CONTAINER_LOG_DIR` and a fresh control
    socket directory at `CONTAINER_CTL_DIR`; a site in `clients` ({site: Docker client}, e.g. over
    SSH: `orchestrator.runtime.remote`) has its container made through that client. ``process``:
    plain Mininet hosts ({}).
    """
    if kind == "process":
        if clients:
            raise ConfigError("sites on other Docker daemons (compute.servers) need the docker backend")
        return {}
    if kind != "docker":
        raise ConfigError(f"backend {kind!r} does not run in the emulation (use docker or process)")
    log_dir.mkdir(parents=True, exist_ok=True)
    root = str(log_dir.resolve())
    ctl = str(new_ctl_dir())

    def params(h: Any) -> dict[str, Any]:
        out = {"image": image, "cpus": float(h.cpu), "memory_mb": int(h.memory_mb), "log_dir": root, "ctl_dir": ctl}
        if clients and h.site in clients:
            out["docker_client"] = clients[h.site]
        return out

    from orchestrator.runtime.docker_host import make_docker_host_class

    return {"host_cls": make_docker_host_class(), "host_params": params}


def open_backend(kind: str, emu: Any, *, log_root: Path,
                 forks: ForkServerClient | None = None) -> ProcessBackend | DockerBackend:
    """The site backend over a running emulation's hosts (one per compute site).

    `log_root`: the servers' log root for the process backend; the docker backend's is the directory
    its containers mount (given to `emulation_options`). `forks`: the process backend's fork server,
    launched early (`forked.early_fork_server`).
    """
    hosts = {h.site: emu.host(h.site) for h in emu.plan.hosts}
    if kind == "process":
        return ProcessBackend(hosts, log_root=log_root, forks=forks)
    if kind == "docker":
        mounts = {(getattr(h, "log_dir", None), getattr(h, "ctl_dir", None)) for h in hosts.values()}
        if len(mounts) != 1 or None in next(iter(mounts)):
            raise ConfigError("the emulation's hosts are not worker containers: build it with "
                              "emulation_options('docker', log_dir=...)")
        log_dir, ctl_dir = mounts.pop()
        return DockerBackend(hosts, log_root=Path(str(log_dir)), ctl_dir=Path(str(ctl_dir)))
    raise ConfigError(f"backend {kind!r} does not run in the emulation (use docker or process)")


def open_compute(kind: str, emu: Any, *, log_root: Path, forks: ForkServerClient | None = None) -> Any:
    """A `ComputeManager` (not yet started) with one site server per compute site of `emu`; those of
    sites placed on other machines run there (`orchestrator.runtime.far_servers`, process backend).
    `forks`: the process backend's fork server, launched early (`forked.early_fork_server`)."""
    from orchestrator.runtime.compute import ComputeManager

    cluster = getattr(emu, "cluster", None)
    far = {s.name: s for s in cluster.servers if s.far} if cluster is not None else {}
    placed_far = {h.site: far[emu.placement[h.site]] for h in emu.plan.hosts if emu.placement.get(h.site) in far}
    backend: Any = open_backend(kind, emu, log_root=log_root, forks=forks)
    if placed_far:  # docs/cluster.md, "What runs where"
        from orchestrator.runtime.far_servers import FarBackend, SplitBackend

        if kind != "process":
            raise ConfigError("site servers on other machines run with the process backend")
        hosts = {site: emu.host(site) for site in placed_far}
        backend = SplitBackend(backend, FarBackend(hosts, placed_far, log_root=log_root, ctl_dir=backend.ctl_dir,
                                                   run_id=emu.run_id,
                                                   lost=lambda: set(emu.lost_sites(settle=True).values())))
    return ComputeManager(backend, [h.site for h in emu.plan.hosts])
