"""Run one FL task on a `Schedule`: agent configs, start/stop through a compute backend, results.

`agent_configs` turns a schedule into one `AgentConfig` per overlay node (pure; tested without any
network). `TaskExecution` sends every node's role at once to its site's server through the
computing manager (`orchestrator.runtime.compute`); the roles connect every overlay edge before G
starts round 1 (so no round includes a start-up or a connect), it follows them, and always stops
them; `run_task` runs one task to the end. What the roles' timing events measured is summarized
by `orchestrator.runtime.summaries`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from networkx.utils import UnionFind

from orchestrator.errors import ConfigError
from orchestrator.runtime.summaries import TaskResult, read_events, task_result
from orchestrator.runtime.timing import TaskTiming, subtree_heights
from orchestrator.scheduling.cost import RateFn
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


def _check_task(schedule: Schedule, addresses: Mapping[str, str], options: LearningSpec) -> None:
    """`agent_configs`' checks of its input (its Raises section), before any config is built."""
    try:
        options.check()
    except SpecError as e:
        raise ConfigError(f"task {schedule.task_id}: {e}") from None
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
    _check_task(schedule, addresses, options)
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


def pace_rates(schedule: Schedule, rate: RateFn) -> dict[str, dict[str, float]]:
    """Per overlay node, the rate each of its outbound copies is paced at
    (`workers.config.AgentConfig.pace_mbps`): its overlay edge's bottleneck link in `rate` (what the
    links carry in wall time, Mbit/s), by ``broadcast:<child>`` and ``upload:<parent>``. An edge
    without a link (both ends on one site) is not paced."""
    out: dict[str, dict[str, float]] = {}
    for e in schedule.edges:
        links = e.links()
        if links:
            out.setdefault(e.src, {})[f"{e.procedure}:{e.dst}"] = min(rate(u, v) for u, v in links)
    return out


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
        self.manager.stop_roles(list(self._started), self.schedule.task_id)
        self._started.clear()

    def events(self) -> dict[str, list[dict[str, Any]]]:
        return {n: read_events(p) for n, p in self.paths.items()}

    def result(self, events: dict[str, list[dict[str, Any]]] | None = None) -> TaskResult:
        """The task's result from its events (`events`, when the caller has just read them)."""
        return task_result(self.schedule, self.manager.name, self.events() if events is None else events,
                           rounds=self.options.rounds, log_dir=self.log_dir, launched=self.started_t,
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
