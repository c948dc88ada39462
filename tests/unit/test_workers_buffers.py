"""Model buffers across rounds. G: the aggregate of a round is broadcast as it is in the next round
(no second copy), and a round aggregates into the buffer the last round broadcast only once every
child has all of it. A local: its trained model is copied into the copy its last update left from,
once all of that update has left. The result stays the exact FedAvg. Also the worker process's
allocator tuning, the learner's copy into given tensors, and when a copy's ``forward_first`` is
logged."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Sequence
from typing import ClassVar

import pytest
import torch

from orchestrator.runtime.task_runner import FLOptions, agent_configs
from orchestrator.scheduling.schedule import Schedule
from tests.unit.test_workers_selection import Recording, Wire, run_connected
from workers.aggregate import aggregate_tensors
from workers.events import EventLog, of_monotonic
from workers.framing import Buffer, Header, chunk_layout
from workers.learning import Learner, keep_freed_memory
from workers.round_parts import RoundState
from workers.rounds import RoundEngine


class Watched(RoundEngine):
    """Records, at each round start, where the round's broadcast and its aggregate live."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.buffers: list[tuple[int, int]] = []  # (broadcast's first tensor, aggregate's first tensor)

    def _start_round(self, r: int) -> None:
        super()._start_round(r)
        name = next(iter(self._g_base))
        self.buffers.append((self._g_base[name].data_ptr(), self._next_global[name].data_ptr()))


class WatchedLocal(RoundEngine):
    """Keeps, per round, the copy of the trained model its update is made of (held, so that no
    freed memory can come back at the same address)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.own: list[dict[str, torch.Tensor]] = []

    def _train_and_add(self, st: RoundState) -> None:
        super()._train_and_add(st)
        assert st.own_copy is not None
        self.own.append(st.own_copy.tensors)

    def places(self) -> set[int]:
        return {next(iter(own.values())).data_ptr() for own in self.own}


class Holding(Wire):
    """An edge whose sender never reports a frame as sent and keeps its pieces, as a sender's queue
    does while a child is still being fed (so no freed buffer's address can come back)."""

    held: ClassVar[list[Sequence[Buffer]]] = []

    paced_until: float | None = None  # not paced
    started_at: float | None = None  # not said: `forward_first` is logged when written

    def send(self, pieces: Sequence[Buffer], *, round: int, on_sent: Callable[[], None] | None = None,
             last: bool = False, ready_at: float | None = None) -> None:
        self.held.append(pieces)
        super().send(pieces, round=round, on_sent=None)


def _run(rounds: int, edge: type[Wire], up: type[Wire] = Wire) -> tuple[Watched, dict[str, Recording],
                                                                       dict[str, RoundEngine]]:
    sched = Schedule(task_id=3, scheduler="hand", global_site="G", local_sites=("L1", "L2"), demand_mbps=1.0,
                     broadcast_parent={"L1": "G", "L2": "G"}, upload_parent={"L1": "G", "L2": "G"})
    addrs = {n: f"127.0.0.{i + 1}" for i, n in enumerate(sched.overlay_nodes)}
    cfgs = agent_configs(sched, addresses=addrs, options=FLOptions(rounds=rounds, local_epochs=1,
                                                                   max_chunk_bytes=4096, child_timeout_s=60))
    learners = {n: Recording(c) for n, c in cfgs.items()}
    layout = chunk_layout(learners["G"].template, cfgs["G"].max_chunk_bytes)
    engines: dict[str, RoundEngine] = {}
    sent: list[tuple[str, Header, int]] = []
    for n, c in cfgs.items():
        cls = Watched if n == "G" else WatchedLocal
        engines[n] = cls(c, learners[n], layout, EventLog(c, io.StringIO()),
                         broadcast_out={p.site: edge(n, "broadcast", lambda p=p: engines[p.site], sent)
                                        for p in c.broadcast_children},
                         upload_out=None if c.upload_parent is None else up(
                             n, "upload", lambda up=c.upload_parent: engines[up.site], sent))
    run_connected(cfgs, engines)
    g = engines["G"]
    assert isinstance(g, Watched)
    return g, learners, engines


def test_a_copys_forward_first_is_logged_at_when_its_sender_says_its_first_chunk_started() -> None:
    # Its flight starts there (`orchestrator.lifecycle.fidelity`, the shaped-link rate), as the
    # simulation logs it: a paced first chunk is written only once serialized, and a busy host logs late.
    class Started(Wire):
        started_at = time.monotonic() - 5.0

    g, _, _ = _run(1, Started)
    stream = g.log._stream
    assert isinstance(stream, io.StringIO)
    firsts = [e for e in map(json.loads, stream.getvalue().splitlines()) if e["event"] == "forward_first"]
    assert sorted(e["peer"] for e in firsts) == ["L1", "L2"]
    assert {e["t"] for e in firsts} == {of_monotonic(Started.started_at)}


def _exact(learners: dict[str, Recording]) -> None:
    want = aggregate_tensors([learners[s].trained[-1] for s in ("L1", "L2")])
    got = learners["G"].model.state_dict()
    assert all(torch.allclose(got[k], want[k], atol=1e-6) for k in want)


def test_a_round_broadcasts_the_last_aggregate_and_reuses_the_buffer_every_child_has() -> None:
    g, learners, _ = _run(4, Wire)
    (b1, a1), (b2, a2), (b3, a3), (b4, a4) = g.buffers
    assert len({b1, a1}) == 2
    assert (b2, b3, b4) == (a1, a2, a3)  # each round sends the last round's aggregate as it is
    assert (a2, a3, a4) == (b1, b2, b3)  # ...and aggregates into the buffer the last round sent
    _exact(learners)


def test_a_broadcast_buffer_a_child_may_still_be_sent_is_never_written() -> None:
    g, learners, _ = _run(4, Holding)
    broadcast = [b for b, _ in g.buffers]
    for i, (_, agg) in enumerate(g.buffers):
        assert agg not in broadcast[: i + 1]
    _exact(learners)


def test_a_local_copies_its_trained_model_into_the_copy_its_last_update_left_from() -> None:
    _, learners, engines = _run(4, Wire)
    for site in ("L1", "L2"):
        local = engines[site]
        assert isinstance(local, WatchedLocal)
        assert len(local.own) == 4 and len(local.places()) == 1
    _exact(learners)


def test_a_copy_whose_update_may_still_be_sent_is_never_written() -> None:
    Holding.held.clear()
    _, learners, engines = _run(4, Wire, up=Holding)
    for site in ("L1", "L2"):
        local = engines[site]
        assert isinstance(local, WatchedLocal)
        assert len(local.places()) == 4  # no update was reported sent: every round takes fresh memory
    _exact(learners)


def test_the_learner_copies_its_model_into_given_tensors_of_its_shapes() -> None:
    sched = Schedule(task_id=3, scheduler="hand", global_site="G", local_sites=("L1",), demand_mbps=1.0,
                     broadcast_parent={"L1": "G"}, upload_parent={"L1": "G"})
    cfg = agent_configs(sched, addresses={"G": "127.0.0.1", "L1": "127.0.0.2"},
                        options=FLOptions(rounds=1, local_epochs=1))["L1"]
    learner = Learner(cfg)
    into = {k: torch.full_like(v, 7.0) for k, v in learner.state().items()}

    got = learner.state(into)

    assert got is into and all(torch.equal(v, learner.model.state_dict()[k]) for k, v in got.items())
    wrong = dict(into)
    name = next(iter(wrong))
    wrong[name] = torch.zeros(3)
    with pytest.raises(ValueError, match="do not match"):
        learner.state(wrong)
    with pytest.raises(ValueError, match="do not match"):
        learner.state({})


def test_the_worker_allocator_keeps_freed_memory_on_glibc() -> None:
    assert keep_freed_memory() is True
