"""What one agent is told: its role in one task, as JSON-safe data (no torch imported here).

`AgentConfig` is the task's learning spec (`workers.spec.LearningSpec`, whose settings and defaults
it inherits, never re-declares) plus this role's place in the task's trees. It comes in as JSON
(never a pickled object) and rejects unknown keys; the orchestrator builds it from a schedule
(`orchestrator.runtime.task_runner.agent_configs`) without loading torch.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from workers.spec import LearningSpec

#: The addresses the workers never bind, the wildcards: a role, and its site's server, use the site's
#: own address only (`AgentConfig.from_json`, `workers.transport.Listener`, `workers.site_server`).
WILDCARD_ADDRESSES = frozenset({"", "0.0.0.0", "::"})


def check_cost(name: str, value: object) -> None:
    """Raise ValueError unless `value` is a finite number >= 0 (a modelled training cost's figure,
    `workers.compute`)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


@dataclass(frozen=True, kw_only=True)
class Peer:
    """Another overlay node: its site name and host address."""

    site: str
    host: str


@dataclass(frozen=True, kw_only=True)
class AgentConfig(LearningSpec):
    """Everything one agent needs: the task's learning settings (inherited from `LearningSpec`, as
    the orchestrator specialised them for this node: its own child timeout, the task's derived chunk
    size and timeouts, the selection policy on G only) and its role; JSON in, unknown keys rejected.

    Ports are the task's (`task_ports`): the controller's flow entries match them.
    `part_index` is None for nodes without a local model (G, relays); `num_parts` is the number
    of local models of the task, which all split the same training set with the same seed.
    """

    task: int
    site: str
    host: str
    broadcast_port: int
    upload_port: int
    is_global: bool = False
    expects_global: bool = True
    #: The node that sends this node GLOBAL (None for G and upload-only relays).
    broadcast_parent: Peer | None = None
    broadcast_children: tuple[Peer, ...] = ()
    upload_parent: Peer | None = None
    upload_children: tuple[Peer, ...] = ()
    num_parts: int = 1
    part_index: int | None = None
    events_path: str | None = None
    #: The first round this role takes part in: 1, or the round after the last one a task completed
    #: before it was moved (rescheduled, or restarted so that a site rejoins).
    first_round: int = 1
    #: G only: a safetensors file of the global model to start from (a moved task's last completed
    #: round); None: the model's seeded initialisation. Set by the site server after checking it.
    init_model: str | None = None
    #: G only: write the global model to this safetensors file after every round (atomically), so
    #: that a moved task resumes from its last completed round. Set by the site server.
    checkpoint_path: str | None = None
    #: Emulated compute (`workers.compute`): seconds of one emulated core per training example and
    #: epoch, and per round whatever its examples, the task's modelled cost (both 0: training takes what
    #: it takes on this host, ``compute_timing: measured``); the site's emulated cores; the emulation's
    #: time dilation.
    train_s_per_example: float = 0.0
    train_s_per_round: float = 0.0
    site_speed: float = 1.0
    time_dilation: float = 1.0
    #: Log a fingerprint of each update and aggregate (two linear functionals of the weights, so that
    #: an aggregate's can be checked against the weighted mean of its contributors'; `workers.rounds`).
    fingerprints: bool = False
    #: Every node of a task with selection on: what its locals measure and report up the tree
    #: (a subset of `workers.selection.MEASURES`); None: selection off, no metadata sent at all.
    #: (`selection`, the policy itself, is G's only.)
    selection_measures: tuple[str, ...] | None = None
    #: A local's network cost (the physical hops of its upload path to G), reported to G's policy.
    path_cost: float = 0.0
    #: Groups of broadcast children (site names) whose copies of GLOBAL cross a common link: within
    #: a group (a *lane*) the copies go one after another in the given order, each whole before the
    #: next starts; copies in different lanes, and to children in none, go side by side.
    broadcast_lanes: tuple[tuple[str, ...], ...] = ()
    #: The rate each outbound copy is paced at (`workers.pacing`), wall Mbit/s of wire bytes, by
    #: ``broadcast:<child>`` and ``upload:<parent>``: its overlay edge's bottleneck link as shaped
    #: (the emulated rate / K); a connection not named here is not paced.
    pace_mbps: Mapping[str, float] = field(default_factory=dict)

    @property
    def trains(self) -> bool:
        return self.part_index is not None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        def peer(p: Peer | None) -> dict[str, str] | None:
            return None if p is None else {"site": p.site, "host": p.host}

        d["broadcast_parent"] = peer(self.broadcast_parent)
        d["broadcast_children"] = [peer(p) for p in self.broadcast_children]
        d["upload_parent"] = peer(self.upload_parent)
        d["upload_children"] = [peer(p) for p in self.upload_children]
        d["model_args"] = dict(self.model_args)
        d["dataset_args"] = dict(self.dataset_args)
        d["selection"] = None if self.selection is None else dict(self.selection)
        d["selection_measures"] = None if self.selection_measures is None else list(self.selection_measures)
        d["broadcast_lanes"] = [list(lane) for lane in self.broadcast_lanes]
        d["pace_mbps"] = dict(self.pace_mbps)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AgentConfig:
        """Build from JSON data. Raises ValueError naming the bad key."""
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown agent config keys: {sorted(unknown)}")
        kw = dict(d)
        try:
            for key in ("broadcast_parent", "upload_parent"):
                kw[key] = None if kw.get(key) is None else Peer(**kw[key])
            for key in ("broadcast_children", "upload_children"):
                kw[key] = tuple(Peer(**p) for p in kw.get(key, ()))
            if kw.get("selection_measures") is not None:
                kw["selection_measures"] = tuple(kw["selection_measures"])
            lanes = kw.get("broadcast_lanes", ())
            if not isinstance(lanes, list | tuple) or not all(
                    isinstance(lane, list | tuple) and all(isinstance(c, str) for c in lane) for lane in lanes):
                raise ValueError(f"broadcast_lanes must be a list of lists of site names, got {lanes!r}")
            kw["broadcast_lanes"] = tuple(tuple(lane) for lane in lanes)
            cfg = cls(**kw)
        except TypeError as e:
            raise ValueError(f"bad agent config: {e}") from e
        cfg.check()  # the learning settings: one check, shared with the orchestrator (`LearningSpec.check`)
        if cfg.host in WILDCARD_ADDRESSES:
            raise ValueError("the agent binds to its own host address only, not a wildcard")
        if not cfg.is_global and cfg.upload_parent is None:
            raise ValueError(f"{cfg.site}: a node other than G needs an upload parent")
        if cfg.is_global and not cfg.upload_children:
            raise ValueError(f"{cfg.site}: G needs at least one upload child")
        for name in ("train_s_per_example", "train_s_per_round"):
            check_cost(name, getattr(cfg, name))
        if not (cfg.site_speed > 0 and cfg.time_dilation >= 1):
            raise ValueError(f"site_speed must be > 0 and time_dilation >= 1, got {cfg.site_speed}, {cfg.time_dilation}")
        if not 1 <= cfg.first_round <= cfg.rounds:
            raise ValueError(f"first_round must be in 1..{cfg.rounds}, got {cfg.first_round}")
        if not cfg.is_global and (cfg.init_model is not None or cfg.checkpoint_path is not None):
            raise ValueError(f"{cfg.site}: only G starts from or writes a global model file")
        if cfg.expects_global and not cfg.is_global and cfg.broadcast_parent is None:
            raise ValueError(f"{cfg.site}: a node that expects GLOBAL needs a broadcast parent")
        if cfg.selection is not None and (not cfg.is_global or not isinstance(cfg.selection, Mapping)):
            raise ValueError(f"{cfg.site}: only G holds a selection policy, as a mapping")
        if cfg.selection is not None and cfg.selection_measures is None:
            raise ValueError(f"{cfg.site}: a selection policy needs selection_measures (a list, maybe empty)")
        from workers.selection import MEASURES

        if cfg.selection_measures is not None and not set(cfg.selection_measures) <= set(MEASURES):
            raise ValueError(f"selection_measures must be among {MEASURES}, got {list(cfg.selection_measures)}")
        if isinstance(cfg.path_cost, bool) or not isinstance(cfg.path_cost, int | float) or cfg.path_cost < 0:
            raise ValueError(f"path_cost must be a non-negative number, got {cfg.path_cost!r}")
        in_lanes = [c for lane in cfg.broadcast_lanes for c in lane]
        children = {c.site for c in cfg.broadcast_children}
        if len(in_lanes) != len(set(in_lanes)) or not set(in_lanes) <= children:
            raise ValueError(f"{cfg.site}: broadcast_lanes must name each broadcast child at most once, among "
                             f"{sorted(children)}; got {[list(lane) for lane in cfg.broadcast_lanes]}")
        _check_pace(cfg)
        return cfg


def _check_pace(cfg: AgentConfig) -> None:
    """`pace_mbps` names this node's outbound connections only, each with a finite rate > 0."""
    if not isinstance(cfg.pace_mbps, Mapping):
        raise ValueError(f"pace_mbps must be a mapping, got {cfg.pace_mbps!r}")
    outbound = {f"broadcast:{c.site}" for c in cfg.broadcast_children}
    outbound |= set() if cfg.upload_parent is None else {f"upload:{cfg.upload_parent.site}"}
    for key, rate in cfg.pace_mbps.items():
        if key not in outbound:
            raise ValueError(f"{cfg.site}: pace_mbps names {key!r}, not one of its outbound connections "
                             f"{sorted(outbound)}")
        if isinstance(rate, bool) or not isinstance(rate, int | float) or not (math.isfinite(rate) and rate > 0):
            raise ValueError(f"{cfg.site}: pace_mbps[{key!r}] must be a finite number > 0, got {rate!r}")


#: G's global model after each round, beside its events file (``<stem>.events.jsonl``).
CHECKPOINT_SUFFIX = ".global.safetensors"
EVENTS_SUFFIX = ".events.jsonl"


def checkpoint_of(events_path: Path) -> Path:
    """Where G, logging to `events_path`, writes its global model after every round."""
    name = events_path.name
    stem = name[: -len(EVENTS_SUFFIX)] if name.endswith(EVENTS_SUFFIX) else name
    return events_path.with_name(stem + CHECKPOINT_SUFFIX)


def normalize_spec(spec: str) -> str:
    """A model or dataset spec with its ``file.py`` part made absolute (agents do not share the
    caller's working directory)."""
    target, sep, attr = spec.rpartition(":")
    if sep and target.endswith(".py"):
        return f"{Path(target).expanduser().resolve()}:{attr}"
    return spec


_PLAIN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,47}")


def file_stem(site: str) -> str:
    """A file-name-safe identifier of a site: the name itself when it is plain ASCII (letters,
    digits, ``_.-``, not leading ``.`` or ``-``), else an ASCII slug of it plus 8 hex digits of its
    SHA-256. Distinct sites get distinct stems; the site name itself stays data."""
    if _PLAIN.fullmatch(site):
        return site
    slug = re.sub(r"[^A-Za-z0-9]+", "_", site).strip("_")[:24] or "site"
    return f"{slug}-{hashlib.sha256(site.encode('utf-8')).hexdigest()[:8]}"
