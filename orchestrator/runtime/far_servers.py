"""Site servers of compute sites placed on other machines (cluster mode, the process backend).

A compute site on a far server (docs/cluster.md, "What runs where") gets its site server there,
in its Mininet host's network namespace, like the process backend's here:

- **The process.** ``host.popen`` of the far host (`orchestrator.emulation.cluster_nodes`: over
  SSH with a terminal, ``mnexec -a`` into the host's namespace, the run's mark): the venv that
  ``netai cluster prepare`` installed runs ``workers.site_server``. When the local ssh ends, the
  far process gets the hangup and ends too.
- **Its files.** Its log root is ``~/.netai/runs/<run id>/workers`` there (the same layout as
  here), its control socket in ``~/.netai/runs/<run id>/ctl`` (mode 700). `inside` maps this
  machine's paths onto those; `ensure_dir` makes a task's directory there before a role starts.
- **The control channel.** An OpenSSH Unix-socket forward (``ssh -N -L local.sock:far.sock``, its
  own connection, the server's key and host key): the manager connects to the local socket, in this
  run's control directory (owner only, as every server's), and nothing listens on any network
  address. It is made once the far server's socket exists (`FarHandle.poll`).
- **Events and clocks.** The roles write their events there; the manager brings them back over the
  control channel with their times mapped onto this machine's clock (`orchestrator.runtime.far_clock`).
- **At the end** (`close`), each server's run folder comes back whole, as written there (the events
  on that machine's own clock), into ``far/<server>/`` under the log root here (`far_folder`), and is then
  removed there: the run leaves nothing on the machine (a machine lost mid-run keeps it, for
  ``netai clean`` there once it is back: `orchestrator.emulation.cleanup.far_run_folders`). Only
  regular files and folders under the run folder are taken from the archive (`unpack_tree`).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any

from orchestrator.emulation.cleanup import FAR_RUNS
from orchestrator.emulation.cluster import (
    SSH_CONNECT_TIMEOUT_S,
    ClusterServer,
    end_process,
    own_connection_argv,
    ssh_argv,
    ssh_run,
    ssh_target,
)
from orchestrator.emulation.cluster_deploy import remote_paths
from orchestrator.errors import ConfigError

#: How often a starting far server's socket is looked for (one SSH command each time).
SOCKET_POLL_S = 0.5
#: The most a far run folder brought back at the end may hold (its events and logs), bytes.
MAX_FETCH_BYTES = 512 * 1024 * 1024

LOG = logging.getLogger("netai.compute")


class FarHandle:
    """A far site server: its local ssh (the process) and, once its socket exists, the forward."""

    def __init__(self, popen: subprocess.Popen[bytes], forward_argv: list[str], far_sock: str,
                 server: ClusterServer, ssh_dir: Path) -> None:
        self.popen, self.forward_argv, self.far_sock = popen, forward_argv, far_sock
        self.server, self.ssh_dir = server, ssh_dir
        self.forward: subprocess.Popen[bytes] | None = None
        self._looked = 0.0

    def poll(self) -> int | None:
        status = self.popen.poll()
        if status is not None or self.forward is not None:
            return status
        if time.monotonic() - self._looked >= SOCKET_POLL_S:
            self._looked = time.monotonic()
            if ssh_run(self.server, self.ssh_dir, ["test", "-S", self.far_sock], timeout=10).returncode == 0:
                self.forward = subprocess.Popen(self.forward_argv, stdin=subprocess.DEVNULL,
                                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                                start_new_session=True)
        return None

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()

    def stop(self) -> None:
        for proc in (self.forward, self.popen):
            if proc is not None:
                end_process(proc)


class FarBackend:
    """The site servers of `hosts` (site -> its far Mininet host), each on `servers[site]` (module
    docstring). `log_root` and `ctl_dir` are this machine's, shared with the backend of the sites here."""

    name = "process"

    def __init__(self, hosts: Mapping[str, Any], servers: Mapping[str, ClusterServer], *, log_root: Path,
                 ctl_dir: Path, run_id: str, lost: Callable[[], Collection[str]] = frozenset) -> None:
        self._hosts, self.servers = dict(hosts), dict(servers)
        self.lost = lost  # the names of the servers lost so far (their run folders stay there)
        self.log_root, self.ctl_dir, self.run_id = log_root, ctl_dir, run_id
        self.ssh_dir = Path(tempfile.mkdtemp(prefix="netai-ssh-"))
        self._bases: dict[str, dict[str, str]] = {}

    @property
    def far_sites(self) -> set[str]:
        return set(self.servers)

    def address(self, site: str) -> str:
        return str(self._hosts[site].IP())

    def host_id(self, site: str) -> str:
        return str(self._hosts[site].name)

    def _base(self, site: str) -> dict[str, str]:
        """The deployed project's paths and this run's folders on `site`'s server (made once)."""
        server = self.servers[site]
        if server.name not in self._bases:
            res = ssh_run(server, self.ssh_dir, ["printenv", "HOME"])
            if res.returncode != 0:
                raise ConfigError(f"cluster server {server.name}: no SSH session: {res.why}")
            home = res.stdout.strip().rstrip("/") or "/root"
            paths = remote_paths(home)
            run = f"{home}/{FAR_RUNS}/{self.run_id}"
            paths |= {"run": run, "log": f"{run}/workers", "ctl": f"{run}/ctl"}
            for argv in (["install", "-d", "-m", "700", paths["ctl"]],
                         ["install", "-d", f"{paths['log']}/servers", f"{paths['log']}/tasks"]):
                res = ssh_run(server, self.ssh_dir, argv)
                if res.returncode != 0:
                    raise ConfigError(f"cluster server {server.name}: {' '.join(argv[:3])}: {res.why}")
            self._bases[server.name] = paths
        return self._bases[server.name]

    def inside(self, path: Path, site: str | None = None) -> str:
        if site is None:
            raise ConfigError("a far site server's paths depend on its site")
        base, real = self._base(site), path.resolve()
        for here, there in ((self.log_root.resolve(), base["log"]), (self.ctl_dir.resolve(), base["ctl"])):
            if real.is_relative_to(here):
                rel = real.relative_to(here)
                return there if str(rel) == "." else f"{there}/{rel}"
        raise ConfigError(f"{path} is not under the site servers' log root or control directory")

    def ensure_dir(self, site: str, path: Path) -> None:
        """Make `path` (under the log root) on `site`'s server."""
        res = ssh_run(self.servers[site], self.ssh_dir, ["install", "-d", self.inside(path, site)])
        if res.returncode != 0:
            raise ConfigError(f"cluster server {self.servers[site].name}: cannot make {path.name}: {res.why}")

    def launch_server(self, site: str, argv: list[str], *, out_name: str) -> FarHandle:
        server, base = self.servers[site], self._base(site)
        hid = self.host_id(site)
        local_sock, far_sock = self.ctl_dir / f"{hid}.sock", f"{base['ctl']}/{hid}.sock"
        out_dir = self.log_root / "servers"
        out_dir.mkdir(parents=True, exist_ok=True)
        env = {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        with open(out_dir / out_name, "ab") as out:
            popen = self._hosts[site].popen([base["python"], "-m", "workers.site_server", *argv], stdout=out,
                                            stderr=subprocess.STDOUT, cwd=base["src"], env=env)
        fwd = [*own_connection_argv(server, self.ssh_dir), "-N", "-o", "ExitOnForwardFailure=yes",
               "-o", "StreamLocalBindUnlink=yes", "-L", f"{local_sock}:{far_sock}", ssh_target(server)]
        return FarHandle(popen, fwd, far_sock, server, self.ssh_dir)

    def close(self) -> None:
        """Bring each server's run folder back and remove it there (see the module docstring), then
        end this backend's multiplexed SSH connections and remove their directory."""
        lost = set(self.lost())
        for server in {s.name: s for s in self.servers.values()}.values():
            run = self._bases.get(server.name, {}).get("run")
            if run is not None and server.name in lost:
                LOG.warning("cluster server %s was lost: its run folder %s stays there (netai cluster clean, once "
                            "it is back)", server.name, run)
            elif run is not None:
                self._collect(server, run)
            with contextlib.suppress(OSError, subprocess.SubprocessError):  # no master, or it is gone
                subprocess.run([*ssh_argv(server, self.ssh_dir), "-O", "exit", ssh_target(server)],
                               capture_output=True, timeout=5, check=False)
        shutil.rmtree(self.ssh_dir, ignore_errors=True)

    def _collect(self, server: ClusterServer, run: str) -> None:
        """`run`'s folder on `server` into ``far/<server>`` here, then removed there (best effort:
        a lost machine's stays, for `netai cluster clean`)."""
        res = ssh_run(server, self.ssh_dir, ["tar", "-C", run, "-cf", "-", "."])
        if res.returncode != 0:
            LOG.warning("cluster server %s: its run folder %s is left there (%s)", server.name, run, res.why)
            return
        try:
            unpack_tree(res.raw, self.log_root / "far" / far_folder(server))
        except (ValueError, tarfile.TarError) as e:
            LOG.warning("cluster server %s: its run folder was not brought back (%s); it is left there",
                        server.name, e)
            return
        gone = ssh_run(server, self.ssh_dir, ["rm", "-rf", "--", run], timeout=SSH_CONNECT_TIMEOUT_S)
        if gone.returncode != 0:
            LOG.warning("cluster server %s: could not remove %s: %s", server.name, run, gone.why)


def far_folder(server: ClusterServer) -> str:
    """The folder name, under the log root's ``far/``, of `server`'s run folder brought back."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", server.name)


def unpack_tree(archive: bytes, dest: Path) -> list[Path]:
    """Unpack a tar `archive` of one folder into `dest`, validated member by member: only regular
    files and folders, on relative paths that stay inside `dest`, at most `MAX_FETCH_BYTES` in all
    (`ValueError` otherwise, before anything is written). Returns the files written."""
    if len(archive) > MAX_FETCH_BYTES:
        raise ValueError(f"the archive is {len(archive)} bytes, more than {MAX_FETCH_BYTES}")
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:") as tar:
        members = tar.getmembers()
        for m in members:
            parts = Path(m.name).parts
            if m.name.startswith("/") or ".." in parts or not (m.isfile() or m.isdir()):
                raise ValueError(f"refused archive member {m.name!r} (type {m.type!r})")
        written = []
        for m in members:
            target = dest.joinpath(*[p for p in Path(m.name).parts if p != "."])
            if m.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(m)
            assert src is not None  # a regular file
            target.write_bytes(src.read())
            written.append(target)
    return written


class SplitBackend:
    """The process backend for the sites here and `FarBackend` for those on other machines, as one
    backend of the computing manager (each call goes to the site's own)."""

    name = "process"

    def __init__(self, here: Any, far: FarBackend) -> None:
        self.here, self.far = here, far
        self.log_root, self.ctl_dir = here.log_root, here.ctl_dir
        self.far_sites = far.far_sites

    def _of(self, site: str | None) -> Any:
        return self.far if site in self.far_sites else self.here

    def address(self, site: str) -> str:
        return str(self._of(site).address(site))

    def host_id(self, site: str) -> str:
        return str(self._of(site).host_id(site))

    def inside(self, path: Path, site: str | None = None) -> str:
        return str(self._of(site).inside(path, site))

    def ensure_dir(self, site: str, path: Path) -> None:
        if site in self.far_sites:
            self.far.ensure_dir(site, path)

    def launch_server(self, site: str, argv: list[str], *, out_name: str) -> Any:
        return self._of(site).launch_server(site, argv, out_name=out_name)

    def close(self) -> None:
        try:
            self.here.close()  # the local sites' fork server
        finally:
            self.far.close()
