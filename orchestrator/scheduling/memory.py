"""A site's memory at admission (issue 48): what a task's roles need at a site, and whether the site has it
(`refusal`: the lifecycle blocks such a task, `orchestrator.experiment.runs.check_memory` refuses a run
one of whose tasks cannot fit before anything starts).

A site server is one process (`workers.site_server`) whose roles are threads, so a site needs the
server's own memory once (`SERVER_BASE_BYTES`: torch and the project imported; a loopback server
holds 156 MB resident before any role, a fresh interpreter with torch 222 MB) and, per role it hosts,
a number of copies of the model's weights. Each role holds the model, the template its frames are
checked against and the model being received (three copies), and then, by role:

- a local (`LOCAL_COPIES`): its training's gradients and momentum, the update it sends, its
  children's partial sums (float64: two copies) when it relays;
- G (`GLOBAL_COPIES`): the aggregate it sums the updates into and the copy being sent;
- a relay (`RELAY_COPIES`): its children's partial sums (float64) and the chunks in flight.

The copies are measured, with a margin: `benchmarks/bench_site_memory.py` (real servers on
loopback, the large model of 40 MB, the same task eight times on the same servers, the servers'
threads sharing two malloc heaps, `workers.learning.keep_freed_memory`; 2026-11-29) gave peaks above
the server's own memory of 8.2-8.8 copies for a local and 7.0-7.4 for a relay with three children,
with no creep from task to task, and (``--children 1``) 8.5-9.2 for G with three children. These
are at loopback's speed, where the children's updates pile up in a node's queue faster than it folds
them in; with every copy paced at 200 Mbit/s (``--pace-mbps 200``) the relay with three children
peaked at 5.0-6.0 copies and with one at 3.9-4.1: the difference is the children's float64 partial
sums, not a copy per child.

Every run also records each site server's peak (its status replies, ``site_peak_rss_mb`` in its
environment) against the model's size (docs/long-runs.md).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: A site server's own memory before any role (resident set with torch and the project imported).
SERVER_BASE_BYTES = 230 * 2**20
#: A role's own memory beside its copies of the model: its buffers, threads and torch's (18-25 MB a role
#: with a 6 KB model, `benchmarks/bench_site_memory.py --hidden 16`), and what a loaded host's queues
#: hold: in CI runs of `make test` a local of a 10.7 MB model peaked 232 MB above its server's own
#: memory, and in another at 431 MB in all, 78 MB above `SERVER_BASE_BYTES` and its 12 copies (the
#: 64 MB this was then fell short); `benchmarks/bench_site_memory.py --hidden 1600 --tasks 3` gave such
#: a local 134-187 MB above a loopback server's own 156 MB (docs/long-runs.md, "A site's memory").
ROLE_BASE_BYTES = 96 * 2**20
#: Copies of the model's weights per role (see the module docstring).
LOCAL_COPIES = 12
GLOBAL_COPIES = 12
RELAY_COPIES = 12


def site_need_bytes(roles: Iterable[str], model_bytes: int) -> int:
    """The memory a site needs for its server and `roles` (``global``, ``local``, ``relay``) of a task
    whose model has `model_bytes` of weights."""
    copies = {"global": GLOBAL_COPIES, "local": LOCAL_COPIES, "relay": RELAY_COPIES}
    return SERVER_BASE_BYTES + sum(ROLE_BASE_BYTES + copies[r] * int(model_bytes) for r in roles)


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
