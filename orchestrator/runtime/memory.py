"""A site's memory as a resource (issue 48): what a task's roles need at a site, whether the site has it,
and what a site server killed for memory says.

Need (`site_need_bytes`): a site server is one process (`workers.site_server`) whose roles are threads,
so a site needs the server's own memory once (`SERVER_BASE_BYTES`: torch and the project imported,
measured 222 MB resident here, 146 MB of it anonymous) and, per role it hosts, a number of copies of the
model's weights:

- a local (`LOCAL_COPIES`): the global model it receives, its weights, their gradients, the momentum
  buffers of its optimizer (`workers.sgd`), and the update it sends;
- G (`GLOBAL_COPIES`): the global model, the aggregate it sums the updates into, the update being
  received and the copy being sent;
- a relay (`RELAY_COPIES`): the aggregate of its subtree's updates and one update being received (relays
  stream the broadcast chunk by chunk: no copy per child).

The copies are the design's, not measured; a real run records every site server's peak (`peak_rss`,
the servers' status replies) against the model's size, which is what would calibrate them.

A server killed for memory: a site's server exits with status 137 (SIGKILL) when its container's memory
cgroup runs out and the kernel's OOM killer picks it. `cgroup_memory` reads the cgroup's limit, peak and
OOM kills (v2 ``memory.max``/``memory.peak``/``memory.events``, or v1 ``memory.limit_in_bytes``/
``memory.max_usage_in_bytes``/``memory.oom_control``); `lost_reason` turns them into the one line the
task's failure gives.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

#: A site server's own memory before any role (resident set with torch and the project imported).
SERVER_BASE_BYTES = 230 * 2**20
#: Copies of the model's weights per role (see the module docstring).
LOCAL_COPIES = 5
GLOBAL_COPIES = 4
RELAY_COPIES = 2
#: The exit status of a process killed by SIGKILL, as a shell or Docker reports it (128 + 9).
KILLED = 137
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CgroupMemory:
    """A memory cgroup's figures (None: not known)."""

    limit_bytes: int | None
    peak_bytes: int | None
    oom_kills: int


def site_need_bytes(roles: Iterable[str], model_bytes: int) -> int:
    """The memory a site needs for its server and `roles` (``global``, ``local``, ``relay``) of a task
    whose model has `model_bytes` of weights."""
    copies = {"global": GLOBAL_COPIES, "local": LOCAL_COPIES, "relay": RELAY_COPIES}
    return SERVER_BASE_BYTES + sum(copies[r] for r in roles) * int(model_bytes)


def roles_by_site(global_site: str, local_sites: Iterable[str], overlay_nodes: Iterable[str]) -> dict[str, list[str]]:
    """Each site of a schedule and the roles it hosts (a site may be G and a local, or a relay only)."""
    roles: dict[str, list[str]] = {global_site: ["global"]}
    for site in local_sites:
        roles.setdefault(site, []).append("local")
    for site in overlay_nodes:
        roles.setdefault(site, ["relay"])
    return roles


def refusal(memory_mb: Mapping[str, int], roles: Mapping[str, list[str]], model_bytes: int) -> str | None:
    """Why a task cannot be placed for memory: the first site (in name order) whose need exceeds its
    `memory_mb`, as one line; None when every site has room."""
    for site in sorted(roles):
        need = site_need_bytes(roles[site], model_bytes)
        have = memory_mb.get(site)
        if have is not None and need > have * 2**20:
            what = " and ".join(sorted(set(roles[site])))
            return (f"site {site} has {have} MB of memory; its server and {what} role(s) need about "
                    f"{need / 2**20:.0f} MB for a model of {model_bytes / 2**20:.1f} MB")
    return None


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
