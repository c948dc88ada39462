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
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.emulation.cluster import ClusterServer, end_process, ssh_argv, ssh_run, ssh_target
from orchestrator.emulation.cluster_deploy import remote_paths
from orchestrator.errors import ConfigError

#: How often a starting far server's socket is looked for (one SSH command each time).
SOCKET_POLL_S = 0.5


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
                 ctl_dir: Path, run_id: str) -> None:
        self._hosts, self.servers = dict(hosts), dict(servers)
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
            run = f"{home}/.netai/runs/{self.run_id}"
            paths |= {"log": f"{run}/workers", "ctl": f"{run}/ctl"}
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
        fwd = [a if a != "ControlMaster=auto" else "ControlMaster=no" for a in ssh_argv(server, self.ssh_dir)]
        fwd = [a if not a.startswith("ControlPath=") else "ControlPath=none" for a in fwd]
        fwd += ["-N", "-o", "ExitOnForwardFailure=yes", "-o", "StreamLocalBindUnlink=yes",
                "-L", f"{local_sock}:{far_sock}", ssh_target(server)]
        return FarHandle(popen, fwd, far_sock, server, self.ssh_dir)

    def close(self) -> None:
        """End this backend's multiplexed SSH connections and remove their directory."""
        for server in {s.name: s for s in self.servers.values()}.values():
            with contextlib.suppress(OSError, subprocess.SubprocessError):  # no master, or it is gone
                subprocess.run([*ssh_argv(server, self.ssh_dir), "-O", "exit", ssh_target(server)],
                               capture_output=True, timeout=5, check=False)
        shutil.rmtree(self.ssh_dir, ignore_errors=True)


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
