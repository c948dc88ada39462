"""The worker containers' side of Docker: the image, the labels and mounts every container carries,
the SDK client, and finding or removing a run's containers.

Both the docker backend (`orchestrator.runtime.backends`) and the container host class
(`orchestrator.runtime.docker_host`) use these; neither imports the other for them. The Docker SDK
is imported only inside the functions (only the docker backend needs it).
"""

from __future__ import annotations

import os
import time
from typing import Any

from orchestrator.errors import ConfigError

DEFAULT_IMAGE = os.environ.get("NETAI_WORKER_IMAGE", "netai-worker:latest")
RUN_LABEL = "org.netai.run"
SITE_LABEL = "org.netai.site"
#: Where the per-run log directory is mounted inside worker containers.
CONTAINER_LOG_DIR = "/netai/run"
#: Where the site servers' control socket directory is mounted inside worker containers.
CONTAINER_CTL_DIR = "/netai/ctl"


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


def shared_client() -> Any:
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


def wait_running(container: Any, timeout_s: float) -> int:
    """The pid of `container`'s first process once it runs (polled up to `timeout_s`)."""
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
