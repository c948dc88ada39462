"""What a task's rounds measured, from its roles' JSON-lines timing events: `RoundResult`,
`TaskResult` and the readers that build them.

Pure functions of a schedule and the events (no network, no process): the emulated run, the
simulation and the live views (`rounds_so_far`, `node_rounds`) all summarize through them, so a
figure is computed once (docs/metrics.md, "Definitions of the measured quantities"):

- ``latency_s``: G's round start to G holding the aggregate;
- the breakdown follows the round's critical path, the local model whose training ended last:
  ``broadcast_s`` from the round start to its GLOBAL arriving, ``train_s`` from then to its
  training's end (forwarding to its children included), ``upload_s`` from then to G holding the
  aggregate (upload and in-path aggregation). The three add up to the latency.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator.scheduling.schedule import Schedule


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
    #: The kernel's TCP data bytes sent and retransmitted over the task's connections (`tcp_bytes`);
    #: None: not measured.
    sent_bytes: int | None = None
    retrans_bytes: int | None = None

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


class _RoundEvents:
    """Every agent's events indexed for `summarize`, in one pass: (site, event, round) -> the first
    such event, and each round's children left out (`LEFT_OUT`)."""

    def __init__(self, schedule: Schedule, events: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        self.schedule = schedule
        self.first: dict[tuple[str, str, int], Mapping[str, Any]] = {}
        self.left_out_by_round: dict[int, set[str]] = {}
        for site, evs in events.items():
            for e in evs:
                if "round" not in e:
                    continue
                self.first.setdefault((site, e["event"], e["round"]), e)
                # a child left out for an out-of-order chunk logs "rejected" with the child's name
                if e["event"] in LEFT_OUT and "child" in e:
                    self.left_out_by_round.setdefault(e["round"], set()).add(f"{e['child']}{LEFT_OUT[e['event']]}")
        self.sites = tuple(events)

    def total_bytes(self, name: str, r: int) -> int:
        return sum(int(e.get("nbytes", 0)) for s in self.sites if (e := self.first.get((s, name, r))) is not None)

    def times(self, name: str, r: int) -> dict[str, float]:
        """Site -> time of its `name` event in round `r`, over the local sites that logged one."""
        return {s: float(e["t"]) for s in self.schedule.local_sites
                if (e := self.first.get((s, name, r))) is not None}


def _round_result(ev: _RoundEvents, r: int) -> RoundResult:
    """Round `r`'s result (see the module docstring); RuntimeError if G did not complete it."""
    g = ev.schedule.global_site
    start, done, agg = (ev.first.get((g, name, r)) for name in ("round_start", "round_complete", "aggregated"))
    if start is None or done is None or agg is None:
        raise RuntimeError(f"G ({g}) did not complete round {r}")
    t0, t_agg = float(start["t"]), float(agg["t"])
    latency = t_agg - t0
    received, trained, began = ev.times("global_received", r), ev.times("train_end", r), ev.times("train_start", r)
    # Critical path: the local model whose training ended last (among those that logged both).
    crit_site = max((s for s in trained if s in received), key=trained.__getitem__, default=None)
    crit = None if crit_site is None else (received[crit_site], trained[crit_site])
    spans = [trained[s] - began[s] for s in trained if s in began]
    if crit is None:
        broadcast = train = 0.0
    else:
        broadcast = min(max(0.0, crit[0] - t0), latency)
        train = min(max(0.0, crit[1] - crit[0]), latency - broadcast)
    return RoundResult(
        round=r,
        latency_s=latency,
        broadcast_s=broadcast,
        train_s=train,
        upload_s=latency - broadcast - train,
        accuracy=float(done["accuracy"]),
        loss=float(done["loss"]),
        num_examples=int(done["num_examples"]),
        stragglers=tuple(sorted(ev.left_out_by_round.get(r, ()))),
        broadcast_all_s=max(received.values()) - t0 if received else 0.0,
        upload_tail_s=t_agg - max(trained.values()) if trained else 0.0,
        train_min_s=min(spans) if spans else 0.0,
        broadcast_bytes=ev.total_bytes("global_received", r),
        upload_bytes=ev.total_bytes("update_sent", r),
        selected=tuple((ev.first.get((g, "selected", r)) or {}).get("sites", ())),
        trained=len(trained),
    )


def summarize(
    schedule: Schedule, events: Mapping[str, Sequence[Mapping[str, Any]]], *, rounds: int, first_round: int = 1
) -> list[RoundResult]:
    """Per-round results (rounds `first_round`..`rounds`) from every agent's events (see the module docstring).

    Raises
    ------
    RuntimeError
        If G did not complete every round.
    """
    indexed = _RoundEvents(schedule, events)
    return [_round_result(indexed, r) for r in range(first_round, rounds + 1)]


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


def tcp_bytes(events: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[int | None, int | None]:
    """(sent, retransmitted) TCP data bytes summed over the roles' ``tcp`` events (one per outbound
    connection, `workers.agent`), retransmissions included in sent. A connection never opened sent
    nothing and is skipped; None when no connection was measured, or one that was opened has no
    figure (a kernel without them): a partial sum is not a measurement of the task."""
    sent = retrans = 0
    measured = False
    for evs in events.values():
        for e in evs:
            if e.get("event") != "tcp" or not e.get("connections"):
                continue
            s, r = e.get("sent_bytes"), e.get("retrans_bytes")
            if s is None or r is None:
                return None, None
            sent, retrans, measured = sent + int(s), retrans + int(r), True
    return (sent, retrans) if measured else (None, None)


def task_result(schedule: Schedule, backend: str, events: Mapping[str, Sequence[Mapping[str, Any]]], *,
                rounds: int, log_dir: Path, launched: float, first: int = 1) -> TaskResult:
    """A task's result from its roles' events: rounds `first`..`rounds` summarized, and its start-up
    times measured from `launched` (when the roles were sent to the servers)."""
    # The roles log on CLOCK_MONOTONIC, the clock `launched` was read on (one kernel, containers too).
    g_events = events.get(schedule.global_site, [])
    ready = [float(e["t"]) for evs in events.values() for e in evs if e.get("event") == "ready"]
    connected = [float(e["t"]) for e in g_events if e.get("event") == "connected"]
    first_ready = [e for e in g_events if e.get("event") == "ready"]
    first_round = [float(e["t"]) for e in g_events if e.get("event") == "round_start" and e.get("round") == first]
    done = [float(e["t"]) for e in g_events if e.get("event") == "done"]
    sent, retrans = tcp_bytes(events)
    return TaskResult(
        task_id=schedule.task_id,
        backend=backend,
        scheduler=schedule.scheduler,
        rounds=tuple(summarize(schedule, events, rounds=rounds, first_round=first)),
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
        sent_bytes=sent,
        retrans_bytes=retrans,
    )
