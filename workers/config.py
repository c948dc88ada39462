"""What one agent is told: its role in one task, as JSON-safe data (no torch imported here).

`AgentConfig` comes in as JSON (never a pickled object) and rejects unknown keys; the orchestrator
builds it from a schedule (`orchestrator.runtime.task_runner.agent_configs`) without loading torch.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

#: Chunk size of GLOBAL and UPDATE messages (1 MiB was fastest in benchmarks/bench_transfer.py).
DEFAULT_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Peer:
    """Another overlay node: its site name and host address."""

    site: str
    host: str


@dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """Everything one agent needs; JSON in, unknown keys rejected.

    Ports are the task's (`task_ports`): the controller's flow entries match them.
    `part_index` is None for nodes without a local model (G, relays); `num_parts` is the number
    of local models of the task, which all split the same training set with the same seed.
    """

    task: int
    site: str
    host: str
    broadcast_port: int
    upload_port: int
    rounds: int
    is_global: bool = False
    expects_global: bool = True
    #: The node that sends this node GLOBAL (None for G and upload-only relays).
    broadcast_parent: Peer | None = None
    broadcast_children: tuple[Peer, ...] = ()
    upload_parent: Peer | None = None
    upload_children: tuple[Peer, ...] = ()
    model: str = "mlp"
    model_args: Mapping[str, Any] = field(default_factory=dict)
    model_seed: int = 0
    dataset: str = "digits"
    dataset_args: Mapping[str, Any] = field(default_factory=dict)
    partitioning: str = "iid"
    alpha: float = 0.5
    data_seed: int = 0
    num_parts: int = 1
    part_index: int | None = None
    local_epochs: int = 2
    batch_size: int = 32
    lr: float = 0.1
    #: ``fedavg`` or ``fedprox`` (`workers.strategies`); `mu`: FedProx's proximal coefficient.
    strategy: str = "fedavg"
    mu: float = 0.0
    #: How UPDATE chunks travel (`workers.compression`): ``none``, ``fp16``, ``int8``,
    #: ``int8-chunk`` or ``topk`` (keeping the fraction `k` of each piece's elements).
    compression: str = "none"
    k: float | None = None
    #: How long a node waits, from its round's start, for its upload children's chunks.
    child_timeout_s: float = 60.0
    #: Bound on setting up (or re-establishing) one connection, retries with backoff included.
    connect_timeout_s: float = 30.0
    #: The agent gives up after this long without any event.
    global_timeout_s: float = 600.0
    #: Size of a model chunk: relays forward and aggregators combine chunk by chunk. Every node of
    #: a task must have the same (the orchestrator picks it, `optimal_chunk_bytes`).
    max_chunk_bytes: int | None = DEFAULT_CHUNK_BYTES
    threads: int = 1
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
    #: Log a fingerprint of each update and aggregate (two linear functionals of the weights, so that
    #: an aggregate's can be checked against the weighted mean of its contributors'; `workers.rounds`).
    fingerprints: bool = False
    #: G only: the local-model selection policy (``{"policy": SPEC, **options}``, `workers.selection`);
    #: None: every local trains in every round.
    selection: Mapping[str, Any] | None = None
    #: Every node of a task with selection on: what its locals measure and report up the tree
    #: (a subset of `workers.selection.MEASURES`); None: selection off, no metadata sent at all.
    selection_measures: tuple[str, ...] | None = None
    #: A local's network cost (the physical hops of its upload path to G), reported to G's policy.
    path_cost: float = 0.0
    #: Groups of broadcast children (site names) whose copies of GLOBAL cross a common link: within
    #: a group (a *lane*) the copies go one after another in the given order, each whole before the
    #: next starts; copies in different lanes, and to children in none, go side by side.
    broadcast_lanes: tuple[tuple[str, ...], ...] = ()

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
        if cfg.host in ("", "0.0.0.0", "::"):
            raise ValueError("the agent binds to its own host address only, not a wildcard")
        if not cfg.is_global and cfg.upload_parent is None:
            raise ValueError(f"{cfg.site}: a node other than G needs an upload parent")
        if cfg.is_global and not cfg.upload_children:
            raise ValueError(f"{cfg.site}: G needs at least one upload child")
        if cfg.rounds < 1:
            raise ValueError("rounds must be at least 1")
        if not 1 <= cfg.first_round <= cfg.rounds:
            raise ValueError(f"first_round must be in 1..{cfg.rounds}, got {cfg.first_round}")
        if not cfg.is_global and (cfg.init_model is not None or cfg.checkpoint_path is not None):
            raise ValueError(f"{cfg.site}: only G starts from or writes a global model file")
        if cfg.expects_global and not cfg.is_global and cfg.broadcast_parent is None:
            raise ValueError(f"{cfg.site}: a node that expects GLOBAL needs a broadcast parent")
        for name in ("child_timeout_s", "connect_timeout_s", "global_timeout_s"):
            if not getattr(cfg, name) > 0:
                raise ValueError(f"{name} must be positive")
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
        if cfg.max_chunk_bytes is not None and cfg.max_chunk_bytes < 1024:
            raise ValueError("max_chunk_bytes must be at least 1024 (or null: one chunk per message)")
        check_learning(strategy=cfg.strategy, mu=cfg.mu, compression=cfg.compression, k=cfg.k, lr=cfg.lr,
                       local_epochs=cfg.local_epochs, batch_size=cfg.batch_size, dataset=cfg.dataset,
                       dataset_args=cfg.dataset_args)
        return cfg


#: Kept in step with `workers.strategies.STRATEGIES`, `workers.compression.COMPRESSIONS` and
#: `workers.data.DATASETS` (this module imports no torch; a unit test checks they agree).
STRATEGIES = ("fedavg", "fedprox")
COMPRESSIONS = ("none", "fp16", "int8", "int8-chunk", "topk")
BUILTIN_DATASETS = ("digits", "synthetic")
#: The fraction of elements ``topk`` keeps when `k` is not given.
DEFAULT_TOPK = 0.01


def _number(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int | float) and v == v


def _count(v: Any) -> bool:
    return not isinstance(v, bool) and isinstance(v, int)


def check_learning(*, strategy: Any, mu: Any, compression: Any, k: Any, lr: Any, local_epochs: Any,
                   batch_size: Any, dataset: Any, dataset_args: Any) -> None:
    """Check the training knobs of a task (shared by the agent config and the experiment config).

    Raises
    ------
    ValueError
        Naming the knob and what is wrong with it.
    """
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if not _number(mu) or mu < 0:
        raise ValueError(f"mu must be a number >= 0, got {mu!r}")
    if mu and strategy != "fedprox":
        raise ValueError(f"mu (FedProx's proximal term) needs strategy fedprox, not {strategy!r}")
    if compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
    if k is not None:
        if compression != "topk":
            raise ValueError(f"k (the fraction top-k keeps) needs compression topk, not {compression!r}")
        if not _number(k) or not 0 < k <= 1:
            raise ValueError(f"k must be a number in (0, 1], got {k!r}")
    if not _number(lr) or not lr > 0:
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if not _count(local_epochs) or local_epochs < 1:
        raise ValueError(f"local_epochs must be an integer >= 1, got {local_epochs!r}")
    if not _count(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not isinstance(dataset, str) or not dataset:
        raise ValueError(f"dataset must be a non-empty string, got {dataset!r}")
    if dataset not in BUILTIN_DATASETS and ":" not in dataset:
        raise ValueError(f"unknown dataset {dataset!r}: built in are {', '.join(BUILTIN_DATASETS)}; or give "
                         "'module:factory' or 'path/to/file.py:factory'")
    if not isinstance(dataset_args, Mapping) or not all(isinstance(a, str) for a in dataset_args):
        raise ValueError(f"dataset_args must be a mapping of argument names to values, got {dataset_args!r}")


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
