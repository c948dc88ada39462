"""`Schedule`: what a scheduler decides for one task, as pure data.

A schedule has two trees rooted at the global site G, given as parent maps over *overlay nodes*
(G, the local sites, and relay sites that aggregate): the broadcast tree (G -> locals) and the
upload tree (locals -> G). Every overlay edge carries one copy of the model along a physical
path of sites. Reservations are per *directed* link (a, b): links are full duplex, each
direction has its own capacity.

JSON form (`to_dict`, the `--json` output of `netai schedule` and the controller's input)::

    {"task_id", "scheduler", "blocked", "reason", "global", "locals", "demand_mbps",
     "broadcast_tree": [[parent, child], ...], "upload_tree": [[child, parent], ...],
     "paths": [{"procedure", "from", "to", "nodes", "wavelength"}, ...],
     "aggregation_sites": [...], "reservations": [{"link": [a, b], "mbps"}, ...],
     "reserved_mbps_total"}
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Procedure = Literal["broadcast", "upload"]
PROCEDURES: tuple[Procedure, Procedure] = ("broadcast", "upload")
DirectedLink = tuple[str, str]

#: TCP ports of a task: every overlay node listens on the broadcast port for GLOBAL frames and
#: on the upload port for UPDATE frames. Flow entries match them, so the broadcast and upload
#: trees of one task can take different paths between the same two hosts.
TASK_PORT_BASE = 20000
TASK_PORT_SLOTS = 10000


def task_ports(task_id: int) -> tuple[int, int]:
    """(broadcast_port, upload_port) of a task; distinct for task ids within 10000 of each other."""
    slot = task_id % TASK_PORT_SLOTS
    return TASK_PORT_BASE + 2 * slot, TASK_PORT_BASE + 2 * slot + 1


@dataclass(frozen=True)
class OverlayEdge:
    """One overlay edge: `src` sends the model to `dst` along the physical `path`."""

    procedure: Procedure
    src: str
    dst: str
    path: tuple[str, ...]
    wavelength: int | None = None

    def links(self) -> list[DirectedLink]:
        """The directed physical links the edge's traffic crosses, in order."""
        return list(zip(self.path, self.path[1:], strict=False))


@dataclass(frozen=True)
class Schedule:
    """The scheduler's decision for one task (see the module docstring)."""

    task_id: int
    scheduler: str
    global_site: str
    local_sites: tuple[str, ...]
    demand_mbps: float
    broadcast_parent: Mapping[str, str] = field(default_factory=dict)
    upload_parent: Mapping[str, str] = field(default_factory=dict)
    edges: tuple[OverlayEdge, ...] = ()
    aggregation_sites: frozenset[str] = frozenset()
    reservations: Mapping[DirectedLink, float] = field(default_factory=dict)
    blocked: bool = False
    reason: str = ""

    @classmethod
    def for_task(cls, task: Any, scheduler: str, **fields: Any) -> Schedule:
        """A schedule of `task` by `scheduler`, with the other `fields` given."""
        return cls(
            task_id=task.id,
            scheduler=scheduler,
            global_site=task.global_site,
            local_sites=tuple(task.local_sites),
            demand_mbps=task.demand_mbps,
            **fields,
        )

    @classmethod
    def blocked_for(cls, task: Any, scheduler: str, reason: str) -> Schedule:
        """A schedule that admits nothing: the task could not be placed."""
        return cls.for_task(task, scheduler, blocked=True, reason=reason)

    # -- tree queries ----------------------------------------------------------------------------
    @property
    def overlay_nodes(self) -> list[str]:
        """G, the locals, then relay sites (in first-seen order)."""
        seen = dict.fromkeys((self.global_site, *self.local_sites))
        for child, parent in (*self.broadcast_parent.items(), *self.upload_parent.items()):
            seen.setdefault(child)
            seen.setdefault(parent)
        return list(seen)

    @property
    def relay_sites(self) -> list[str]:
        """Overlay nodes that hold no model: they forward and aggregate only."""
        terminals = {self.global_site, *self.local_sites}
        return [n for n in self.overlay_nodes if n not in terminals]

    def broadcast_children(self, site: str) -> list[str]:
        return [c for c, p in self.broadcast_parent.items() if p == site]

    def upload_children(self, site: str) -> list[str]:
        return [c for c, p in self.upload_parent.items() if p == site]

    def edges_of(self, procedure: Procedure) -> list[OverlayEdge]:
        return [e for e in self.edges if e.procedure == procedure]

    def path(self, procedure: Procedure, src: str, dst: str) -> tuple[str, ...]:
        for e in self.edges:
            if e.procedure == procedure and e.src == src and e.dst == dst:
                return e.path
        raise KeyError(f"no {procedure} edge {src}->{dst} in task {self.task_id}")

    @property
    def reserved_mbps_total(self) -> float:
        return float(sum(self.reservations.values()))

    def depth(self, procedure: Procedure) -> int:
        """Overlay hops of the deepest local from G in the procedure's tree."""
        parent = self.broadcast_parent if procedure == "broadcast" else self.upload_parent
        best = 0
        for node in parent:
            d, cur = 0, node
            while cur in parent:
                cur = parent[cur]
                d += 1
            best = max(best, d)
        return best

    # -- (de)serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "scheduler": self.scheduler,
            "blocked": self.blocked,
            "reason": self.reason,
            "global": self.global_site,
            "locals": list(self.local_sites),
            "demand_mbps": self.demand_mbps,
            "broadcast_tree": [[p, c] for c, p in self.broadcast_parent.items()],
            "upload_tree": [[c, p] for c, p in self.upload_parent.items()],
            "paths": [
                {
                    "procedure": e.procedure,
                    "from": e.src,
                    "to": e.dst,
                    "nodes": list(e.path),
                    "wavelength": e.wavelength,
                }
                for e in self.edges
            ],
            "aggregation_sites": sorted(self.aggregation_sites),
            "reservations": [
                {"link": [a, b], "mbps": mbps} for (a, b), mbps in sorted(self.reservations.items())
            ],
            "reserved_mbps_total": self.reserved_mbps_total,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Schedule:
        """Inverse of `to_dict`. Raises ValueError (with the bad field named) on malformed input."""
        try:
            edges = tuple(
                OverlayEdge(
                    procedure=_procedure(p["procedure"]),
                    src=_site(p["from"]),
                    dst=_site(p["to"]),
                    path=tuple(_site(n) for n in _list(p["nodes"], "nodes")),
                    wavelength=None if p.get("wavelength") is None else int(p["wavelength"]),
                )
                for p in _list(d.get("paths", []), "paths")
            )
            for e in edges:
                if len(e.path) < 2 or e.path[0] != e.src or e.path[-1] != e.dst:
                    raise ValueError(f"path of {e.src}->{e.dst} must run from {e.src} to {e.dst}")
            return cls(
                task_id=_task_id(d["task_id"]),
                scheduler=str(d.get("scheduler", "")),
                global_site=_site(d["global"]),
                local_sites=tuple(_site(s) for s in _list(d["locals"], "locals")),
                demand_mbps=float(d.get("demand_mbps", 0.0)),
                broadcast_parent={_site(c): _site(p) for p, c in _pairs(d.get("broadcast_tree", []))},
                upload_parent={_site(c): _site(p) for c, p in _pairs(d.get("upload_tree", []))},
                edges=edges,
                aggregation_sites=frozenset(
                    _site(s) for s in _list(d.get("aggregation_sites", []), "aggregation_sites")
                ),
                reservations={
                    (_site(r["link"][0]), _site(r["link"][1])): float(r["mbps"])
                    for r in _list(d.get("reservations", []), "reservations")
                },
                blocked=bool(d.get("blocked", False)),
                reason=str(d.get("reason", "")),
            )
        except (KeyError, TypeError, IndexError) as e:
            raise ValueError(f"malformed schedule: missing or bad field {e}") from e


def _list(v: Any, what: str) -> list[Any]:
    if not isinstance(v, list):
        raise ValueError(f"malformed schedule: {what} must be a list")
    return v


def _pairs(v: Any) -> Iterable[tuple[Any, Any]]:
    for pair in _list(v, "tree"):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError("malformed schedule: a tree edge must be a [a, b] pair")
        yield pair[0], pair[1]


def _site(v: Any) -> str:
    if not isinstance(v, str) or not v:
        raise ValueError(f"malformed schedule: a site must be a non-empty string, got {v!r}")
    return v


def _task_id(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v < 2**63:
        raise ValueError(f"malformed schedule: task_id must be a positive integer, got {v!r}")
    return v


def _procedure(v: Any) -> Procedure:
    if v == "broadcast":
        return "broadcast"
    if v == "upload":
        return "upload"
    raise ValueError(f"malformed schedule: procedure must be broadcast or upload, got {v!r}")
