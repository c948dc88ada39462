"""Run one FL task on a `Schedule`: agent configs, start/stop through a compute backend, results.

`agent_configs` turns a schedule into one `AgentConfig` per overlay node (pure; tested without any
network). `TaskExecution` sends every node's role at once to its site's server through the
computing manager (`orchestrator.runtime.compute`); the roles connect every overlay edge before G
starts round 1 (so no round includes a start-up or a connect), it follows them, and always stops
them; `run_task` runs one task to the end. `summarize` turns the roles'
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from networkx.utils import UnionFind

from orchestrator.errors import ConfigError
from orchestrator.runtime.timing import TaskTiming, subtree_heights
from orchestrator.scheduling.schedule import Schedule, task_ports
from workers.config import AgentConfig, Peer, checkpoint_of, normalize_spec
from workers.selection import MAX_SITES
from workers.spec import DEFAULT_CHUNK_BYTES, LearningSpec, SpecError

#: How a task learns: the learning spec itself (`workers.spec`), under the name the runtime's callers
#: use. Its settings, defaults and checks are declared there once; `agent_configs` checks it.
FLOptions = LearningSpec


def path_costs(schedule: Schedule) -> dict[str, float]:
    """Each local's network cost: the physical hops of its upload path to G along the upload tree
    (an overlay edge without a physical path in the schedule counts as one hop)."""
    hops = {(e.src, e.dst): max(1, len(e.path) - 1) for e in schedule.edges_of("upload")}
    out: dict[str, float] = {}
    for local in schedule.local_sites:
        cost, cur, seen = 0, local, set()
        while cur != schedule.global_site and cur in schedule.upload_parent and cur not in seen:
            seen.add(cur)
            parent = schedule.upload_parent[cur]
            cost += hops.get((cur, parent), 1)
            cur = parent
        out[local] = float(cost)
    return out


def selection_settings(selection: Mapping[str, Any] | None) -> tuple[dict[str, Any] | None, tuple[str, ...] | None]:
    """(G's selection config, every node's measures) of a task; (None, None) for the default ``all``.

    Raises
    ------
    ConfigError
        The policy cannot be built (unknown spec, bad option).
    """
    from workers.selection import SelectionError, is_all, make_policy

    try:
        policy = make_policy(selection)
    except SelectionError as e:
        raise ConfigError(f"selection: {e}") from None
    if selection is None or is_all(selection):
        return None, None
    config = dict(selection)
    if isinstance(config.get("policy"), str):
        config["policy"] = normalize_spec(config["policy"])
    return config, tuple(policy.measures)


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


def fixed_timing(options: LearningSpec, upload_children: Mapping[str, list[str]], global_site: str) -> TaskTiming:
    """A task's timing from `options`' fixed values (no schedule-derived timing): each node's child
    timeout is `options.child_timeout_s` times the height of its upload subtree."""
    heights = subtree_heights(upload_children, global_site)
    return TaskTiming(
        chunk_bytes=options.max_chunk_bytes or DEFAULT_CHUNK_BYTES,
        child_timeout_s={n: options.child_timeout_s * max(1, heights.get(n, 0)) for n in upload_children},
        connect_timeout_s=options.connect_timeout_s,
        global_timeout_s=options.global_timeout_s,
        store_and_forward_s=0.0,
    )


def agent_configs(
    schedule: Schedule,
    *,
    addresses: Mapping[str, str],
    options: FLOptions,
    timing: TaskTiming | None = None,
) -> dict[str, AgentConfig]:
    """One agent config per overlay node of `schedule`.

    Parameters
    ----------
    addresses
        Site -> IPv4 address of the host that runs its agent.
    timing
        Chunk size and timeouts derived from the schedule (`orchestrator.runtime.timing`); None:
        `options`' fixed values, a node's child timeout scaled by the height of its subtree.

    Raises
    ------
    ConfigError
        A bad learning setting (`LearningSpec.check`), a blocked schedule, a node without an
        address, a tree that does not reach every local model from G.
    """
    try:
        options.check()
    except SpecError as e:
        raise ConfigError(f"task {schedule.task_id}: {e}") from None
    _check_trees(schedule, addresses)
    nodes = schedule.overlay_nodes
    up_children = {n: sorted(schedule.upload_children(n)) for n in nodes}
    timing = timing or fixed_timing(options, up_children, schedule.global_site)
    bc_port, up_port = task_ports(schedule.task_id)
    part_of = {site: i for i, site in enumerate(schedule.local_sites)}
    selection, measures = selection_settings(options.selection)
    if measures is not None and len(schedule.local_sites) > MAX_SITES:
        raise ConfigError(f"task {schedule.task_id}: selection handles at most {MAX_SITES} locals, "
                          f"not {len(schedule.local_sites)}")
    costs = path_costs(schedule) if measures is not None else {}

    def peer(site: str | None) -> Peer | None:
        return None if site is None else Peer(site=site, host=addresses[site])

    shared = options.settings() | {
        "model": normalize_spec(options.model), "dataset": normalize_spec(options.dataset),
        "connect_timeout_s": timing.connect_timeout_s, "global_timeout_s": timing.global_timeout_s,
        "max_chunk_bytes": timing.chunk_bytes,
    }
    return {
        n: AgentConfig(
            **shared | {"child_timeout_s": timing.child_timeout_s[n],
                        "selection": selection if n == schedule.global_site else None},
            task=schedule.task_id, site=n, host=addresses[n], broadcast_port=bc_port, upload_port=up_port,
            is_global=n == schedule.global_site, expects_global=n in schedule.broadcast_parent,
            broadcast_parent=peer(schedule.broadcast_parent.get(n)),
            broadcast_children=tuple(Peer(site=c, host=addresses[c]) for c in sorted(schedule.broadcast_children(n))),
            upload_parent=peer(schedule.upload_parent.get(n)),
            upload_children=tuple(Peer(site=c, host=addresses[c]) for c in up_children[n]),
            num_parts=len(schedule.local_sites), part_index=part_of.get(n), selection_measures=measures,
            path_cost=costs.get(n, 0.0), broadcast_lanes=broadcast_lanes(schedule, n),
        )
        for n in nodes
    }


def broadcast_lanes(schedule: Schedule, node: str) -> tuple[tuple[str, ...], ...]:
    """`node`'s broadcast children grouped into lanes (`workers.config.AgentConfig.broadcast_lanes`):
    children whose overlay edges from `node` share a directed link, directly or through another
    child's, are in one lane. Sent one after another, each copy crosses a shared link at its full
    rate and its subtree can train and upload while the next copy crosses; sent side by side, all
    would finish together, at the end (see docs/architecture.md, "Data plane"). A lane serves the
    child with the most locals below it first (then by name); one-child groups are left out."""
    edges = {e.dst: e for e in schedule.edges_of("broadcast") if e.src == node}
    groups = UnionFind(edges)
    owner: dict[tuple[str, str], str] = {}
    for c in sorted(edges):
        for link in edges[c].links():
            groups.union(owner.setdefault(link, c), c)
    locals_ = set(schedule.local_sites)

    def locals_below(c: str) -> int:
        count, todo = 0, [c]
        while todo:
            n = todo.pop()
            count += n in locals_
            todo.extend(schedule.broadcast_children(n))
        return count

    lanes = [sorted(m, key=lambda c: (-locals_below(c), c)) for m in groups.to_sets() if len(m) > 1]
    return tuple(tuple(lane) for lane in sorted(lanes))


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
    #: Nodes left out of the round: by a timeout (``site``), a broken connection (``site (lost)``,
    #: ``site (absent)``) or an out-of-order chunk (``site (rejected)``).
    stragglers: tuple[str, ...]
    #: Round start to the last local holding the whole GLOBAL.
    broadcast_all_s: float = 0.0
    #: The last local's training end to G holding the aggregate.
    upload_tail_s: float = 0.0
    #: The shortest local training of the round (what a round's lower bound may count).
    train_min_s: float = 0.0
    #: Frame bytes of the round on the overlay's edges (headers included, TCP/IP not): every node's
    #: GLOBAL received, every node's UPDATE sent (compressed, with a codec).
    broadcast_bytes: int = 0
    #: Local-model selection: the locals G chose for the round (empty: no selection, all trained).
    selected: tuple[str, ...] = ()
    upload_bytes: int = 0
    #: How many of the task's locals trained in the round (logged their training's end).
    trained: int = 0


@dataclass(frozen=True)
class TaskResult:
    task_id: int
    backend: str
    scheduler: str
    rounds: tuple[RoundResult, ...]
    model_bytes: int
    log_dir: str
    rejected: tuple[dict[str, Any], ...] = ()
    #: From sending the roles to the site servers to the last one listening (model, data, warm-up).
    agents_ready_s: float = 0.0
    #: From the last role listening to G knowing every connection of the task is up.
    connect_s: float = 0.0
    chunk_bytes: int = 0
    #: Connections that broke during the rounds (each also ends a straggler or a lost round).
    connections_lost: int = 0
    #: CLOCK_MONOTONIC times: roles sent to the servers, G starting round 1's broadcast, G done.
    started_t: float = 0.0
    first_broadcast_t: float = 0.0
    finished_t: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["rounds"] = [asdict(r) | {"stragglers": list(r.stragglers), "selected": list(r.selected)}
                       for r in self.rounds]
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


#: Events that leave a child out of a round, and what its name carries in `RoundResult.stragglers`.
LEFT_OUT = {"child_timeout": "", "child_lost": " (lost)", "child_absent": " (absent)", "rejected": " (rejected)"}
REQUIRED_LOCAL_EVENTS = ("global_received", "train_start", "train_end", "aggregated", "update_sent")


def summarize(
    schedule: Schedule, events: Mapping[str, Sequence[Mapping[str, Any]]], *, rounds: int, first_round: int = 1
) -> list[RoundResult]:
    """Per-round results (rounds `first_round`..`rounds`) from every agent's events (see the module docstring).

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
            # a child left out for an out-of-order chunk logs "rejected" with the child's name
            if e["event"] in LEFT_OUT and "child" in e:
                left_out_by_round.setdefault(e["round"], set()).add(f"{e['child']}{LEFT_OUT[e['event']]}")

    def total_bytes(name: str, r: int) -> int:
        return sum(int(e.get("nbytes", 0)) for s in events if (e := first.get((s, name, r))) is not None)

    def times(name: str, r: int) -> dict[str, float]:
        """Site -> time of its `name` event in round `r`, over the local sites that logged one."""
        return {s: float(e["t"]) for s in schedule.local_sites if (e := first.get((s, name, r))) is not None}

    g = schedule.global_site
    results = []
    for r in range(first_round, rounds + 1):
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
                broadcast_bytes=total_bytes("global_received", r),
                upload_bytes=total_bytes("update_sent", r),
                selected=tuple((first.get((g, "selected", r)) or {}).get("sites", ())),
                trained=len(trained),
            )
        )
    return results


def rounds_so_far(schedule: Schedule, events: Mapping[str, Sequence[Mapping[str, Any]]],
                  first: int = 1) -> list[RoundResult]:
    """The rounds G has completed so far (from round `first`), summarized; [] while none has, or
    while an events line is still torn (read again later)."""
    done = sum(1 for e in events.get(schedule.global_site, []) if e.get("event") == "round_complete")
    if not done:
        return []
    try:
        return summarize(schedule, events, rounds=first - 1 + done, first_round=first)
    except RuntimeError:
        return []


def node_rounds(schedule: Schedule, events: Mapping[str, Sequence[Mapping[str, Any]]],
                clock_of: Callable[[float], float] = float) -> list[dict[str, Any]]:
    """What each overlay node did in each round, from its events (`ResultsDB.record_node_rounds`'s rows).

    received_s: the global model reached the node (G: ``round_start``); train_start_s/train_end_s:
    its local training; sent_s: its update's last chunk left it (G: ``aggregated``). Times pass
    through `clock_of` (e.g. the run's clock); a node that logged nothing for a round has no row.
    """
    g, local = schedule.global_site, set(schedule.local_sites)
    names = {"received_s": ("round_start", "global_received"), "train_start_s": ("train_start", "train_start"),
             "train_end_s": ("train_end", "train_end"), "sent_s": ("aggregated", "update_sent")}
    rows: dict[tuple[str, int], dict[str, Any]] = {}
    for site, evs in events.items():
        role = "global" if site == g else "local" if site in local else "relay"
        want = {(at_g if site == g else elsewhere): col for col, (at_g, elsewhere) in names.items()}
        for e in evs:
            col = want.get(e.get("event", ""))
            r = e.get("round")
            if col is None or not isinstance(r, int) or "t" not in e:
                continue
            row = rows.setdefault((site, r), {"round": r, "site": site, "role": role})
            row.setdefault(col, clock_of(float(e["t"])))
    return sorted(rows.values(), key=lambda x: (x["round"], x["site"]))


def missing_events(
    schedule: Schedule, events: Mapping[str, Sequence[Mapping[str, Any]]], *, rounds: int
) -> list[str]:
    """What the timing logs lack: every local must log every per-round event of every round."""
    problems = []
    for site in schedule.local_sites:
        ev = events.get(site, [])
        for r in range(1, rounds + 1):
            skipped = any(e.get("event") == "skipped" and e.get("round") == r for e in ev)
            for name in REQUIRED_LOCAL_EVENTS:
                if skipped and name in ("train_start", "train_end"):
                    continue  # not selected this round: it relays and sends a skip, it does not train
                if not any(e.get("event") == name and e.get("round") == r for e in ev):
                    problems.append(f"{site}: no {name} in round {r}")
    for r in range(1, rounds + 1):
        for name in ("round_start", "aggregated", "round_complete"):
            if not any(e.get("event") == name and e.get("round") == r for e in events.get(schedule.global_site, [])):
                problems.append(f"{schedule.global_site} (G): no {name} in round {r}")
    return problems


# -- running ---------------------------------------------------------------------------------------
class TaskExecution:
    """One task's roles on the site servers of a `ComputeManager`, started and followed without
    blocking (the online mode runs many side by side; `run_task` runs one to the end).

    `start` ships the model if it is a file and sends one ``start`` per overlay node; `check` takes
    the servers' status replies and says whether every role has finished, raising if one failed,
    its server is gone, or the deadline passed; `stop` cancels and forgets the roles (idempotent);
    `result` summarizes the events.
    """

    def __init__(self, schedule: Schedule, *, manager: Any, options: FLOptions, log_dir: Path,
                 timing: TaskTiming | None = None, ready_timeout_s: float = 180.0, first_round: int = 1,
                 init_model: Path | None = None, checkpoint: bool = False, tolerate_lost: bool = False) -> None:
        from dataclasses import replace

        self.schedule = schedule
        self.manager = manager
        self.options = options
        self.log_dir = log_dir
        #: Rounds `first_round`..`options.rounds` (a moved task resumes; see `workers.rounds`).
        self.first_round = first_round
        self.init_model = init_model
        self.checkpoint = checkpoint
        #: A role other than G whose server is lost or which failed does not fail the task: the
        #: rounds go on without it (`lost_roles` says which, and why).
        self.tolerate_lost = tolerate_lost
        self.lost_roles: dict[str, str] = {}
        self._generation: dict[str, int] = {}
        nodes = schedule.overlay_nodes
        self.configs = {n: replace(c, first_round=first_round, fingerprints=checkpoint) for n, c in agent_configs(
            schedule, addresses={n: manager.address(n) for n in nodes}, options=options, timing=timing).items()}
        self.paths = {n: manager.events_file(log_dir, n) for n in nodes}
        g = schedule.global_site
        self.budget_s = ready_timeout_s + self.configs[g].global_timeout_s * (options.rounds - first_round + 2)
        self.started_t = 0.0
        self._started: list[str] = []

    def start(self) -> None:
        """Send every node's role to its site's server (the model shipped first if it is a file)."""
        from dataclasses import replace

        self.log_dir.mkdir(parents=True, exist_ok=True)
        nodes = self.schedule.overlay_nodes
        spec = self.manager.ship_model(self.options.model, nodes)
        dataset = self.manager.ship_model(self.configs[nodes[0]].dataset, nodes)  # a file: shipped like a model
        for p in self.paths.values():
            p.unlink(missing_ok=True)
        self.started_t = time.monotonic()
        g = self.schedule.global_site
        generation = getattr(self.manager, "generation", {})
        self._generation = {n: generation.get(n, 0) for n in nodes}
        selection = self.configs[g].selection
        if selection is not None and isinstance(selection.get("policy"), str):
            # a policy file travels to G's server by content, as a model file does
            selection = {**selection, "policy": self.manager.ship_model(selection["policy"], [g])}
        for n in nodes:
            extra: dict[str, Any] = {"checkpoint": self.checkpoint, "init_model": self.init_model} if n == g else {}
            cfg = replace(self.configs[n], model=spec, dataset=dataset)
            if n == g:
                cfg = replace(cfg, selection=selection)
            self.manager.start_role(n, cfg, self.paths[n], **extra)
            self._started.append(n)

    @property
    def checkpoint_file(self) -> Path:
        """Where G writes the global model after every round (with ``checkpoint``)."""
        return checkpoint_of(self.paths[self.schedule.global_site])

    def rounds_completed(self, events: Mapping[str, Sequence[Mapping[str, Any]]] | None = None) -> int:
        """The last round G completed (0 if none; `first_round` - 1 if none in this execution)."""
        evs = (self.events() if events is None else events).get(self.schedule.global_site, [])
        done = [int(e["round"]) for e in evs if e.get("event") == "round_complete" and isinstance(e.get("round"), int)]
        return max(done, default=self.first_round - 1)

    def check(self, statuses: Mapping[str, Mapping[str, Any]]) -> bool:
        """True once every role has finished with status 0 (`statuses`: `ComputeManager.poll`'s reply).

        Raises
        ------
        RuntimeError
            A role failed, or the server of one of the task's sites is gone.
        TimeoutError
            The task did not finish within its budget.
        """
        key = str(self.schedule.task_id)
        failed, running = {}, []
        g = self.schedule.global_site
        for n in self.schedule.overlay_nodes:
            if n in self.lost_roles:
                continue
            why = None
            if n in self.manager.lost:
                why = f"its site server is gone ({self.manager.lost[n]})"
            elif getattr(self.manager, "generation", {}).get(n, 0) != self._generation.get(n, 0):
                why = "its site server was restarted"
            else:
                role = statuses.get(n, {}).get("roles", {}).get(key)
                if role is None or role["state"] not in ("failed", "done"):
                    running.append(n)
                elif role["state"] == "failed":
                    why = role.get("error") or _last_words(self.paths[n])
            if why is not None and self.tolerate_lost and n != g:
                self.lost_roles[n] = why
            elif why is not None:
                failed[n] = why
        if failed:
            why = "; ".join(f"{n}: {w}" for n, w in failed.items())
            raise RuntimeError(f"task {self.schedule.task_id}: roles failed: {why}; logs in {self.log_dir}")
        if not running:
            return True
        if time.monotonic() > self.started_t + self.budget_s:
            raise TimeoutError(f"task {self.schedule.task_id}: the roles of {sorted(running)} did not finish "
                               f"in time; logs in {self.log_dir}")
        return False

    def stop(self) -> None:
        """Cancel any role still running and drop every role's record on its server."""
        for n in self._started:
            self.manager.stop_role(n, self.schedule.task_id)
        self._started.clear()

    def events(self) -> dict[str, list[dict[str, Any]]]:
        return {n: read_events(p) for n, p in self.paths.items()}

    def result(self, events: dict[str, list[dict[str, Any]]] | None = None) -> TaskResult:
        """The task's result from its events (`events`, when the caller has just read them)."""
        return _task_result(self.schedule, self.manager.name, self.options,
                            self.events() if events is None else events, self.log_dir, self.started_t,
                            first=self.first_round)


def run_task(
    schedule: Schedule,
    *,
    manager: Any,
    options: FLOptions,
    log_dir: Path,
    timing: TaskTiming | None = None,
    ready_timeout_s: float = 180.0,
) -> TaskResult:
    """Run the task's roles on the site servers of `manager` to completion and summarize; every
    role is stopped on every exit path.

    All roles start at once; they connect every overlay edge before G starts round 1.

    Raises
    ------
    ConfigError
        Bad schedule (see `agent_configs`), or a server refused a role.
    RuntimeError, TimeoutError
        A role failed or did not finish in time (the message names it and its log).
    """
    run = TaskExecution(schedule, manager=manager, options=options, log_dir=log_dir, timing=timing,
                        ready_timeout_s=ready_timeout_s)
    try:
        run.start()
        while not run.check(manager.poll(schedule.overlay_nodes)):
            time.sleep(0.05)  # poll interval of the roles' states, bounded by the task's budget
    finally:
        run.stop()
    return run.result()


def _last_words(events_path: Path) -> str:
    """The role's last error event (for one-line error messages)."""
    errors = [e for e in read_events(events_path) if e.get("event") == "error"]
    if errors:
        return str(errors[-1].get("detail", "error"))
    return f"no error logged (see {events_path})"


def _task_result(schedule: Schedule, backend: str, options: FLOptions,
                 events: Mapping[str, Sequence[Mapping[str, Any]]], log_dir: Path, launched: float,
                 first: int = 1) -> TaskResult:
    # The roles log on CLOCK_MONOTONIC, the clock `launched` was read on (one kernel, containers too).
    g_events = events.get(schedule.global_site, [])
    ready = [float(e["t"]) for evs in events.values() for e in evs if e.get("event") == "ready"]
    connected = [float(e["t"]) for e in g_events if e.get("event") == "connected"]
    first_ready = [e for e in g_events if e.get("event") == "ready"]
    first_round = [float(e["t"]) for e in g_events if e.get("event") == "round_start" and e.get("round") == first]
    done = [float(e["t"]) for e in g_events if e.get("event") == "done"]
    return TaskResult(
        task_id=schedule.task_id,
        backend=backend,
        scheduler=schedule.scheduler,
        rounds=tuple(summarize(schedule, events, rounds=options.rounds, first_round=first)),
        model_bytes=int(first_ready[0]["model_bytes"]) if first_ready else 0,
        log_dir=str(log_dir),
        rejected=tuple(dict(e) for evs in events.values() for e in evs if e.get("event") == "rejected"),
        agents_ready_s=max(0.0, max(ready) - launched) if ready else 0.0,
        connect_s=max(0.0, connected[0] - max(ready)) if connected and ready else 0.0,
        chunk_bytes=int(first_ready[0].get("chunk_bytes", 0)) if first_ready else 0,
        connections_lost=sum(1 for evs in events.values() for e in evs
                             if e.get("event") == "connection_lost" and e.get("direction") == "in"),
        started_t=launched,
        first_broadcast_t=first_round[0] if first_round else 0.0,
        finished_t=done[-1] if done else 0.0,
    )
