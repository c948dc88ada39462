"""`DockerWorkerHost`: a Mininet host that lives in a Docker container (the Containernet technique).

The container starts with ``--network none`` and the site's CPU and memory limits; the node's
shell joins its namespaces with ``mnexec -a``, so Mininet wires and configures the host's
interfaces like any host's. The site server runs in it by ``docker exec`` (inside the container's cgroups).
Imported only when the docker backend is used (it needs Mininet).
"""

from __future__ import annotations

import os
import threading
import uuid
from typing import Any, ClassVar

from mininet.node import Host

from orchestrator.runtime.containers import (
    CONTAINER_CTL_DIR,
    CONTAINER_LOG_DIR,
    DEFAULT_IMAGE,
    RUN_LABEL,
    SITE_LABEL,
    remove_containers,
    shared_client,
    wait_running,
)
from orchestrator.runtime.site_cgroup import SiteGroup, for_daemon


class DockerWorkerHost(Host):
    """A Mininet host that lives in a Docker container (the Containernet technique).

    Extra parameters (Mininet passes ``addHost`` keyword arguments through): ``image``,
    ``run_id`` (container label), ``cpus`` (CPU limit, cores), ``memory_mb``, ``log_dir``
    (host directory mounted at `CONTAINER_LOG_DIR`), ``ctl_dir`` (the site servers' control
    socket directory, mounted at `CONTAINER_CTL_DIR`), ``docker_client``.

    An interrupt can land inside ``containers.run``, after the daemon made the container and
    before this host knows it: `remove_run` (the emulation's teardown calls it) removes every
    container of a run by its label, through every Docker client a host of this class used.
    """

    #: The Docker clients hosts of this class made containers through (id -> client).
    clients: ClassVar[dict[int, Any]] = {}
    #: Container removals `terminate` started and `remove_run` joins: Mininet's stop terminates the
    #: hosts one after another, and each removal waits for the daemon (the kill, the unmount), so they
    #: run side by side. Not daemon threads: one still running at exit is finished, not dropped.
    removing: ClassVar[list[threading.Thread]] = []
    #: The site CPU group of each Docker client's daemon (`orchestrator.runtime.site_cgroup`), by client id.
    groups: ClassVar[dict[int, SiteGroup]] = {}
    _removing_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(
        self,
        name: str,
        *,
        image: str = DEFAULT_IMAGE,
        run_id: str = "",
        cpus: float | None = None,
        memory_mb: int | None = None,
        log_dir: str | None = None,
        ctl_dir: str | None = None,
        docker_client: Any = None,
        **params: Any,
    ) -> None:
        self.image = image
        self.run_id = run_id or os.environ.get("NETAI_RUN") or uuid.uuid4().hex[:12]
        self.cpus = cpus
        self.memory_mb = memory_mb
        self.log_dir = log_dir
        self.ctl_dir = ctl_dir
        self.dclient = docker_client
        self.container: Any = None
        super().__init__(name, **params)

    def startShell(self, mnopts: str | None = None) -> None:
        if getattr(self, "shell", None):
            return
        local = self.dclient is None
        if local:
            self.dclient = shared_client()
        kwargs: dict[str, Any] = {
            "name": f"netai-{self.run_id}-{self.name}",
            "command": ["sleep", "infinity"],
            "network_mode": "none",
            "detach": True,
            "hostname": self.name,
            "labels": {RUN_LABEL: self.run_id, SITE_LABEL: self.name},
            "init": True,
            # IPv6 neighbour discovery would only hit the table-miss entry (the emulation's
            # own sysctl cannot write the container's read-only /proc/sys).
            "sysctls": {"net.ipv6.conf.all.disable_ipv6": "1", "net.ipv6.conf.default.disable_ipv6": "1"},
        }
        if self.cpus:
            kwargs["nano_cpus"] = int(self.cpus * 1e9)
        if self.memory_mb:
            # the site's memory, swap included: Docker's default lets a container swap as much again
            kwargs["mem_limit"] = kwargs["memswap_limit"] = f"{int(self.memory_mb)}m"
        group = type(self).groups.get(id(self.dclient))
        if group is None:
            group = type(self).groups[id(self.dclient)] = for_daemon(self.dclient, local=local)
        parent = group.join(self.cpus)
        if parent is not None:
            kwargs["cgroup_parent"] = parent
        volumes = {}
        if self.log_dir:
            volumes[self.log_dir] = {"bind": CONTAINER_LOG_DIR, "mode": "rw"}
        if self.ctl_dir:
            volumes[self.ctl_dir] = {"bind": CONTAINER_CTL_DIR, "mode": "rw"}
        if volumes:
            kwargs["volumes"] = volumes
        type(self).clients[id(self.dclient)] = self.dclient  # before the daemon can have made it
        self.container = self.dclient.containers.run(self.image, **kwargs)
        cpid = wait_running(self.container, 60.0)
        # Mininet's hook for how a node's shell is spawned is startShell's `mnopts` (mnexec's
        # options). ``-a PID`` joins the container's network and mount namespaces. Mininet
        # appends "n" (a new namespace) for nodes in a namespace; this node's namespace is the
        # container's, so inNamespace is off while the shell starts and on again after it
        # (Mininet then moves the host's interfaces into it, as for any host).
        self.inNamespace = False
        try:
            super().startShell(mnopts=f"-cda{cpid}")
        finally:
            self.inNamespace = True

    def _popen(self, cmd: list[str], **params: Any) -> Any:
        # The one Mininet internal this class relies on: every process of a node (its shell,
        # and `popen`) is spawned through Node._popen. No public hook sets the working
        # directory, and the caller's does not exist inside the container's mount namespace.
        if params.get("cwd") is None:
            params["cwd"] = "/"
        return super()._popen(cmd, **params)

    def mountPrivateDirs(self) -> None:
        pass  # the container has its own mount namespace

    def unmountPrivateDirs(self) -> None:
        pass

    def terminate(self) -> None:
        """Mininet's terminate, then the container's removal on its own thread (`remove_run` joins it)."""
        try:
            super().terminate()
        finally:
            container, self.container = self.container, None
            if container is not None:
                t = threading.Thread(target=_remove_quietly, args=(container,), name=f"rm-{self.name}")
                try:
                    t.start()
                except RuntimeError:  # no thread to be had: remove it here, as before
                    _remove_quietly(container)
                else:
                    with self._removing_lock:
                        type(self).removing.append(t)

    @classmethod
    def join_removals(cls) -> None:
        """Wait for the removals `terminate` started."""
        with cls._removing_lock:
            pending, cls.removing[:] = list(cls.removing), []
        for t in pending:
            t.join()

    @classmethod
    def remove_run(cls, run_id: str) -> int:
        """Wait for the removals `terminate` started, then remove every container still labelled with
        `run_id`, through every client used; how many of those."""
        cls.join_removals()
        removed = 0
        for client in list(cls.clients.values()):
            try:
                removed += remove_containers(client, run_id=run_id)
            except Exception:  # noqa: BLE001 -- a daemon gone (a lost server): the others still go
                pass
        for group in cls.groups.values():
            group.remove()
        cls.groups.clear()
        return removed

    @classmethod
    def describe_groups(cls) -> str | None:
        """Where the site containers' CPU weight came from (`SiteGroup.describe`), one line; None: no container."""
        return "; ".join(g.describe() for g in cls.groups.values()) or None

    def exec_server(self, argv: list[str]) -> str:
        """Start the site server (``python -m workers.site_server`` + `argv`, an argument list) by
        ``docker exec``, inside the container's cgroups; the exec id."""
        api = self.dclient.api
        ex = api.exec_create(
            self.container.id, ["python", "-m", "workers.site_server", *argv],
            environment={"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}, workdir="/",
        )
        api.exec_start(ex["Id"], detach=True)
        return str(ex["Id"])


#: At most this many removals at once (under the Docker SDK's connection pool of 10 per client).
REMOVE_AT_ONCE = 6
_REMOVE_SLOTS = threading.BoundedSemaphore(REMOVE_AT_ONCE)


def _remove_quietly(container: Any) -> None:
    """Remove (force) `container`; one already gone is no error."""
    with _REMOVE_SLOTS:
        try:
            container.remove(force=True)
        except Exception:  # noqa: BLE001 -- already gone
            pass


def make_docker_host_class() -> type:
    """The host class the docker backend hands to Mininet."""
    return DockerWorkerHost
