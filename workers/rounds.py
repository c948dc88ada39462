"""The round logic of one agent: a state machine fed by events, one chunk at a time.

Events come from the transport's threads (a checked chunk arrived, a connection was accepted,
connected or lost) through one queue; this module's `RoundEngine.run` consumes them on one thread
and decides. Per round r (see docs/architecture.md, "Data plane"):

- **Set-up, before round 1.** A node is *set up* when its outbound connections (to its broadcast
  children and its upload parent) are connected, its inbound ones (from its broadcast parent and
  its upload children) accepted, and every upload child said READY. It then says READY to its
  upload parent. G starts round 1 when it is set up, so no round opens a connection.
- **Broadcast, cut-through.** G sends GLOBAL(r) as chunks. A relay's reader forwards chunk k to each
  broadcast child as soon as chunk k arrived checked (same payload, its own header; `round_parts.CutThrough`)
  and copies it into its next model. With the last chunk it loads the model and, if it holds data, trains.
  Copies to children whose paths share a link (a *lane*, `AgentConfig.broadcast_lanes`) go one
  after another, each whole before the next starts (`Lanes`): the first child's subtree trains
  and uploads while the next copy crosses the link, instead of every copy ending together.
- **Upload, pipelined aggregation.** For every chunk k an aggregator keeps the example-weighted sum
  of what arrived for k (its own update once trained, each upload child's chunk k). As soon as every
  contributor of the round has delivered chunk k, it sends the mean of chunk k upward, with the
  summed example count, at once (G writes it into the new global model). A single contributor's
  chunk is passed on as it is.
- **Faults.** A child that has not delivered the chunk being waited for by the round's deadline is
  a straggler; a child whose connection breaks is lost. Both are left out of the rest of the round
  and logged. Because every chunk carries its own example count, leaving a contributor out part-way
  keeps every chunk an exact weighted mean of what it holds. A lost child stays *absent*: left out
  of every later round from its start (``child_absent``), not waited for, until it says READY again.
- **Selection.** With a selection policy (`workers.selection`), G names in GLOBAL chunk 0 the
  locals that train this round. An unselected local relays and aggregates for its subtree as
  always but neither trains nor adds an update (its own part of every chunk is empty, so a leaf
  sends UPDATE chunks without examples or tensors: a skip). Locals report their statistics up the
  tree in the header of READY and of an update's last chunk; G feeds them to the policy.
- **Resuming.** A role may start at round ``first_round`` > 1 (a task moved to new trees, or
  restarted so that a site rejoins): G starts from the global model file it is given
  (``init_model``, the old G's last checkpoint) and writes its global model after every round
  (``checkpoint_path``), so a move loses at most the round in flight.

Timing events (JSON lines, `workers.events`): connected, round_start (G), global_first,
forward_first, global_received, train_start, train_end, child_received, child_timeout, child_lost, child_absent,
connection_lost, connection_closed, update_first_sent, update_sent, aggregated, round_complete, rejected, stale, connect,
copy_sent (a lane's copy left whole: `round_parts.Lanes`),
own_excluded, stopped, error, done; with selection: selected (G), skipped (an unselected local).

(Over 400 lines: one state machine whose handlers share the round's state; split apart, each piece
would need all of it.)

What this module must not do: touch sockets or files (it calls `Sender.send` and the learner).
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from workers.aggregate import ChunkSum, fingerprint
from workers.compression import make_codec
from workers.compute import hold, modelled_s, ready_since
from workers.config import AgentConfig
from workers.events import EventLog, of_monotonic
from workers.framing import (
    FIXED_LEN,
    ChunkSpec,
    FrameError,
    Header,
    LazyFrame,
    TensorSet,
    chunk_view,
    encode_frame,
    parse_chunk,
)
from workers.round_parts import CutThrough, Forwards, Lanes, Learning, RoundState, Sender, SentCopy, both
from workers.selection import (
    LocalStats,
    SelectionError,
    check_meta,
    make_policy,
    parse_select,
    parse_stats,
    update_norm,
)
from workers.spec import DEFAULT_TOPK

SELF = ""  # the node's own contribution among a chunk's contributors


class RoundEngine:
    """One role of one task (see the module docstring). Transport threads call `post`."""

    def __init__(
        self,
        cfg: AgentConfig,
        learner: Learning,
        layout: Sequence[ChunkSpec],
        log: EventLog,
        *,
        broadcast_out: Mapping[str, Sender],
        upload_out: Sender | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.cfg = cfg
        self.learner = learner
        self.layout = tuple(layout)
        self.log = log
        self.broadcast_out = dict(broadcast_out)
        self.lanes = Lanes(cfg.broadcast_lanes, self.broadcast_out, self._copy_sent)
        self.finished_rounds: set[int] = set()
        self.cut_through = CutThrough(cfg.site, len(self.layout), list(self.broadcast_out), self.lanes, self.finished_rounds,
                                      lambda r, c, on_arrival: self._once("forward_first", r, c, out=self.broadcast_out[c],
                                                                         on_arrival=on_arrival),
                                      forwards=Forwards())  # training waits for them (`_train_and_add`)
        self.upload_out = upload_out
        self.clock = clock
        self.events: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._incoming = {k: v.clone() for k, v in learner.template.items()}
        self._next_global: dict[str, torch.Tensor] = {}
        self.rounds: dict[int, RoundState] = {}
        self._connected: set[tuple[str, str]] = set()
        self._ready_children: set[str] = set()
        #: Upload children whose connection broke, left out of new rounds until they say READY again.
        self.absent: set[str] = set()
        self.set_up = False
        self.t_started = clock()
        self.fatal: str | None = None
        #: Update compression (`workers.compression`; None: updates travel as the model's weights).
        self.codec = make_codec(cfg.compression, self.layout, k=cfg.k if cfg.k is not None else DEFAULT_TOPK)
        self._g_base: TensorSet = {}  # G: the global model of the round in flight
        #: G: the last broadcast's tensors; once every child has all of them, the next round
        #: aggregates into them (a fresh buffer costs page faults: ~9x a copy into a warm one).
        self._last_sent: SentCopy | None = None
        #: The copy of the trained model the last update was made of; once nothing reads it any
        #: more, the next round copies the model into it (`Learning.state`), not into fresh memory.
        self._own_sent: SentCopy | None = None
        #: Selection (`workers.selection`): None when off (no metadata sent, every local trains).
        self.measures = cfg.selection_measures
        self.policy = make_policy(cfg.selection) if cfg.is_global and cfg.selection is not None else None
        #: Locals' statistics: from the children's READY (forwarded up in this node's READY); at G,
        #: everything known of each local, and which upload child reported which locals.
        self.local_stats: dict[str, LocalStats] = {}
        self.subtree: dict[str, set[str]] = {}

    # -- from the transport's threads ----------------------------------------------------------------
    def post(self, *event: Any) -> None:
        self.events.put(event)

    def receive(self, kind: str, peer: str, header: Header, payload: bytearray, arrived: float | None = None) -> None:
        """A frame, on its reader thread: checked, a GLOBAL chunk forwarded (`CutThrough`), then to the loop."""
        tensors = self.check_frame(kind, peer, header, payload)
        if header.type == "GLOBAL":
            self.cut_through.take(header, payload, arrived)
        self.post("frame", kind, peer, header, payload, tensors, arrived)

    def check_frame(self, kind: str, peer: str, header: Header, payload: bytearray) -> TensorSet:
        """Validate a frame against what may come on this connection (reader thread; raises
        `FrameError`, after which the transport drops the connection)."""
        allowed = {"broadcast": ("GLOBAL", "STOP"), "upload": ("UPDATE", "READY")}[kind]
        if header.type not in allowed:
            raise FrameError("wrong_port", f"{header.type} frame on the {kind} connection of {peer}", header)
        if header.meta is not None:
            if self.measures is None:
                raise FrameError("bad_meta", f"{header.type} carries meta, this task selects no locals", header)
            try:
                check_meta(header.type, header.meta)
            except SelectionError as e:
                raise FrameError("bad_meta", str(e), header) from e
        if header.type in ("READY", "STOP"):
            if payload:
                raise FrameError("bad_payload", f"{header.type} carries no payload", header)
            return {}
        if not self.cfg.first_round <= header.round <= self.cfg.rounds:
            raise FrameError("bad_round", f"round {header.round} outside {self.cfg.first_round}..{self.cfg.rounds}",
                             header)
        if header.chunks != len(self.layout) or header.chunk >= len(self.layout):
            raise FrameError("bad_chunk", f"chunk {header.chunk} of {header.chunks}; this task's model has "
                             f"{len(self.layout)} chunks", header)
        if header.type == "UPDATE" and header.num_examples == 0:
            if payload:
                raise FrameError("bad_tensors", "an UPDATE chunk with no examples must carry no tensors", header)
            return {}
        if header.type == "UPDATE" and self.codec is not None:
            wire = parse_chunk(payload, self.codec.wire[header.chunk], header)
            return self.codec.decode(header.chunk, wire, header)
        return parse_chunk(payload, self.layout[header.chunk], header)

    # -- the loop ------------------------------------------------------------------------------------------
    def run(self) -> int:
        """Consume events until the last round is done; the exit status."""
        try:
            return self._loop()
        finally:
            self.lanes.drop()

    def _loop(self) -> int:
        idle_since = self.clock()
        while not self._finished():
            if self.fatal is not None:
                self.log.emit("error", detail=self.fatal)
                return 1
            now = self.clock()
            wait = self._next_deadline() - now
            if now - idle_since > self.cfg.global_timeout_s:
                self.log.emit("error", detail=f"no progress for {self.cfg.global_timeout_s:.0f} s")
                return 1
            try:
                event = self.events.get(timeout=max(0.0, min(wait, 1.0)))
            except queue.Empty:
                self._on_deadlines()
                continue
            idle_since = self.clock()
            getattr(self, "_on_" + event[0])(*event[1:])
            self._on_deadlines()
        return 0

    def _finished(self) -> bool:
        return self.cfg.rounds in self.finished_rounds

    def _next_deadline(self) -> float:
        pending = [r.deadline for r in self.rounds.values() if not r.late]
        return min(pending, default=self.clock() + 1.0)

    # -- set-up ------------------------------------------------------------------------------------------
    def _needed(self) -> set[tuple[str, str]]:
        need = {("out-broadcast", c.site) for c in self.cfg.broadcast_children}
        if self.cfg.upload_parent is not None:
            need.add(("out-upload", self.cfg.upload_parent.site))
        if self.cfg.expects_global and self.cfg.broadcast_parent is not None:
            need.add(("in-broadcast", self.cfg.broadcast_parent.site))
        need |= {("in-upload", c.site) for c in self.cfg.upload_children}
        return need

    def _on_cancel(self, reason: str) -> None:
        self.fatal = f"cancelled: {reason}"

    def _on_connected(self, peer: str, seconds: float, attempts: int, kind: str) -> None:
        self._connected.add((f"out-{kind}", peer))
        if kind == "broadcast":
            self.lanes.back(peer)
        self.log.emit("connect", peer=peer, port_kind=kind, connect_s=seconds, attempts=attempts)
        self._check_set_up()

    def _on_accepted(self, kind: str, peer: str) -> None:
        self._connected.add((f"in-{kind}", peer))
        self._check_set_up()

    def _check_set_up(self) -> None:
        if self.set_up or not self._needed() <= self._connected:
            return
        if self._ready_children != {c.site for c in self.cfg.upload_children}:
            return
        self.set_up = True
        self.log.emit("connected", setup_s=self.clock() - self.t_started, connections=len(self._needed()))
        if self.cfg.is_global:
            if self.cfg.init_model is not None:
                self.learner.load_file(self.cfg.init_model)
            self._start_round(self.cfg.first_round)
        elif self.upload_out is not None:
            meta = None
            if self.measures is not None:
                stats = dict(self.local_stats)
                if self.cfg.trains:
                    stats[self.cfg.site] = LocalStats(num_examples=self.learner.num_examples,
                                                      path_cost=float(self.cfg.path_cost))
                meta = {"stats": {s: v.to_json() for s, v in sorted(stats.items())}}
            self.upload_out.send(encode_frame(Header("READY", self.cfg.task, 0, self.cfg.site, meta=meta), b""),
                                 round=0)

    # -- frames ------------------------------------------------------------------------------------------
    def _on_frame(self, kind: str, peer: str, header: Header, payload: bytearray, tensors: TensorSet,
                  arrived: float | None = None) -> None:
        if header.type == "READY":
            self._ready_children.add(peer)
            if header.meta is not None and "stats" in header.meta:
                self._learn_stats(parse_stats(header.meta["stats"]), reporter=peer, ready=True)
            if peer in self.absent:
                self.absent.discard(peer)
                self.log.emit("child_rejoined", peer=peer)
            self._check_set_up()
        elif header.type == "STOP":
            self.log.emit("stopped", peer=peer)
            self.finished_rounds.add(self.cfg.rounds)
        elif header.round in self.finished_rounds:
            if header.chunk == 0:
                self.log.emit("stale", round=header.round, peer=peer, type=header.type)
        elif header.type == "GLOBAL":
            self._on_global(header, payload, tensors, arrived)
        else:
            self._on_update(peer, header, tensors, time.monotonic() if arrived is None else arrived)

    def _round(self, r: int) -> RoundState:
        st = self.rounds.get(r)
        if st is None:
            now = self.clock()
            st = RoundState(number=r, start=now, deadline=now + self.cfg.child_timeout_s,
                        chunks=[ChunkSum() for _ in self.layout],
                        child_next={c.site: 0 for c in self.cfg.upload_children})
            st.own_excluded = not self.cfg.trains
            st.own_done = not self.cfg.trains
            self.rounds[r] = st
            for child in sorted(self.absent & set(st.child_next)):
                self._exclude(st, child, "child_absent", "its connection broke in an earlier round")
        return st

    def _on_global(self, header: Header, payload: bytearray, tensors: TensorSet, arrived: float | None = None) -> None:
        r, k = header.round, header.chunk
        for older in [s for s in self.rounds.values() if s.number < r and not s.global_done]:
            self._give_up_own(older, "a later round's GLOBAL arrived")
        st = self._round(r)
        if st.global_done or k != st.global_next:
            self.log.emit("rejected", round=r, reason="bad_chunk", detail=f"GLOBAL chunk {k}, expected {st.global_next}")
            return
        st.global_next += 1
        st.received_bytes += FIXED_LEN + len(header.to_json()) + len(payload)
        if k == 0:
            self.log.emit("global_first", round=r)
            if header.meta is not None and "select" in header.meta:
                selected = self.cfg.site in parse_select(header.meta["select"])
                if self.cfg.trains and not selected and not st.own_done:
                    st.own_done = st.own_excluded = True
                    self.log.emit("skipped", round=r, detail="not selected")
                    self._finalize(st)  # a leaf sends its skip at once
        for p in self.layout[k].pieces:  # already forwarded, by the reader (`CutThrough`)
            p.view(self._incoming[p.base]).copy_(tensors[p.name])
        if k == len(self.layout) - 1:
            st.global_done = True  # held since its last chunk arrived (the kernel's stamp, else now)
            st.held_at = self.log.emit_at(None if arrived is None else of_monotonic(arrived), "global_received",
                                          round=r, nbytes=st.received_bytes)
            self.learner.load(self._incoming)
            if self.cfg.trains and not st.own_done:
                self._train_and_add(st)
            self._finalize(st)

    def _on_update(self, child: str, header: Header, tensors: TensorSet, arrived: float) -> None:
        r, k = header.round, header.chunk
        st = self._round(r)
        if child in st.excluded:
            return  # left out of this round already (logged when it was)
        if k != st.child_next.get(child, -1):
            self._exclude(st, child, "rejected", f"UPDATE chunk {k}, expected {st.child_next.get(child)}")
            self._finalize(st)
            return
        st.child_next[child] = k + 1
        st.chunks[k].add(child, tensors, header.num_examples)
        st.contributed(k, arrived)
        if k == len(self.layout) - 1:
            if header.meta is not None and "stats" in header.meta:
                st.stats.update(parse_stats(header.meta["stats"]))
            self.log.emit("child_received", round=r, child=child, num_examples=header.num_examples)
        self._finalize(st)

    # -- faults --------------------------------------------------------------------------------------
    def _on_lost(self, direction: str, peer: str, error: str, kind: str) -> None:
        """A connection broke (``in``: the peer's, to us; ``out``: ours, to the peer) on the `kind`
        port (``broadcast`` or ``upload``). A peer can be on two connections (a node's broadcast
        parent may be its upload child), so only the role of the connection that broke is affected.
        A peer that closes its connection after sending all it owes on it (its last round's
        chunks) has not been lost: that is logged as ``connection_closed``."""
        if direction == "in" and self._owes_nothing(peer, kind):
            self.log.emit("connection_closed", peer=peer, direction=direction, port_kind=kind, detail=error)
            return
        self.log.emit("connection_lost", peer=peer, direction=direction, port_kind=kind, detail=error)
        if direction == "out" and kind == "broadcast":
            self.lanes.lost(peer)
        if not self.set_up and direction == "out" and (f"out-{kind}", peer) not in self._connected:
            self.fatal = f"could not connect to {peer}: {error}"
            return
        if direction != "in":
            return
        if kind == "upload" and peer in {c.site for c in self.cfg.upload_children}:
            self.absent.add(peer)
        for st in list(self.rounds.values()):
            if kind == "upload" and peer in st.child_next and st.child_next[peer] < len(self.layout):
                self._exclude(st, peer, "child_lost", error)
                self._finalize(st)
            elif kind == "broadcast" and self.cfg.broadcast_parent is not None \
                    and peer == self.cfg.broadcast_parent.site and not st.global_done:
                self._give_up_own(st, f"broadcast parent {peer} lost: {error}")

    def _owes_nothing(self, peer: str, kind: str) -> bool:
        """Whether `peer` has sent everything it owes on its `kind` connection to this node."""
        last = self.cfg.rounds
        if last in self.finished_rounds:
            return True
        st = self.rounds.get(last)
        if st is None:
            return False
        if kind == "upload":
            return peer in {c.site for c in self.cfg.upload_children} and st.child_next.get(peer, 0) >= len(self.layout)
        parent = self.cfg.broadcast_parent
        return parent is not None and peer == parent.site and st.global_done

    def _copy_sent(self, r: int, child: str) -> None:
        """A lane's copy left whole (called from the sender thread; the event log is thread-safe)."""
        self.log.emit("copy_sent", round=r, peer=child)

    def _on_rejected(self, kind: str, peer_ip: str, reason: str, detail: str) -> None:
        self.log.emit("rejected", peer=peer_ip, port_kind=kind, reason=reason, detail=detail)

    def _exclude(self, st: RoundState, child: str, event: str, detail: str) -> None:
        st.excluded[child] = event
        self.log.emit(event, round=st.number, child=child, detail=detail,
                      chunks_received=st.child_next.get(child, 0))

    def _give_up_own(self, st: RoundState, why: str) -> None:
        if not st.own_done:
            st.own_done = st.own_excluded = True
            self.log.emit("own_excluded", round=st.number, detail=why)
        st.global_done = True
        self.cut_through.abandon(st.number)
        self._finalize(st)

    def _on_deadlines(self) -> None:
        now = self.clock()
        for st in list(self.rounds.values()):
            if not st.late and now >= st.deadline:
                st.late = True
                self.lanes.late(st.number)
                self._finalize(st)

    # -- learning and aggregation ---------------------------------------------------------------------
    def _train_and_add(self, st: RoundState) -> None:
        started = self.log.emit_at(st.held_at, "train_start", round=st.number)  # modelled from the arrival
        cfg = self.cfg  # the emulated site's training time (`workers.compute`): hold, or log an overrun
        modelled = modelled_s(cfg.train_s_per_example, self.learner.num_examples, cfg.local_epochs, train_s_per_round=
                              cfg.train_s_per_round, site_speed=cfg.site_speed, time_dilation=cfg.time_dilation)
        if modelled is not None and self.cut_through.forwards is not None:  # its time runs from `started`
            self.cut_through.forwards.wait(st.number, modelled)
        measures = self.measures or ()
        loss_before = self.learner.train_loss() if "loss" in measures else None
        start = self.learner.state() if "update_norm" in measures else None
        n = self.learner.train()
        spare = self._own_sent
        own = self.learner.state(spare.tensors if spare is not None and spare.free() else None)
        # free once its update has left whole (G: once the round's aggregate is made)
        st.own_copy = self._own_sent = SentCopy(own, 1)
        if self.measures is not None:
            st.stats[self.cfg.site] = LocalStats(
                num_examples=n, path_cost=float(self.cfg.path_cost), round=st.number,
                update_norm=None if start is None else update_norm(own, start),
                loss_before=loss_before, loss_after=self.learner.train_loss() if "loss" in measures else None)
        real = time.monotonic() - started
        own_at = ready_since(started, modelled, hold(started, modelled, emit=self.log.emit, round_=st.number))
        timing = {} if modelled is None else {"real_s": real, "modelled_s": modelled}
        self.log.emit("train_end", round=st.number, num_examples=n, **timing,
                      **({"fingerprint": fingerprint(own)} if self.cfg.fingerprints else {}))
        if self.codec is not None:  # updates carry the change over the round's global model
            own = self.codec.delta(own, self._g_base if self.cfg.is_global else self._incoming)
        for k in range(st.next_out, len(self.layout)):
            st.chunks[k].add(SELF, chunk_view(own, self.layout[k]), n)
            st.contributed(k, own_at)
        st.own_done = True

    def _contributors(self, st: RoundState) -> set[str]:
        who = {c for c in st.child_next if c not in st.excluded}
        if not st.own_excluded:
            who.add(SELF)
        return who

    def _finalize(self, st: RoundState) -> None:
        """Send (or, at G, keep) every chunk whose contributions are all in, in order."""
        while st.next_out < len(self.layout):
            k = st.next_out
            waiting = self._contributors(st) - st.chunks[k].have
            if waiting and st.late:
                for child in sorted(waiting - {SELF}):
                    self._exclude(st, child, "child_timeout", f"no chunk {k} within {self.cfg.child_timeout_s:.1f} s")
                if SELF in waiting and not st.global_done:
                    self._give_up_own(st, "no GLOBAL by the round's deadline")
                    return  # _give_up_own finalized
                waiting = self._contributors(st) - st.chunks[k].have
            if waiting:
                return
            self._emit_chunk(st, k)
            st.next_out += 1
        if st.number not in self.finished_rounds and (st.global_done or not self.cfg.expects_global):
            self._round_done(st)

    def _emit_chunk(self, st: RoundState, k: int) -> None:
        acc = st.chunks[k]
        st.chunks[k] = ChunkSum()  # free the sums
        n = acc.num_examples
        st.min_examples = n if st.min_examples is None else min(st.min_examples, n)
        st.max_examples = max(st.max_examples, n)
        mean = acc.mean()
        if self.cfg.is_global:
            for p in self.layout[k].pieces:
                into, base = p.view(self._next_global[p.base]), p.view(self._g_base[p.base])
                if mean is None:
                    into.copy_(base)  # nothing with examples arrived: the chunk stays as it was
                elif self.codec is not None and into.is_floating_point():
                    torch.add(base, mean[p.name].to(into.dtype), out=into)  # the mean change over the global
                else:
                    into.copy_(mean[p.name])
            return
        assert self.upload_out is not None
        last = k == len(self.layout) - 1
        meta = None
        if last and self.measures is not None and st.stats:
            meta = {"stats": {s: v.to_json() for s, v in sorted(st.stats.items())}}
        header = Header("UPDATE", self.cfg.task, st.number, self.cfg.site, num_examples=n,
                        chunk=k, chunks=len(self.layout), meta=meta)
        payload = mean if self.codec is None or mean is None else self.codec.compress(k, mean)
        frame = LazyFrame(header, payload)  # hashed by the sender thread, right before it writes
        st.sent_bytes += frame.nbytes
        if last:  # the update has left whole: its copy of the trained model may be written again
            on_sent = both(self._once("update_sent", st.number, None, num_examples=n, nbytes=st.sent_bytes),
                            st.own_copy.one_done if st.own_copy is not None else None)
        else:
            on_sent = self._once("update_first_sent", st.number, None) if k == 0 else None
        # ready when its last contribution was; a round that left a child out waited for it until now
        self.upload_out.send(frame, round=st.number, on_sent=on_sent, last=last,
                             ready_at=None if st.excluded else st.ready.get(k))
        if last:
            self.log.emit("aggregated", round=st.number, num_examples=n, stragglers=sorted(st.excluded),
                          nbytes=st.sent_bytes)

    def _once(self, event: str, r: int, peer: str | None, *, out: Sender | None = None, **extra: Any) -> Callable[[], None]:
        """Log `event` once called; at when `out`'s frame started on its link if it says (a copy's flight)."""
        def emit() -> None:
            at = None if out is None or out.started_at is None else of_monotonic(out.started_at)
            self.log.emit_at(at, event, round=r, **({"peer": peer} if peer else {}), **extra)

        return emit

    # -- selection ------------------------------------------------------------------------------------------
    def _learn_stats(self, stats: Mapping[str, LocalStats], *, reporter: str, ready: bool) -> None:
        """Keep what a child reported (READY: example counts and path costs of its subtree's locals;
        at G also an update's measurements). A READY keeps the measurements G had of a local."""
        if self.cfg.is_global and ready:
            self.subtree[reporter] = set(stats)
        for site, new in stats.items():
            old = self.local_stats.get(site)
            if ready and old is not None:
                new = replace(old, num_examples=new.num_examples, path_cost=new.path_cost)
            self.local_stats[site] = new

    def _choose(self, r: int) -> list[str] | None:
        """G: the locals that train in round `r` (None: no selection). Locals under an absent
        upload child are no candidates."""
        if self.policy is None:
            return None
        gone: set[str] = set()
        for child in self.absent:
            gone |= self.subtree.get(child, set())
        candidates = {s: v for s, v in self.local_stats.items() if s not in gone}
        chosen = self.policy.select(r, candidates)
        if not isinstance(chosen, list | tuple) or not set(chosen) <= set(candidates) \
                or (candidates and not chosen):
            raise SelectionError(f"selection policy {type(self.policy).__name__} returned {chosen!r} for round {r}: "
                                 f"it must choose a non-empty subset of {sorted(candidates)}")
        chosen = sorted(set(chosen))
        self.log.emit("selected", round=r, policy=self.policy.name or type(self.policy).__name__,
                      sites=chosen, candidates=len(candidates))
        return chosen

    # -- rounds at G ------------------------------------------------------------------------------------
    def _start_round(self, r: int) -> None:
        st = self._round(r)
        st.start = self.log.emit("round_start", round=r)
        st.deadline = st.start + self.cfg.child_timeout_s
        st.global_done = True
        # a later round broadcasts the last round's aggregate as it is (a copy the model does not
        # own): no second copy of the model on the round's critical path
        state = self._next_global or self.learner.state()
        self._g_base = state
        # filled chunk by chunk as aggregates complete (`_emit_chunk`): the last round's broadcast
        # buffer when every child has it, a fresh one while a sender may still read it
        spare, self._last_sent = self._last_sent, SentCopy(state, len(self.broadcast_out))
        self._next_global = (spare.tensors if spare is not None and spare.free()
                             else {k: torch.empty_like(v) for k, v in state.items()})
        chosen = self._choose(r)
        if chosen is not None and self.cfg.trains and self.cfg.site not in chosen:
            st.own_done = st.own_excluded = True
            self.log.emit("skipped", round=r, detail="not selected")
        for k, spec in enumerate(self.layout):
            meta = {"select": chosen} if chosen is not None and k == 0 else None
            frame = LazyFrame(Header("GLOBAL", self.cfg.task, r, self.cfg.site, chunk=k, chunks=len(self.layout),
                                     meta=meta), chunk_view(state, spec))
            last = k == len(self.layout) - 1
            for child in sorted(self.broadcast_out):
                first = self._once("forward_first", r, child, out=self.broadcast_out[child]) if k == 0 else None
                self.lanes.send(child, frame, r, both(first, self._last_sent.one_done if last else None), last)
        if self.cfg.trains and not st.own_done:
            self._train_and_add(st)
        self._finalize(st)

    def _round_done(self, st: RoundState) -> None:
        self.finished_rounds.add(st.number)
        del self.rounds[st.number]
        if not self.cfg.is_global:
            return
        if st.own_copy is not None:
            st.own_copy.one_done()
        if st.stats:
            self._learn_stats(st.stats, reporter="", ready=False)
        t_agg = self.log.emit_at(of_monotonic(max(st.ready.values())) if st.ready and not st.excluded else None,
                                 "aggregated", round=st.number, num_examples=st.max_examples,  # the last chunk in
                                 num_updates=len(self._contributors(st)), stragglers=sorted(st.excluded))
        self.learner.load(self._next_global)
        if self.cfg.checkpoint_path is not None:
            self.learner.save_file(self.cfg.checkpoint_path)
        accuracy, loss = self.learner.evaluate()
        self.log.emit("round_complete", round=st.number, latency_s=t_agg - st.start, accuracy=accuracy, loss=loss,
                      num_examples=st.max_examples, min_chunk_examples=st.min_examples or 0,
                      stragglers=sorted(st.excluded),
                      **({"fingerprint": fingerprint(self._next_global)} if self.cfg.fingerprints else {}))
        if st.number < self.cfg.rounds:
            self._start_round(st.number + 1)
