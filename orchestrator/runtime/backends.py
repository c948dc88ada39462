"""Compute backends: where and how a task's agents run.

- ``loopback``: plain processes on this machine, each bound to its own 127.0.0.x address; no
  Mininet, no root. For quick checks and unit-level end-to-end tests.
- ``process``: the agent from the project's venv in a Mininet host's network namespace
  (``host.popen``), bound to the host's emulated IP.
- ``docker``: the agent in a container that *is* the Mininet host: `DockerWorkerHost` starts a
  container with ``--network none`` and the site's CPU and memory limits, then runs the node's
  shell with ``mnexec -a <container pid>`` (cwd ``/``), so Mininet wires and configures its
  interfaces like any host's (the way Containernet does it). The agent runs by ``docker exec``,
  inside the container's cgroups, so the limits apply to it.

`pick_backend("auto")` is ``docker`` when a Docker daemon answers and the worker image exists,
else ``process``. Every container this module starts carries the label ``org.netai.run`` so a
crashed run's leftovers can be found and removed (`remove_containers`).

What this module must not do: start anything listening on a wildcard address, or leave a
container or process behind on any exit path (callers use the backends as context managers or
call `stop` in a ``finally``).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from orchestrator.errors import ConfigError
from workers.config import AgentConfig

DEFAULT_IMAGE = os.environ.get("NETAI_WORKER_IMAGE", "netai-worker:latest")
RUN_LABEL = "org.netai.run"
SITE_LABEL = "org.netai.site"
#: Where the per-run log directory is mounted inside worker containers.
CONTAINER_LOG_DIR = "/netai/run"
BACKENDS = ("loopback", "process", "docker")


def _write_config(log_dir: Path, config: AgentConfig) -> Path:
    import json

    path = log_dir / f"{config.site}.config.json"
    path.write_text(json.dumps(config.to_dict(), indent=1), encoding="utf-8")
    return path


class ProcessHandle:
    """An agent running as a local `subprocess.Popen` (loopback, or in a Mininet host)."""

    def __init__(self, site: str, popen: subprocess.Popen[bytes]) -> None:
        self.site = site
        self.popen = popen

    def poll(self) -> int | None:
        return self.popen.poll()

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=5)


class _AgentProcesses:
    """What the loopback and process backends share: an agent is a process of the project's venv,
    logging to the task's directory (hosts share the file system). Subclasses say where it runs."""

    _python: str

    def _popen(self, site: str, cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        raise NotImplementedError

    def task_log_dir(self, wanted: Path) -> Path:
        """The directory a task's agents log to (created)."""
        wanted.mkdir(parents=True, exist_ok=True)
        return wanted

    def after_task(self, log_dir: Path) -> None:
        """Nothing to release: `run_task` stopped the processes."""

    def start(self, site: str, config: AgentConfig, *, log_dir: Path) -> ProcessHandle:
        cfg = _with_events(config, log_dir)
        path = _write_config(log_dir, cfg)
        out = open(log_dir / f"{site}.out.txt", "wb")
        try:
            popen = self._popen(
                site,
                [self._python, "-m", "workers.agent", "--config", str(path)],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(Path(__file__).resolve().parent.parent),
                env=_agent_env(),
            )
        finally:
            out.close()
        return ProcessHandle(site, popen)


class LoopbackBackend(_AgentProcesses):
    """Agents as local processes on 127.0.0.x addresses (no Mininet, no root).

    Parameters
    ----------
    sites
        The overlay nodes, in a fixed order: site i gets 127.0.0.(first_octet + i).
    """

    name = "loopback"

    def __init__(self, sites: Iterable[str], *, first_octet: int = 2, python: str = sys.executable) -> None:
        sites = list(sites)
        if first_octet + len(sites) > 254:
            raise ConfigError(f"{len(sites)} sites do not fit in 127.0.0.{first_octet}-254")
        self._addr = {s: f"127.0.0.{first_octet + i}" for i, s in enumerate(sites)}
        self._python = python

    def address(self, site: str) -> str:
        return self._addr[site]

    def _popen(self, site: str, cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        return subprocess.Popen(cmd, **kw)


def _with_events(config: AgentConfig, log_dir: Path) -> AgentConfig:
    from dataclasses import replace

    return replace(config, events_path=str(log_dir / f"{config.site}.events.jsonl"))


def _agent_env() -> dict[str, str]:
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ProcessBackend(_AgentProcesses):
    """Agents in Mininet hosts' namespaces, from the project's venv.

    Parameters
    ----------
    hosts
        Site -> Mininet host object (``net.get(plan.host(site).name)``).
    """

    name = "process"

    def __init__(self, hosts: Mapping[str, Any], *, python: str = sys.executable) -> None:
        self._hosts = dict(hosts)
        self._python = python

    def address(self, site: str) -> str:
        try:
            return str(self._hosts[site].IP())
        except KeyError as e:
            raise ConfigError(f"site {site!r} has no emulated host") from e

    def _popen(self, site: str, cmd: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        popen: subprocess.Popen[bytes] = self._hosts[site].popen(cmd, **kw)
        return popen


# -- Docker ------------------------------------------------------------------------------------------
def docker_client() -> Any:
    """A Docker SDK client for the local daemon (unix socket), or raise ConfigError."""
    try:
        import docker
    except ImportError as e:
        raise ConfigError("the docker backend needs the Docker SDK (pip install 'docker>=7.1')") from e
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except Exception as e:
        raise ConfigError(f"no Docker daemon answers: {e}") from e
    return client


_CLIENT: Any = None


def _shared_client() -> Any:
    """One Docker client for all worker hosts of this process."""
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = docker_client()
    return _CLIENT


def image_exists(client: Any, image: str = DEFAULT_IMAGE) -> bool:
    import docker.errors

    try:
        client.images.get(image)
    except docker.errors.ImageNotFound:
        return False
    return True


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


def ensure_worker_image(*, quiet: bool = False) -> None:
    """Rebuild the worker image if its recorded source hash differs from this checkout's
    (``scripts/build_worker_image.sh --if-stale``: about a second when nothing changed, seconds
    when only the project's code did). Without the script (an installed package) nothing happens.

    Raises
    ------
    ConfigError
        If the build fails (its last output lines are in the message).
    """
    script = Path(__file__).resolve().parent.parent / "scripts" / "build_worker_image.sh"
    if not script.exists():
        return
    res = subprocess.run(["bash", str(script), "--if-stale"], capture_output=True, text=True)
    if not quiet and "up to date" not in res.stdout:
        for line in res.stdout.splitlines():
            print(line, file=sys.stderr)
    if res.returncode != 0:
        tail = " | ".join((res.stderr or res.stdout).strip().splitlines()[-3:])
        raise ConfigError(f"building the worker image failed: {tail}")


def remove_containers(client: Any, *, run_id: str | None = None) -> int:
    """Remove (force) the worker containers of one run, or of every run when `run_id` is None."""
    label = RUN_LABEL if run_id is None else f"{RUN_LABEL}={run_id}"
    n = 0
    for c in client.containers.list(all=True, filters={"label": label}):
        try:
            c.remove(force=True)
            n += 1
        except Exception:  # noqa: BLE001 -- already gone: nothing left to remove
            pass
    return n


def _wait_running(container: Any, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        container.reload()
        state = container.attrs.get("State", {})
        if state.get("Running") and state.get("Pid"):
            return int(state["Pid"])
        if state.get("Status") in ("exited", "dead"):
            raise RuntimeError(f"container {container.name} exited at start: {state}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"container {container.name} not running after {timeout_s:.0f} s: {state}")
        time.sleep(0.05)  # poll interval, bounded by the deadline


class ExecHandle:
    """An agent started by ``docker exec`` in a worker container."""

    def __init__(self, site: str, host: Any, exec_id: str) -> None:
        self.site = site
        self.host = host
        self.exec_id = exec_id

    def poll(self) -> int | None:
        info = self.host.dclient.api.exec_inspect(self.exec_id)
        if info.get("Running"):
            return None
        code = info.get("ExitCode")
        return None if code is None else int(code)

    def stop(self) -> None:
        if self.poll() is None:
            pid = self.host.dclient.api.exec_inspect(self.exec_id).get("Pid")
            if pid:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass


class DockerBackend:
    """Agents in the worker containers that are the Mininet hosts (`DockerWorkerHost`).

    Parameters
    ----------
    hosts
        Site -> `DockerWorkerHost`; all mount the same host directory `log_root` at
        `CONTAINER_LOG_DIR` (see `emulation_options`).
    """

    name = "docker"

    def __init__(self, hosts: Mapping[str, Any], *, log_root: Path) -> None:
        self._hosts = dict(hosts)
        self.log_root = log_root.resolve()
        #: Every agent started, for inspection (which container ran it) and cleanup.
        self.started: list[ExecHandle] = []

    def address(self, site: str) -> str:
        try:
            return str(self._hosts[site].IP())
        except KeyError as e:
            raise ConfigError(f"site {site!r} has no emulated host") from e

    def container(self, site: str) -> Any:
        """The Docker SDK container object of a site's host."""
        return self._hosts[site].container

    def task_log_dir(self, wanted: Path) -> Path:
        """A directory under the containers' mount for one task; `wanted` becomes a link to it."""
        real = self.log_root / wanted.name
        real.mkdir(parents=True, exist_ok=True)
        if wanted.resolve() != real:
            wanted.parent.mkdir(parents=True, exist_ok=True)
            if not wanted.exists() and not wanted.is_symlink():
                wanted.symlink_to(real, target_is_directory=True)
        return wanted

    def _in_container(self, path: Path) -> str:
        real = path.resolve()
        try:
            rel = real.relative_to(self.log_root)
        except ValueError as e:
            raise ConfigError(f"{path} is not under the containers' log mount {self.log_root}") from e
        return f"{CONTAINER_LOG_DIR}/{rel}".rstrip("/.") if str(rel) != "." else CONTAINER_LOG_DIR

    def start(self, site: str, config: AgentConfig, *, log_dir: Path) -> ExecHandle:
        from dataclasses import replace

        host = self._hosts[site]
        inside = self._in_container(log_dir)
        cfg = replace(config, events_path=f"{inside}/{site}.events.jsonl")
        _write_config(log_dir, cfg)
        exec_id = host.exec_agent(f"{inside}/{site}.config.json", f"{inside}/{site}.out.txt")
        handle = ExecHandle(site, host, exec_id)
        self.started.append(handle)
        return handle

    def after_task(self, log_dir: Path) -> None:
        """Kill any agent of the task still running (they normally have exited)."""
        for h in self.started:
            h.stop()
        self.started.clear()


# -- wiring into the emulation -------------------------------------------------------------------------
def emulation_options(kind: str, *, log_dir: Path, image: str = DEFAULT_IMAGE) -> dict[str, Any]:
    """Keyword arguments for `orchestrator.emulation.network.Emulation` that host a backend's workers.

    ``docker``: every host is a `DockerWorkerHost` of `image` with its site's CPU and memory limits,
    mounting `log_dir` (created) at `CONTAINER_LOG_DIR`. ``process``: plain Mininet hosts ({}).
    """
    if kind == "process":
        return {}
    if kind != "docker":
        raise ConfigError(f"backend {kind!r} does not run in the emulation (use docker or process)")
    log_dir.mkdir(parents=True, exist_ok=True)
    root = str(log_dir.resolve())

    def params(h: Any) -> dict[str, Any]:
        return {"image": image, "cpus": float(h.cpu), "memory_mb": int(h.memory_mb), "log_dir": root}

    from orchestrator.runtime.docker_host import make_docker_host_class

    return {"host_cls": make_docker_host_class(), "host_params": params}


def open_backend(kind: str, emu: Any) -> ProcessBackend | DockerBackend:
    """The compute backend over a running emulation's hosts (one per compute site)."""
    hosts = {h.site: emu.host(h.site) for h in emu.plan.hosts}
    if kind == "process":
        return ProcessBackend(hosts)
    if kind == "docker":
        roots = {getattr(h, "log_dir", None) for h in hosts.values()}
        if len(roots) != 1 or None in roots:
            raise ConfigError("the emulation's hosts are not worker containers: build it with "
                              "emulation_options('docker', log_dir=...)")
        return DockerBackend(hosts, log_root=Path(str(roots.pop())))
    raise ConfigError(f"backend {kind!r} does not run in the emulation (use docker or process)")
