"""A site server killed for memory (issue 48): a site's server exits with status 137 (SIGKILL) when its
container's memory cgroup runs out and the kernel's OOM killer picks it. `cgroup_memory` reads the
cgroup's limit, peak and OOM kills (v2 ``memory.max``/``memory.peak``/``memory.events``, or v1
``memory.limit_in_bytes``/``memory.max_usage_in_bytes``/``memory.oom_control``); `lost_reason` turns
them into the one line the task's failure gives. What a site needs at admission:
`orchestrator.scheduling.memory`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The exit status of a process killed by SIGKILL, as a shell or Docker reports it (128 + 9).
KILLED = 137
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CgroupMemory:
    """A memory cgroup's figures (None: not known)."""

    limit_bytes: int | None
    peak_bytes: int | None
    oom_kills: int


# -- a memory cgroup ------------------------------------------------------------------------------------
def cgroup_dir(pid: int, *, proc: Path = Path("/proc"), root: Path = CGROUP_ROOT) -> Path | None:
    """The memory cgroup directory of process `pid`: v1's memory hierarchy if it has one, else v2's
    unified one; None if the process is gone."""
    try:
        lines = (proc / str(pid) / "cgroup").read_text().splitlines()
    except OSError:
        return None
    unified = None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return root / "memory" / path.lstrip("/")
        if controllers == "":
            unified = root / path.lstrip("/")
    return unified


def _int_file(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return None if text in ("", "max") else int(text)


def _key_counts(path: Path) -> dict[str, int]:
    try:
        return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines() if line.strip())}
    except (OSError, ValueError):
        return {}


def cgroup_memory(directory: Path) -> CgroupMemory:
    """The limit, peak and OOM kills of the memory cgroup in `directory` (v2 files, else v1's)."""
    if (directory / "memory.max").exists() or (directory / "memory.events").exists():
        return CgroupMemory(_int_file(directory / "memory.max"), _int_file(directory / "memory.peak"),
                            _key_counts(directory / "memory.events").get("oom_kill", 0))
    limit = _int_file(directory / "memory.limit_in_bytes")
    if limit is not None and limit >= 2**62:  # v1's "no limit"
        limit = None
    return CgroupMemory(limit, _int_file(directory / "memory.max_usage_in_bytes"),
                        _key_counts(directory / "memory.oom_control").get("oom_kill", 0))


def container_memory(container: Any) -> CgroupMemory | None:
    """A Docker container's memory cgroup, read through its init process (which outlives a site server
    killed in it); None without a container or a cgroup to read."""
    directory = container_cgroup(container)
    return None if directory is None else cgroup_memory(directory)


def container_cgroup(container: Any) -> Path | None:
    """The memory cgroup directory of a Docker container, through its init process (`cgroup_dir`);
    None without a container or once its init is gone."""
    if container is None:
        return None
    container.reload()
    return cgroup_dir(int(container.attrs["State"]["Pid"]))


def lost_reason(site: str, status: int | None, memory: CgroupMemory | None, *, limit_mb: int | None = None,
                peak_rss_bytes: int | None = None) -> str:
    """Why `site`'s server is gone, one line: killed for memory (its cgroup counted an OOM kill, with
    its limit and peak), or its exit status (137 with a note that it may have been memory)."""
    if status is None:
        return "it stopped answering"
    limit = memory.limit_bytes if memory is not None and memory.limit_bytes else \
        (limit_mb * 2**20 if limit_mb else None)
    peak = max((x for x in (memory.peak_bytes if memory else None, peak_rss_bytes) if x), default=None)
    figures = ", ".join(f for f in (f"limit {limit / 2**20:.0f} MB" if limit else "",
                                    f"peak {peak / 2**20:.0f} MB" if peak else "") if f)
    if memory is not None and memory.oom_kills > 0 and status in (KILLED, -9):
        return f"killed for memory: site {site} ran out of its memory ({figures}; the kernel's OOM killer, " \
               f"exit status {status})"
    if status in (KILLED, -9):
        return f"exited with status {status} (SIGKILL: the kernel's OOM killer or a kill; {figures or 'no memory figures'})"
    return f"exited with status {status}"
