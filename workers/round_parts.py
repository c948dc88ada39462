"""The pieces the round engine (`workers.rounds.RoundEngine`) is built of: what it sends through and
learns with (`Sender`, `Learning`), the copies of a trained model still being sent (`SentCopy`), the
broadcast lanes that send a relay's children one after another (`Lanes`), a relay's forward of the
broadcast on the thread that took each chunk in (`CutThrough`), the copies it still forwards
(`Forwards`), and one round's state (`RoundState`).
No sockets; torch only for the tensors' types.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch

from workers.aggregate import ChunkSum
from workers.framing import Buffer, Header, TensorSet, reheader
from workers.selection import LocalStats


class Sender(Protocol):
    """An outbound connection (`workers.transport.Outbound`)."""

    def send(self, pieces: Sequence[Buffer], *, round: int, on_sent: Callable[[], None] | None = None,
             drain: bool = False, last: bool = False, ready_at: float | None = None) -> None: ...

    @property
    def paced_until(self) -> float | None:
        """When its link finishes serializing what was sent on it, by its pacing schedule (the
        clock's time); None where it is not paced."""
        ...

    @property
    def started_at(self) -> float | None:
        """When the frame whose ``on_sent`` runs now started on its link (`time.monotonic`; paced: by
        its pacing schedule); None where the sender cannot say. Read from ``on_sent`` only."""
        ...


class Learning(Protocol):
    """What the engine needs of `workers.learning.Learner`."""

    @property
    def template(self) -> Mapping[str, torch.Tensor]: ...

    @property
    def num_examples(self) -> int: ...

    def train_loss(self) -> float: ...

    def train(self) -> int: ...

    def evaluate(self) -> tuple[float, float]: ...

    def state(self, into: TensorSet | None = None) -> TensorSet: ...

    def load(self, tensors: TensorSet) -> None: ...

    def load_file(self, path: str) -> None: ...

    def save_file(self, path: str) -> None: ...


class SentCopy:
    """A tensor set being sent, and how many sends of all of it are still to finish (sender
    threads count down as each copy's last chunk leaves; a dropped send never does, so the set is
    then never reused)."""

    def __init__(self, tensors: TensorSet, children: int) -> None:
        self.tensors = tensors
        self._left = children
        self._lock = threading.Lock()

    def one_done(self) -> None:
        with self._lock:
            self._left -= 1

    def free(self) -> bool:
        with self._lock:
            return self._left <= 0


def both(a: Callable[[], None] | None, b: Callable[[], None] | None) -> Callable[[], None] | None:
    if a is None or b is None:
        return a or b

    def run() -> None:
        a()
        b()

    return run


class Lanes:
    """Copies of GLOBAL to the broadcast children of one lane (`AgentConfig.broadcast_lanes`: their
    paths share a link) go one after another: a child's frames wait here until the copy before it
    in the lane has left whole or its connection is lost. Each copy's last chunk is sent with
    ``drain`` (`workers.transport.Outbound`): a paced copy has left whole once its socket sent its
    last segment, written when the emulated link would have finished serializing it; an unpaced
    one once its child acknowledged its last byte, since written to the kernel is not enough: the
    socket's buffer and the links' queues still hold its tail, and the next copy would share the
    link with it. The sender thread moves the lane on at once, whatever the engine thread is doing,
    e.g. training. Children in no lane are sent to at once.

    A lane starts over with each round. Copies still waiting when a new round starts, or when the
    role ends, never started: they are dropped (their child gives that round up anyway), so no
    connection carries a stale model and a connection's frames keep their order. When the round
    passes its deadline at this node (a child hangs without its connection breaking), everything
    waiting goes out at once.

    `on_copy_sent(round, child)` is called from the sender thread. Thread-safe."""

    def __init__(self, lanes: Sequence[Sequence[str]], outs: Mapping[str, Sender],
                 on_copy_sent: Callable[[int, str], None]) -> None:
        self.lanes = [tuple(lane) for lane in lanes]
        self.lane_of = {c: i for i, lane in enumerate(self.lanes) for c in lane}
        self.outs = outs
        self.on_copy_sent = on_copy_sent
        self.round = 0
        self.pos = [0] * len(self.lanes)  # per lane: the child whose copy goes now
        #: Per child, its frames waiting for its turn: (frame, round, on_sent, last, ready_at).
        self.held: dict[str, list[tuple[Sequence[Buffer], int, Callable[[], None] | None, bool, float | None]]] = {
            c: [] for c in self.lane_of}
        #: Children whose connection broke and has not come back: never waited for.
        self.down: set[str] = set()
        #: Held frames dropped so far (copies of a round that ended before their turn).
        self.dropped = 0
        self._lock = threading.RLock()  # reentrant: a sender may run `on_sent` inline

    def send(self, child: str, frame: Sequence[Buffer], r: int, on_sent: Callable[[], None] | None,
             last: bool, ready_at: float | None = None) -> None:
        """Send `frame` to `child` now, or hold it for its turn in its lane. `ready_at`: when it was
        ready (`Sender.send`; a relay's chunk: when it arrived); a held frame goes no earlier than
        that nor than the lane's link finished the copy before it (`sent`)."""
        lane = self.lane_of.get(child)
        if lane is None:
            self.outs[child].send(frame, round=r, on_sent=on_sent, last=last, ready_at=ready_at)
            return
        with self._lock:
            if r > self.round:
                self._open(r)
            if r < self.round or self.lanes[lane].index(child) < self.pos[lane]:
                self.outs[child].send(frame, round=r, on_sent=on_sent, last=last, ready_at=ready_at)
                return
            if last:  # the copy has left whole once `drain` says so (`Outbound.send`): the link is free
                on_sent = both(on_sent, lambda: self.sent(r, child))
            if self.lanes[lane][self.pos[lane]] == child:
                self.outs[child].send(frame, round=r, on_sent=on_sent, drain=last, last=last, ready_at=ready_at)
            else:
                self.held[child].append((frame, r, on_sent, last, ready_at))

    def sent(self, r: int, child: str) -> None:
        """`child`'s copy of round `r` left whole: the next child of its lane goes, ready when the
        link finished that copy by its schedule (paced: the drain's own wait is not the link's)."""
        self.on_copy_sent(r, child)
        with self._lock:
            lane = self.lane_of[child]
            if r == self.round and self._current(lane) == child:
                self._advance(lane, after=self.outs[child].paced_until)

    def lost(self, child: str) -> None:
        """`child`'s connection broke: its copy will not leave whole; the lane goes on without it."""
        if child not in self.lane_of:
            return
        with self._lock:
            self.down.add(child)
            lane = self.lane_of[child]
            if self._current(lane) == child:
                self._advance(lane)

    def back(self, child: str) -> None:
        with self._lock:
            self.down.discard(child)

    def late(self, r: int) -> None:
        """Round `r` passed its deadline here: what waits of it goes out at once."""
        with self._lock:
            if r != self.round:
                return
            for lane in range(len(self.lanes)):
                self.pos[lane] = len(self.lanes[lane])
                for child in self.lanes[lane]:
                    self._flush(child)

    def drop(self) -> None:
        """Drop every copy that still waits (a new round starts, or the role ends)."""
        with self._lock:
            for lane in range(len(self.lanes)):
                self.pos[lane] = len(self.lanes[lane])
            for held in self.held.values():
                self.dropped += len(held)
                held.clear()

    def _current(self, lane: int) -> str | None:
        return self.lanes[lane][self.pos[lane]] if self.pos[lane] < len(self.lanes[lane]) else None

    def _open(self, r: int) -> None:
        self.drop()
        self.round = r
        for lane in range(len(self.lanes)):
            self.pos[lane] = -1
            self._advance(lane)

    def _advance(self, lane: int, after: float | None = None) -> None:
        while True:
            self.pos[lane] += 1
            child = self._current(lane)
            if child is None:
                return
            self._flush(child, after)
            if child not in self.down:
                return

    def _flush(self, child: str, after: float | None = None) -> None:
        """Send what waits for `child`, each frame ready no earlier than `after` (the lane's link free
        again, by its schedule) nor than it was itself; with no `after` (a child lost, a round past
        its deadline), ready now."""
        held, self.held[child] = self.held[child], []
        for frame, r, on_sent, last, ready_at in held:
            ready = None if after is None else after if ready_at is None else max(after, ready_at)
            self.outs[child].send(frame, round=r, on_sent=on_sent, drain=last, last=last, ready_at=ready)


#: The most of its modelled time a relay's training waits for the copies it forwards (`Forwards`).
FORWARD_WAIT_SHARE = 0.25


class Forwards:
    """The copies of each round's GLOBAL a relay is still forwarding: a copy counts from its last
    chunk being handed to its child's sender (`CutThrough`) until that chunk was written, paced, when
    the emulated link would have finished serializing it (`sending` gives the callback).

    The relay's training waits for them (`RoundEngine`): a site server's threads share one GIL, and
    a training thread (SCHED_IDLE, `workers.priority`) that holds it while the kernel runs other
    sites' threads keeps the sender of the copy's last segments from running. Waiting costs the
    emulated timeline nothing where training is modelled: its time runs from the copy's arrival
    either way (docs/data-plane.md, "Training after the forward"). Thread-safe."""

    def __init__(self) -> None:
        self._left: dict[int, set[str]] = {}
        self._cond = threading.Condition()

    def sending(self, r: int, child: str) -> Callable[[], None]:
        """Count `child`'s copy of round `r` as being forwarded; the callback to run once it was."""
        with self._cond:
            self._left.setdefault(r, set()).add(child)

        def done() -> None:
            with self._cond:
                left = self._left.get(r)
                if left is not None:
                    left.discard(child)
                    if not left:
                        del self._left[r]
                        self._cond.notify_all()
        return done

    def wait(self, r: int, modelled_s: float) -> bool:
        """Wait until every copy of round `r` was forwarded, at most `FORWARD_WAIT_SHARE` of the
        training's modelled time `modelled_s`; whether they were. Copies of earlier rounds still
        counted (a child lost mid-copy) are forgotten."""
        with self._cond:
            for old in [n for n in self._left if n < r]:
                del self._left[old]
            return self._cond.wait_for(lambda: r not in self._left, max(0.0, FORWARD_WAIT_SHARE * modelled_s))


class CutThrough:
    """A relay's forward of the broadcast, on the reader thread that took each GLOBAL chunk in and
    checked it: the chunk goes to every broadcast child (`Lanes`) at once, with the relay's own
    header and the payload as received, ready when the kernel received it (`arrived`,
    `workers.transport.read_frame_at`), before the round loop takes it in.

    Forwarded from the round loop, every chunk waited for the loop's wake-up, and on a paced link
    each frame's schedule started when the relay's threads got to it: a copy's last chunk, one or
    two segments, could not make that time up on its link, and a deep tree paid it at every relay
    (docs/data-plane.md, "A relay's chunk, ready when it arrived"). Ready at its arrival, what the
    relay's reader, checks and sender add is made up on its link out of htb's burst; what the
    emulated links added before it arrived (their rate, a shared link, background) is not.

    A chunk is forwarded as the round loop accepts it (`RoundEngine._on_global`), on the same ordered
    stream: the next of its round (chunk 0 first, each once), in a round not finished here, not given
    up (`abandon`) and not older than a round already begun. `on_first(round, child, on_arrival)`
    gives the callback run once a copy's first chunk is written (``forward_first``, saying whether
    it went ready at its arrival); `forwards` counts each copy until its last chunk was. Thread-safe."""

    def __init__(self, site: str, chunks: int, children: Sequence[str], lanes: Lanes, finished: Container[int],
                 on_first: Callable[[int, str, bool], Callable[[], None]], forwards: Forwards | None = None) -> None:
        self.site, self.chunks, self.children = site, chunks, sorted(children)
        self.lanes, self.finished, self.on_first = lanes, finished, on_first
        #: Where each copy's last chunk is counted until it was written (None: not counted).
        self.forwards = forwards
        #: The latest round begun, and its next chunk to forward (`chunks`: all of it was, or given up).
        self.latest, self.next = 0, 0
        #: Rounds given up here (`abandon`), begun or not.
        self.given_up: set[int] = set()
        self._lock = threading.Lock()  # a reconnect's reader may overlap the old one's last frame

    def take(self, header: Header, payload: bytearray, arrived: float | None = None) -> bool:
        """Forward GLOBAL chunk `header.chunk` of `header.round` if the loop accepts it (see the
        class docstring), ready at `arrived` (None: now); whether it was."""
        r, k = header.round, header.chunk
        with self._lock:
            if r > self.latest:
                self.latest, self.next = r, 0
            if (not self.children or r in self.finished or r in self.given_up or r < self.latest or k != self.next
                    or k >= self.chunks):
                return False
            self.next = k + 1
            forwarded: list[Buffer] = [reheader(header, sender=self.site), memoryview(payload)]
            last = k == self.chunks - 1
            for child in self.children:
                first = self.on_first(r, child, arrived is not None) if k == 0 else None
                if last and self.forwards is not None:
                    first = both(first, self.forwards.sending(r, child))
                self.lanes.send(child, forwarded, r, first, last, ready_at=arrived)
        return True

    def abandon(self, r: int) -> None:
        """Round `r` was given up here (`RoundEngine._give_up_own`), begun or not: none of it goes on."""
        with self._lock:
            self.given_up.add(r)


@dataclass
class RoundState:
    number: int
    start: float
    deadline: float
    chunks: list[ChunkSum]
    excluded: dict[str, str] = field(default_factory=dict)  # child -> why
    child_next: dict[str, int] = field(default_factory=dict)
    global_next: int = 0
    global_done: bool = False
    own_done: bool = False
    own_excluded: bool = False
    late: bool = False
    next_out: int = 0
    min_examples: int | None = None
    max_examples: int = 0
    #: Frame bytes (fixed and JSON headers included) of this round's UPDATE sent / GLOBAL received.
    sent_bytes: int = 0
    received_bytes: int = 0
    #: When this node held the whole GLOBAL (the event clock's; None: not yet).
    held_at: float | None = None
    #: Per chunk: when its latest contribution was there (CLOCK_MONOTONIC: a child's chunk when the
    #: kernel received it, the own one at the training's modelled end), the aggregate's ``ready_at``.
    ready: dict[int, float] = field(default_factory=dict)
    #: The copy of the trained model this round's update is made of (when this node trained).
    own_copy: SentCopy | None = None
    #: Selection: the statistics of the locals heard from this round (own and the children's).
    stats: dict[str, LocalStats] = field(default_factory=dict)

    def contributed(self, k: int, at: float) -> None:
        """Chunk `k` got a contribution, there at `at` (CLOCK_MONOTONIC): `ready` keeps the latest."""
        self.ready[k] = max(self.ready.get(k, at), at)
