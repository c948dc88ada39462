"""`TaskPaths`: what the controller installs for one task, as pure data (its own input type).

The controller knows nothing of schedulers or trees. A task reaches it as a list of directed
*paths*: TCP segments from one site's host to another's, to one TCP port, along a list of sites
(one switch per site); the ACKs follow the reverse path. Every entry of the task carries its
cookie (the task id), so statistics and deletion select a task by cookie. A path may carry a
reserved rate (`reserved_mbps`, in the emulation's Mbit/s, as shaped on the links); the
controller enforces it on every link the path crosses (`controller.shaping`).

The orchestrator builds a `TaskPaths` from a scheduler's decision (see docs/architecture.md);
this module imports nothing from the orchestrator or the workers.

JSON form (`to_dict`, the body of ``PUT /tasks/{id}``)::

    {"task_id", "label", "paths": [{"src", "dst", "sites": [...], "tcp_dst", "reserved_mbps", "kind"}]}
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: The keys of the JSON form; anything else is rejected.
_TASK_KEYS = frozenset({"task_id", "label", "paths"})
_PATH_KEYS = frozenset({"src", "dst", "sites", "tcp_dst", "reserved_mbps", "kind"})


@dataclass(frozen=True, kw_only=True)
class PathSpec:
    """One directed path of a task: segments ``src -> dst`` to `tcp_dst`, along `sites`.

    `kind` is a free label kept for the API (e.g. ``broadcast`` or ``upload``).
    """

    src: str
    dst: str
    sites: tuple[str, ...]
    tcp_dst: int
    reserved_mbps: float = 0.0
    kind: str = ""

    def links(self) -> list[tuple[str, str]]:
        """The directed site-to-site links the path crosses, in order."""
        return list(zip(self.sites, self.sites[1:], strict=False))

    def to_dict(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "sites": list(self.sites),
            "tcp_dst": self.tcp_dst,
            "reserved_mbps": self.reserved_mbps,
            "kind": self.kind,
        }

    @classmethod
    def from_dict(cls, d: Any) -> PathSpec:
        if not isinstance(d, Mapping):
            raise ValueError(f"a path must be an object, got {type(d).__name__}")
        unknown = set(d) - _PATH_KEYS
        if unknown:
            raise ValueError(f"unknown path keys {sorted(unknown)} (allowed: {sorted(_PATH_KEYS)})")
        sites = d.get("sites")
        if not isinstance(sites, list) or len(sites) < 2 or not all(isinstance(s, str) and s for s in sites):
            raise ValueError(f"a path's sites must be a list of at least two site names, got {sites!r}")
        src, dst = d.get("src"), d.get("dst")
        if src != sites[0] or dst != sites[-1]:
            raise ValueError(f"path {sites} must run from src {src!r} to dst {dst!r}")
        port = d.get("tcp_dst")
        if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
            raise ValueError(f"tcp_dst must be a TCP port, got {port!r}")
        rate = d.get("reserved_mbps", 0.0)
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not rate >= 0 or rate == float("inf"):
            raise ValueError(f"reserved_mbps must be a finite number >= 0, got {rate!r}")
        kind = d.get("kind", "")
        if not isinstance(kind, str):
            raise ValueError(f"kind must be a string, got {kind!r}")
        return cls(src=src, dst=dst, sites=tuple(sites), tcp_dst=port, reserved_mbps=float(rate), kind=kind)


@dataclass(frozen=True, kw_only=True)
class TaskPaths:
    """Everything the controller installs for one task (see the module docstring)."""

    task_id: int
    paths: tuple[PathSpec, ...]
    label: str = ""

    @property
    def cookie(self) -> int:
        return self.task_id

    @property
    def sites(self) -> list[str]:
        """The sites whose hosts send or receive the task's segments, in first-seen order."""
        out: dict[str, None] = {}
        for p in self.paths:
            out[p.src] = None
            out[p.dst] = None
        return list(out)

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "label": self.label, "paths": [p.to_dict() for p in self.paths]}

    @classmethod
    def from_dict(cls, d: Any) -> TaskPaths:
        """Parse the JSON form. Raises ValueError naming the first problem."""
        if not isinstance(d, Mapping):
            raise ValueError("expected a task-paths JSON object")
        unknown = set(d) - _TASK_KEYS
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)} (allowed: {sorted(_TASK_KEYS)})")
        task_id = d.get("task_id")
        # Cookies at and above 2**63 are the controller's own (background, table-miss is 0).
        if isinstance(task_id, bool) or not isinstance(task_id, int) or not 0 < task_id < 1 << 63:
            raise ValueError(f"task_id must be a positive integer below 2**63, got {task_id!r}")
        raw = d.get("paths")
        if not isinstance(raw, list) or not raw:
            raise ValueError("paths must be a non-empty list")
        label = d.get("label", "")
        if not isinstance(label, str):
            raise ValueError(f"label must be a string, got {label!r}")
        return cls(task_id=task_id, paths=tuple(PathSpec.from_dict(p) for p in raw), label=label)
