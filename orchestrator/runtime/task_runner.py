"""Run one FL task on a `Schedule`: agent configs, start/stop through a compute backend, results.

`agent_configs` turns a schedule into one `AgentConfig` per overlay node (pure; tested without any
network). `run_task` starts every agent at once through a `ComputeBackend`
(`orchestrator.runtime.backends`); the agents connect every overlay edge before G starts round 1
(so no round includes process start-up or a connect), it waits for all of them, and always stops them. `summarize` turns the agents'
JSON-lines timing events into per-round results
(docs/architecture.md, "Definitions of the measured quantities"):

- ``latency_s``: G's round start to G holding the aggregate;
- the breakdown follows the round's critical path, the local model whose training ended last:
  ``broadcast_s`` from the round start to its GLOBAL arriving, ``train_s`` from then to its
  training's end (forwarding to its children included), ``upload_s`` from then to G holding the
  aggregate (upload and in-path aggregation). The three add up to the latency.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from orchestrator.errors import ConfigError
from orchestrator.runtime.timing import TaskTiming, subtree_heights
from orchestrator.scheduling.schedule import Schedule, task_ports
from workers.config import DEFAULT_CHUNK_BYTES, AgentConfig, Peer, normalize_spec


@dataclass(frozen=True, kw_only=True)
class FLOptions:
    """How the task learns (all agents share these)."""

    model: str = "mlp"
    model_args: Mapping[str, Any] = field(default_factory=dict)
    rounds: int = 3
    dataset: str = "digits"
    dataset_args: Mapping[str, Any] = field(default_factory=dict)
    partitioning: str = "iid"
    alpha: float = 0.5
    seed: int = 0
    local_epochs: int = 2
    batch_size: int = 32
    lr: float = 0.1
    #: Per-child wait of a node whose subtree has height 1; deeper nodes wait proportionally longer,
    #: so a parent never gives up on a child that is itself still waiting for a straggler.
    child_timeout_s: float = 60.0
    connect_timeout_s: float = 60.0
    global_timeout_s: float = 600.0
    #: Messages travel in chunks of this size so the receiver checks chunk i while i+1 arrives.
    max_chunk_bytes: int | None = DEFAULT_CHUNK_BYTES
    threads: int = 1


class WorkerHandle(Protocol):
    """A started agent (process or container)."""

    site: str

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""

    def stop(self) -> None:
        """Kill it if it still runs and release what it holds; idempotent."""


class ComputeBackend(Protocol):
    """Places an agent on a site (see `orchestrator.runtime.backends`)."""

    name: str

    def address(self, site: str) -> str:
        """The IPv4 address the site's agent binds to and is reached at."""

    def start(self, site: str, config: AgentConfig, *, log_dir: Path) -> WorkerHandle:
        """Start the site's agent with `config` (its events file is ``log_dir/<site>.events.jsonl``)."""


def _check_trees(schedule: Schedule, addresses: Mapping[str, str]) -> None:
    if schedule.blocked:
        raise ConfigError(f"task {schedule.task_id} is blocked: {schedule.reason}")
    nodes = schedule.overlay_nodes
    missing = [n for n in nodes if n not in addresses]
    if missing:
        raise ConfigError(f"no host address for overlay nodes {missing}")
    g = schedule.global_site
    for local in schedule.local_sites:
        for parent, what in ((schedule.broadcast_parent, "broadcast"), (schedule.upload_parent, "upload")):
            cur, hops = local, 0
            while cur != g:
                if cur not in parent or hops > len(nodes):
                    raise ConfigError(f"task {schedule.task_id}: the {what} tree does not join {local} to G")
                cur, hops = parent[cur], hops + 1


def agent_configs(
    schedule: Schedule,
    *,
    addresses: Mapping[str, str],
    options: FLOptions,
    timing: TaskTiming | None = None,
    events_dir: Mapping[str, str] | None = None,
) -> dict[str, AgentConfig]:
    """One agent config per overlay node of `schedule`.

    Parameters
    ----------
    addresses
        Site -> IPv4 address of the host that runs its agent.
    timing
        Chunk size and timeouts derived from the schedule (`orchestrator.runtime.timing`); None:
        `options`' fixed values, a node's child timeout scaled by the height of its subtree.
    events_dir
        Site -> directory (as the agent sees it) for its events file; None: the agents log to stdout.

    Raises
    ------
    ConfigError
        A blocked schedule, a node without an address, a tree that does not reach every local
        model from G.
    """
    _check_trees(schedule, addresses)
    nodes = schedule.overlay_nodes
    up_children = {n: sorted(schedule.upload_children(n)) for n in nodes}
    if timing is None:
        heights = subtree_heights(up_children, schedule.global_site)
        timing = TaskTiming(
            chunk_bytes=options.max_chunk_bytes or DEFAULT_CHUNK_BYTES,
            child_timeout_s={n: options.child_timeout_s * max(1, heights.get(n, 0)) for n in nodes},
            connect_timeout_s=options.connect_timeout_s,
            global_timeout_s=options.global_timeout_s,
            store_and_forward_s=0.0,
        )
    bc_port, up_port = task_ports(schedule.task_id)
    part_of = {site: i for i, site in enumerate(schedule.local_sites)}

    def peer(site: str | None) -> Peer | None:
        return None if site is None else Peer(site=site, host=addresses[site])

    return {
        n: AgentConfig(
            task=schedule.task_id, site=n, host=addresses[n], broadcast_port=bc_port, upload_port=up_port,
            rounds=options.rounds, is_global=n == schedule.global_site,
            expects_global=n in schedule.broadcast_parent,
            broadcast_parent=peer(schedule.broadcast_parent.get(n)),
            broadcast_children=tuple(Peer(site=c, host=addresses[c]) for c in sorted(schedule.broadcast_children(n))),
            upload_parent=peer(schedule.upload_parent.get(n)),
            upload_children=tuple(Peer(site=c, host=addresses[c]) for c in up_children[n]),
            model=normalize_spec(options.model), model_args=dict(options.model_args), model_seed=options.seed,
            dataset=options.dataset, dataset_args=dict(options.dataset_args), partitioning=options.partitioning,
            alpha=options.alpha, data_seed=options.seed, num_parts=len(schedule.local_sites),
            part_index=part_of.get(n), local_epochs=options.local_epochs, batch_size=options.batch_size,
            lr=options.lr, child_timeout_s=timing.child_timeout_s[n], connect_timeout_s=timing.connect_timeout_s,
            global_timeout_s=timing.global_timeout_s, max_chunk_bytes=timing.chunk_bytes, threads=options.threads,
            events_path=None if events_dir is None else f"{events_dir[n]}/{n}.events.jsonl",
        )
        for n in nodes
    }


# -- results ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundResult:
    round: int
    latency_s: float
    broadcast_s: float
    train_s: float
    upload_s: float
    accuracy: float
    loss: float
    num_examples: int
    #: Nodes left out of the round: by a timeout (``site``) or a broken connection (``site (lost)``).
    stragglers: tuple[str, ...]
    #: Round start to the last local holding the whole GLOBAL.
    broadcast_all_s: float = 0.0
    #: The last local's training end to G holding the aggregate.
    upload_tail_s: float = 0.0
    #: The shortest local training of the round (what a round's lower bound may count).
    train_min_s: float = 0.0


@dataclass(frozen=True)
class TaskResult:
    task_id: int
    backend: str
    scheduler: str
    rounds: tuple[RoundResult, ...]
    model_bytes: int
    log_dir: str
    rejected: tuple[dict[str, Any], ...] = ()
    #: From launching the agents to the last one listening (processes, torch, model, data).
    agents_ready_s: float = 0.0
    #: From the last agent listening to G knowing every connection of the task is up.
    connect_s: float = 0.0
    chunk_bytes: int = 0
    #: Connections that broke during the rounds (each also ends a straggler or a lost round).
    connections_lost: int = 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rounds"] = [asdict(r) | {"stragglers": list(r.stragglers)} for r in self.rounds]
        d["rejected"] = list(self.rejected)
        return d


def read_events(path: Path) -> list[dict[str, Any]]:
    """Events of one agent (skips a torn last line of an agent that was killed)."""
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


REQUIRED_LOCAL_EVENTS = ("global_received", "train_start", "train_end", "aggregated", "update_sent")


def summarize(
    schedule: Schedule, events: Mapping[str, Sequence[Mapping[str, Any]]], *, rounds: int
) -> list[RoundResult]:
    """Per-round results from every agent's events (see the module docstring).

    Raises
    ------
    RuntimeError
        If G did not complete every round.
    """
    # One pass over every agent's events: (site, event, round) -> the first such event's time.
    first: dict[tuple[str, str, int], Mapping[str, Any]] = {}
    left_out_by_round: dict[int, set[str]] = {}
    for site, evs in events.items():
        for e in evs:
            if "round" not in e:
                continue
            first.setdefault((site, e["event"], e["round"]), e)
            if e["event"] in ("child_timeout", "child_lost"):
                lost = " (lost)" if e["event"] == "child_lost" else ""
                left_out_by_round.setdefault(e["round"], set()).add(f"{e['child']}{lost}")

    def times(name: str, r: int) -> dict[str, float]:
        """Site -> time of its `name` event in round `r`, over the local sites that logged one."""
        return {s: float(e["t"]) for s in schedule.local_sites if (e := first.get((s, name, r))) is not None}

    g = schedule.global_site
    results = []
    for r in range(1, rounds + 1):
        start, done, agg = (first.get((g, name, r)) for name in ("round_start", "round_complete", "aggregated"))
        if start is None or done is None or agg is None:
            raise RuntimeError(f"G ({g}) did not complete round {r}")
        t0, t_agg = float(start["t"]), float(agg["t"])
        latency = t_agg - t0
        received, trained, began = times("global_received", r), times("train_end", r), times("train_start", r)
        # Critical path: the local model whose training ended last (among those that logged both).
        crit_site = max((s for s in trained if s in received), key=trained.__getitem__, default=None)
        crit = None if crit_site is None else (received[crit_site], trained[crit_site])
        spans = [trained[s] - began[s] for s in trained if s in began]
        if crit is None:
            broadcast = train = 0.0
        else:
            broadcast = min(max(0.0, crit[0] - t0), latency)
            train = min(max(0.0, crit[1] - crit[0]), latency - broadcast)
        results.append(
            RoundResult(
                round=r,
                latency_s=latency,
                broadcast_s=broadcast,
                train_s=train,
                upload_s=latency - broadcast - train,
                accuracy=float(done["accuracy"]),
                loss=float(done["loss"]),
                num_examples=int(done["num_examples"]),
                stragglers=tuple(sorted(left_out_by_round.get(r, ()))),
                broadcast_all_s=max(received.values()) - t0 if received else 0.0,
                upload_tail_s=t_agg - max(trained.values()) if trained else 0.0,
                train_min_s=min(spans) if spans else 0.0,
            )
        )
    return results


def missing_events(
    schedule: Schedule, events: Mapping[str, Sequence[Mapping[str, Any]]], *, rounds: int
) -> list[str]:
    """What the timing logs lack: every local must log every per-round event of every round."""
    problems = []
    for site in schedule.local_sites:
        ev = events.get(site, [])
        for r in range(1, rounds + 1):
            for name in REQUIRED_LOCAL_EVENTS:
                if not any(e.get("event") == name and e.get("round") == r for e in ev):
                    problems.append(f"{site}: no {name} in round {r}")
    for r in range(1, rounds + 1):
        for name in ("round_start", "aggregated", "round_complete"):
            if not any(e.get("event") == name and e.get("round") == r for e in events.get(schedule.global_site, [])):
                problems.append(f"{schedule.global_site} (G): no {name} in round {r}")
    return problems


# -- running ----------------------------------------------------------------------------------------
def _last_words(events_path: Path) -> str:
    """The agent's last error event or output line (for one-line error messages)."""
    errors = [e for e in read_events(events_path) if e.get("event") == "error"]
    if errors:
        return str(errors[-1].get("detail", "error"))
    out = events_path.with_name(events_path.name.replace(".events.jsonl", ".out.txt"))
    lines = out.read_text(errors="replace").strip().splitlines() if out.exists() else []
    return lines[-1] if lines else f"no output (see {out})"


def run_task(
    schedule: Schedule,
    *,
    backend: ComputeBackend,
    options: FLOptions,
    log_dir: Path,
    timing: TaskTiming | None = None,
    ready_timeout_s: float = 180.0,
) -> TaskResult:
    """Run the task's agents to completion and summarize; every agent is stopped on every exit path.

    All agents start at once; they connect every overlay edge before G starts round 1.

    Raises
    ------
    ConfigError
        Bad schedule (see `agent_configs`).
    RuntimeError, TimeoutError
        An agent failed or did not finish in time (the message names it and its log).
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    nodes = schedule.overlay_nodes
    configs = agent_configs(schedule, addresses={n: backend.address(n) for n in nodes}, options=options,
                            timing=timing)
    paths = {n: log_dir / f"{n}.events.jsonl" for n in nodes}
    for p in paths.values():
        p.unlink(missing_ok=True)
    handles: dict[str, WorkerHandle] = {}
    g = schedule.global_site
    launched = time.monotonic()
    budget_s = ready_timeout_s + configs[g].global_timeout_s * (options.rounds + 1)
    try:
        for n in nodes:
            handles[n] = backend.start(n, configs[n], log_dir=log_dir)
        _wait_for_agents(handles, paths, g, launched + budget_s, log_dir)
    finally:
        for h in handles.values():
            h.stop()
    events = {n: read_events(p) for n, p in paths.items()}
    return _task_result(schedule, backend.name, options, events, log_dir, launched)


def _wait_for_agents(handles: Mapping[str, WorkerHandle], paths: Mapping[str, Path], g: str, deadline: float,
                     log_dir: Path) -> None:
    """Poll the agents' exit statuses until all have exited 0; raise on a failure or the deadline."""
    while True:
        status = {n: h.poll() for n, h in handles.items()}
        failed = {n: s for n, s in status.items() if s not in (None, 0)}
        if failed:
            why = "; ".join(f"{n}: {_last_words(paths[n])}" for n in failed)
            raise RuntimeError(f"agents failed (exit status {failed}): {why}; logs in {log_dir}")
        if all(s == 0 for s in status.values()):
            return
        if time.monotonic() > deadline:
            waiting = sorted(n for n, s in status.items() if s is None)
            raise TimeoutError(f"the agents of {waiting} did not finish in time; logs in {log_dir}")
        time.sleep(0.1)  # poll interval of the agents' exit status, bounded by the deadline


def _task_result(schedule: Schedule, backend: str, options: FLOptions,
                 events: Mapping[str, Sequence[Mapping[str, Any]]], log_dir: Path, launched: float) -> TaskResult:
    # The agents log on CLOCK_MONOTONIC, the clock `launched` was read on (one kernel, containers too).
    g_events = events.get(schedule.global_site, [])
    ready = [float(e["t"]) for evs in events.values() for e in evs if e.get("event") == "ready"]
    connected = [float(e["t"]) for e in g_events if e.get("event") == "connected"]
    first_ready = [e for e in g_events if e.get("event") == "ready"]
    return TaskResult(
        task_id=schedule.task_id,
        backend=backend,
        scheduler=schedule.scheduler,
        rounds=tuple(summarize(schedule, events, rounds=options.rounds)),
        model_bytes=int(first_ready[0]["model_bytes"]) if first_ready else 0,
        log_dir=str(log_dir),
        rejected=tuple(dict(e) for evs in events.values() for e in evs if e.get("event") == "rejected"),
        agents_ready_s=max(0.0, max(ready) - launched) if ready else 0.0,
        connect_s=max(0.0, connected[0] - max(ready)) if connected and ready else 0.0,
        chunk_bytes=int(first_ready[0].get("chunk_bytes", 0)) if first_ready else 0,
        connections_lost=sum(1 for evs in events.values() for e in evs
                             if e.get("event") == "connection_lost" and e.get("direction") == "in"),
    )
