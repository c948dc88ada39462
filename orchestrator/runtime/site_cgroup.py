"""The site containers' CPU weight: each container weighs on the host's CPU like one process per core.

Docker puts every container in a cgroup below one parent (cgroupfs driver: ``/docker``). The kernel
shares CPU between the parent's siblings first: the root cgroup's own tasks (the background
generators, the orchestrator, the controller, Mininet's shells) each weigh 1024, and ``/docker`` as a
whole also weighs 1024, however many site containers it holds. So in a round where every local trains
at once, 8-14 containers shared the CPU of one process against the root's busy ones, and trainings
ran past their modelled time on a host that was mostly idle (small.yaml at K = 8 on 2 cores: 21 and 43
of 96 node-rounds overran; with ``/docker`` weighing 16 processes, 8 and 14, docs/fidelity.md).

The docker backend's containers therefore go into a cgroup of the project's (`GROUP`, beside
``/docker``), whose weight is the sum of its sites' CPU limits in processes (`group_shares`): a site
of one core weighs what its site server would weigh as a process of the process backend. Only the
local daemon's cgroupfs driver is handled (v1 ``cpu.shares``, v2 ``cpu.weight``); elsewhere (the
systemd driver, a daemon on another machine) the containers stay where the daemon puts them, and the
run's environment says which (`SiteGroup.describe`).
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The project's cgroup for site containers, below the root of each hierarchy.
GROUP = "netai-sites"
CGROUP_ROOT = Path("/sys/fs/cgroup")
#: cgroup v1's weight of one nice-0 process (``cpu.shares``), and v2's (``cpu.weight``) with its bounds.
V1_SHARES = 1024
V2_WEIGHT = 100
V2_WEIGHT_MAX = 10_000
V1_SHARES_MAX = 262_144


def group_shares(cpus: float, version: int) -> int:
    """The weight of a group whose containers' CPU limits sum to `cpus` (at least one process)."""
    procs = max(1.0, cpus)
    if version == 1:
        return min(V1_SHARES_MAX, math.ceil(V1_SHARES * procs))
    return min(V2_WEIGHT_MAX, math.ceil(V2_WEIGHT * procs))


@dataclass
class SiteGroup:
    """The group of one Docker daemon's site containers (`for_daemon`); ``parent`` None: not used."""

    version: int
    parent: str | None
    why_not: str = ""
    root: Path = CGROUP_ROOT
    cpus: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _cpu_dir(self) -> Path:
        return self.root / "cpu" / GROUP if self.version == 1 else self.root / GROUP

    def join(self, cpus: float | None) -> str | None:
        """Count a container of `cpus` cores (None: one) into the group's weight, creating the group
        the first time; the ``cgroup_parent`` to start it with (None: the daemon's default)."""
        if self.parent is None:
            return None
        with self._lock:
            self.cpus += cpus or 1.0
            d = self._cpu_dir()
            try:
                d.mkdir(exist_ok=True)
                if self.version == 2:  # the group's children need the controllers enabled in it
                    (d / "cgroup.subtree_control").write_text("+cpu +memory +pids")
                name = "cpu.shares" if self.version == 1 else "cpu.weight"
                (d / name).write_text(str(group_shares(self.cpus, self.version)))
            except OSError as e:
                self.parent, self.why_not = None, f"the cgroup {d} could not be set: {e.strerror or e}"
                return None
        return self.parent

    def describe(self) -> str:
        """One line for the run's environment: where the containers' CPU weight came from."""
        if self.parent is None:
            return f"the daemon's default ({self.why_not})"
        unit = "cpu.shares" if self.version == 1 else "cpu.weight"
        return f"cgroup {self.parent} (v{self.version}), {unit} {group_shares(self.cpus, self.version)} for {self.cpus:g} cores"

    def remove(self) -> None:
        """Remove the group's directories once its containers are gone (one still busy stays)."""
        if self.parent is None:
            return
        dirs = [p / GROUP for p in self.root.iterdir()] if self.version == 1 else [self._cpu_dir()]
        for d in dirs:
            try:
                d.rmdir()
            except OSError:
                pass  # not there, or a container's cgroup still in it
        self.cpus = 0.0


def for_daemon(client: Any, *, local: bool, root: Path = CGROUP_ROOT) -> SiteGroup:
    """The site group for containers made through `client` (`local`: the daemon on this machine)."""
    try:
        info = client.info()
    except Exception as e:  # noqa: BLE001 -- the daemon's own error; the containers fail later anyway
        return SiteGroup(version=0, parent=None, why_not=f"the daemon's info could not be read: {e}")
    version = int(str(info.get("CgroupVersion", "1")) or 1)
    driver = str(info.get("CgroupDriver", ""))
    if not local:
        return SiteGroup(version=version, parent=None, why_not="a daemon on another machine")
    if driver != "cgroupfs":
        return SiteGroup(version=version, parent=None, why_not=f"the {driver or 'unknown'} cgroup driver")
    cpu_dir = root / "cpu" if version == 1 else root
    if not cpu_dir.is_dir():
        return SiteGroup(version=version, parent=None, why_not=f"no cgroup hierarchy at {cpu_dir}")
    return SiteGroup(version=version, parent=f"/{GROUP}", root=root)
