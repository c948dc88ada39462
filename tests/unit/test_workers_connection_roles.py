"""A peer on two connections: a node's broadcast parent that is also its upload child.

Such a peer ends its broadcast connection once its last GLOBAL is forwarded, while its last
UPDATE may still be on the way on the other connection. That end of stream concerns the broadcast
role only: the update must still count (an engine once took it for the upload child's loss and
left the child's update out of the last round).
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

from orchestrator.runtime.task_runner import FLOptions, agent_configs
from orchestrator.scheduling.schedule import Schedule
from tests.unit.test_workers_selection import Recording, Wire, run_connected
from workers.events import EventLog
from workers.framing import Buffer, Header, chunk_layout
from workers.rounds import RoundEngine

ROUNDS = 2


class ClosesBroadcastFirst(Wire):
    """P's upload to X: before P's first UPDATE chunk of the last round reaches X, X hears that P's
    broadcast connection ended cleanly (as P's agent closes it when its rounds are over)."""

    paced_until: float | None = None  # not paced
    started_at: float | None = None  # not said: `forward_first` is logged when written

    def send(self, pieces: Sequence[Buffer], *, round: int, on_sent: Any = None, last: bool = False,
             ready_at: float | None = None) -> None:
        if round == ROUNDS and not getattr(self, "closed", False):
            self.closed = True
            self.dst().post("lost", "in", self.src, "end of stream", "broadcast")
        super().send(pieces, round=round, on_sent=on_sent)


def test_a_broadcast_parent_closing_its_broadcast_connection_does_not_lose_its_update() -> None:
    sched = Schedule(task_id=9, scheduler="hand", global_site="G", local_sites=("P", "X"), demand_mbps=1.0,
                     broadcast_parent={"P": "G", "X": "P"}, upload_parent={"P": "X", "X": "G"})
    addrs = {n: f"127.0.0.{i + 1}" for i, n in enumerate(sched.overlay_nodes)}
    cfgs = agent_configs(sched, addresses=addrs, options=FLOptions(rounds=ROUNDS, local_epochs=1,
                                                                   max_chunk_bytes=4096, child_timeout_s=60))
    assert cfgs["X"].broadcast_parent is not None and cfgs["X"].broadcast_parent.site == "P"
    assert [c.site for c in cfgs["X"].upload_children] == ["P"]
    learners = {n: Recording(c) for n, c in cfgs.items()}
    streams = {n: io.StringIO() for n in cfgs}
    sent: list[tuple[str, Header, int]] = []
    layout = chunk_layout(learners["G"].template, cfgs["G"].max_chunk_bytes)
    engines: dict[str, RoundEngine] = {}
    for n, c in cfgs.items():
        up = c.upload_parent
        wire = ClosesBroadcastFirst if n == "P" else Wire
        engines[n] = RoundEngine(
            c, learners[n], layout, EventLog(c, streams[n]),
            broadcast_out={p.site: Wire(n, "broadcast", lambda p=p: engines[p.site], sent) for p in c.broadcast_children},
            upload_out=None if up is None else wire(n, "upload", lambda up=up: engines[up.site], sent))
    run_connected(cfgs, engines)
    events = {n: [json.loads(x) for x in s.getvalue().splitlines()] for n, s in streams.items()}

    x = events["X"]
    assert not [e for e in x if e["event"] in ("child_lost", "connection_lost")]
    closed = [e for e in x if e["event"] == "connection_closed"]
    assert [(e["peer"], e["port_kind"]) for e in closed] == [("P", "broadcast")]
    last = next(e for e in x if e["event"] == "aggregated" and e["round"] == ROUNDS)
    assert last["stragglers"] == []
    assert last["num_examples"] == learners["P"].num_examples + learners["X"].num_examples
