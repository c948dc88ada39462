"""The FL agent: runs one role of one task (global model G, local model, or relay) on one host.

Started as a process with a JSON config (``python -m workers.agent --config FILE`` or
``--config-json '{...}'``), never with a pickled object. It binds its two listeners (the task's
broadcast and upload ports, `orchestrator.scheduling.task_ports`) to its own host address only.

Per round r (see DESIGN.md, "workers"):

- G: sends GLOBAL(r) to its broadcast children, waits for its upload children's UPDATEs, aggregates
  (weighted by example count), evaluates the new global model on the held-out test split, and
  starts round r+1.
- any other node: waits for GLOBAL(r) from its broadcast parent, forwards it to its broadcast
  children (in the background), trains if it holds a local model, waits for its upload children's
  UPDATEs (each up to the node's `child_timeout_s` from the start of its round; a child that misses
  it is a straggler, logged, and the round goes on without it), aggregates its own update and the
  children's partial aggregates, and sends UPDATE(r) with the summed example count to its upload
  parent. A relay that is only in the upload tree starts its round on the first UPDATE(r).

Timing events are JSON lines on CLOCK_MONOTONIC (system-wide, so events of agents on one machine
compare): ready, round_start, global_received, forward_sent, train_start, train_end,
child_received, child_timeout, rejected, update_sent, aggregated, round_complete (with accuracy),
done, error.

What the agent never does: unpickle or ``torch.load`` anything from the wire (see `workers.framing`),
bind to a wildcard address, or sleep for readiness (connects are retried until a deadline).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import struct
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from workers.aggregate import WeightedAccumulator
from workers.config import PAYLOAD_SLACK_BYTES, AgentConfig, Peer
from workers.events import EventLog
from workers.framing import (
    Buffer,
    FrameError,
    Message,
    TensorSet,
    check_tensors,
    encode_message,
)
from workers.learning import Learner
from workers.transport import read_message, send_message


@dataclass
class _Rejected:
    """A frame from a known sender was rejected: stop waiting for that sender this round."""

    sender: str
    round: int
    type: str


class Agent:
    """One role of one task; `run` returns the process exit status."""

    def __init__(self, cfg: AgentConfig, log: EventLog) -> None:
        self.cfg = cfg
        self.log = log
        self.learner = Learner(cfg)
        self.template = self.learner.template
        self.max_payload_bytes = self.learner.model_bytes + PAYLOAD_SLACK_BYTES
        self.inbox: queue.Queue[Message | _Rejected] = queue.Queue()
        self.pending: list[Message] = []
        self.stopping = threading.Event()
        self.listeners: list[socket.socket] = []
        self._acceptors: list[threading.Thread] = []

    # -- network: listeners -----------------------------------------------------------------------
    def bind(self) -> None:
        """Bind and listen on the task's ports at the host address (never a wildcard)."""
        for port, kind in ((self.cfg.broadcast_port, "GLOBAL"), (self.cfg.upload_port, "UPDATE")):
            if kind == "GLOBAL" and not self.cfg.expects_global:
                continue
            if kind == "UPDATE" and not self.cfg.upload_children:
                continue
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((self.cfg.host, port))
            s.listen(64)
            s.settimeout(0.5)
            self.listeners.append(s)
            t = threading.Thread(target=self._accept_loop, args=(s, kind), daemon=True)
            t.start()
            self._acceptors.append(t)

    def close(self) -> None:
        """Stop listening now: shutdown wakes a blocked accept, so the port is free on return."""
        self.stopping.set()
        for s in self.listeners:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # not connected: nothing to wake up
            s.close()
        for t in self._acceptors:
            t.join(timeout=2.0)

    def _accept_loop(self, srv: socket.socket, kind: str) -> None:
        while not self.stopping.is_set():
            try:
                conn, addr = srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, addr, kind), daemon=True).start()

    def _serve(self, conn: socket.socket, addr: tuple[str, int], kind: str) -> None:
        """Read messages from one connection; validate; queue the good ones, log the bad ones."""
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Blocking with a kernel receive timeout: payloads are then received in place (MSG_WAITALL).
        conn.settimeout(None)
        secs = int(self.cfg.global_timeout_s)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", secs, 0))
        with conn:
            while True:
                t0 = time.monotonic()
                try:
                    msg = read_message(conn, max_payload_bytes=self.max_payload_bytes)
                    if msg is None:
                        return
                    self._validate(msg, kind)
                except FrameError as e:
                    hdr = e.header
                    self.log.emit("rejected", reason=e.reason, detail=str(e), peer=addr[0], port_kind=kind)
                    if hdr is not None and hdr.task == self.cfg.task:
                        self.inbox.put(_Rejected(sender=hdr.sender, round=hdr.round, type=hdr.type))
                    return  # the stream position is unknown after a bad frame: drop the connection
                except (OSError, TimeoutError) as e:
                    self.log.emit("rejected", reason="connection", detail=str(e), peer=addr[0], port_kind=kind)
                    return
                msg_t = time.monotonic()
                self.log.emit(
                    "frame_received",
                    round=msg.header.round,
                    type=msg.header.type,
                    sender=msg.header.sender,
                    nbytes=msg.wire_bytes,
                    read_s=msg_t - t0,
                )
                self.inbox.put(msg)

    def _validate(self, msg: Message, kind: str) -> None:
        h = msg.header
        err: FrameError | None = None
        if h.task != self.cfg.task:
            err = FrameError("wrong_task", f"frame of task {h.task}, this agent runs task {self.cfg.task}")
        elif h.type != "STOP" and h.type != kind:
            err = FrameError("wrong_port", f"{h.type} frame on the {kind} port")
        elif h.type == "UPDATE" and h.sender not in self.cfg.upload_children:
            err = FrameError("unknown_sender", f"UPDATE from {h.sender!r}, not an upload child")
        elif h.round < 1 or h.round > self.cfg.rounds:
            err = FrameError("bad_round", f"round {h.round} outside 1..{self.cfg.rounds}")
        elif h.type == "GLOBAL" or (h.type == "UPDATE" and h.num_examples > 0):
            try:
                check_tensors(msg.tensors, self.template)
            except FrameError as e:
                err = e
        elif h.type == "UPDATE" and msg.tensors:
            err = FrameError("bad_tensors", "an UPDATE with no examples must carry no tensors")
        if err is not None:
            if err.reason != "wrong_task":
                err.header = h
            raise err

    # -- network: sending ---------------------------------------------------------------------------
    def send(self, peer: Peer, port: int, pieces: Sequence[Buffer], *, round: int, what: str) -> bool:
        """Connect (retrying refused connects until `connect_timeout_s`), send, close."""
        deadline = time.monotonic() + self.cfg.connect_timeout_s
        t0 = time.monotonic()
        while True:
            try:
                with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                    s.bind((self.cfg.host, 0))
                    s.settimeout(self.cfg.global_timeout_s)
                    s.connect((peer.host, port))
                    n = send_message(s, pieces)
                    s.shutdown(socket.SHUT_WR)
                    # wait for the receiver to close: the message is then fully read
                    s.recv(1)
                self.log.emit(what, round=round, peer=peer.site, nbytes=n, send_s=time.monotonic() - t0)
                return True
            except ConnectionRefusedError as e:  # not listening yet: poll until the deadline
                if time.monotonic() >= deadline:
                    self.log.emit("send_failed", round=round, peer=peer.site, detail=f"{what}: {e}")
                    return False
                self.stopping.wait(0.05)  # back off between connect attempts, bounded by the deadline
            except OSError as e:
                self.log.emit("send_failed", round=round, peer=peer.site, detail=f"{what}: {e}")
                return False

    def _broadcast(self, tensors: TensorSet, round: int) -> list[threading.Thread]:
        pieces = encode_message(
            type="GLOBAL",
            task=self.cfg.task,
            round=round,
            sender=self.cfg.site,
            tensors=tensors,
            max_chunk_bytes=self.cfg.max_chunk_bytes,
        )
        threads = [
            threading.Thread(
                target=self.send,
                args=(child, self.cfg.broadcast_port, pieces),
                kwargs={"round": round, "what": "forward_sent"},
                daemon=True,
            )
            for child in self.cfg.broadcast_children
        ]
        for t in threads:
            t.start()
        return threads

    # -- mailbox ------------------------------------------------------------------------------------
    def _next(self, deadline: float, want: Any) -> Message | _Rejected | None:
        """The next inbox item `want(item)` accepts, or None at the deadline."""
        for i, m in enumerate(self.pending):
            if want(m):
                return self.pending.pop(i)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            try:
                item = self.inbox.get(timeout=remaining)
            except queue.Empty:
                return None
            if want(item):
                return item
            if isinstance(item, Message):
                self.pending.append(item)

    # -- rounds -------------------------------------------------------------------------------------
    def _collect(self, r: int, acc: WeightedAccumulator, round_start: float, first: Message | None) -> list[str]:
        """Wait for the upload children's UPDATE(r); fold them into `acc`; return the stragglers."""
        waiting = set(self.cfg.upload_children)
        deadline = round_start + self.cfg.child_timeout_s

        def take(m: Message) -> None:
            waiting.discard(m.header.sender)
            self.log.emit(
                "child_received",
                round=r,
                child=m.header.sender,
                num_examples=m.header.num_examples,
                nbytes=m.wire_bytes,
            )
            if m.header.num_examples > 0:
                acc.add(m.tensors, m.header.num_examples)

        if first is not None:
            take(first)
        while waiting:
            item = self._next(
                deadline,
                lambda m: (isinstance(m, _Rejected) and m.round == r and m.type == "UPDATE")
                or (isinstance(m, Message) and m.header.type == "UPDATE" and m.header.round <= r),
            )
            if item is None:
                break
            if isinstance(item, _Rejected):
                if item.sender in waiting:
                    waiting.discard(item.sender)
                    self.log.emit("child_rejected", round=r, child=item.sender)
                continue
            if item.header.round < r:
                self.log.emit("stale", round=r, child=item.header.sender, stale_round=item.header.round)
                continue
            if item.header.sender not in waiting:
                self.log.emit("rejected", round=r, reason="duplicate", peer=item.header.sender)
                continue
            take(item)
        for child in sorted(waiting):
            self.log.emit("child_timeout", round=r, child=child, timeout_s=self.cfg.child_timeout_s)
        return sorted(waiting)

    def _own_update(self, r: int) -> WeightedAccumulator:
        """An accumulator holding this node's own update of round `r` (empty when it holds no model)."""
        acc = WeightedAccumulator()
        if self.cfg.trains:
            self.log.emit("train_start", round=r)
            n = self.learner.train()
            self.log.emit("train_end", round=r, num_examples=n)
            acc.add(self.learner.state(), n)
        return acc

    def run_global(self) -> int:
        for r in range(1, self.cfg.rounds + 1):
            start = self.log.emit("round_start", round=r)
            senders = self._broadcast(self.learner.state(), r)
            acc = self._own_update(r)
            stragglers = self._collect(r, acc, start, None)
            for t in senders:
                t.join()
            if acc.num_examples > 0:
                self.learner.load(acc.result())
            t_agg = self.log.emit(
                "aggregated", round=r, num_examples=acc.num_examples, num_updates=acc.num_updates
            )
            accuracy, loss = self.learner.evaluate()
            self.log.emit(
                "round_complete",
                round=r,
                latency_s=t_agg - start,
                accuracy=accuracy,
                loss=loss,
                num_examples=acc.num_examples,
                stragglers=stragglers,
            )
        return 0

    def run_node(self) -> int:
        assert self.cfg.upload_parent is not None
        r = 1
        while r <= self.cfg.rounds:
            first: Message | None = None
            senders: list[threading.Thread] = []
            if self.cfg.expects_global:
                item = self._next(
                    time.monotonic() + self.cfg.global_timeout_s,
                    lambda m, r=r: (isinstance(m, Message) and m.header.type in ("GLOBAL", "STOP"))
                    or (isinstance(m, _Rejected) and m.type == "GLOBAL" and m.sender == self.cfg.broadcast_parent
                        and r <= m.round <= self.cfg.rounds),
                )
                if item is None:
                    self.log.emit("error", round=r, detail=f"no GLOBAL for round {r} within {self.cfg.global_timeout_s} s")
                    return 1
                if isinstance(item, _Rejected):
                    # This round's GLOBAL was rejected: tell the parent at once that nothing comes
                    # from this subtree (an UPDATE without examples) and wait for the next round's.
                    r = item.round
                    self.log.emit("round_skipped", round=r, reason="GLOBAL rejected")
                    pieces = encode_message(type="UPDATE", task=self.cfg.task, round=r, sender=self.cfg.site)
                    self.send(self.cfg.upload_parent, self.cfg.upload_port, pieces, round=r, what="update_sent")
                    r += 1
                    continue
                if item.header.type == "STOP":
                    self.log.emit("stopped", round=r)
                    return 0
                if item.header.round < r:
                    self.log.emit("stale", round=r, stale_round=item.header.round, peer=item.header.sender)
                    continue
                r = item.header.round
                start = self.log.emit("global_received", round=r, nbytes=item.wire_bytes)
                senders = self._broadcast(item.tensors, r)
                self.learner.load(item.tensors)
            else:
                item = self._next(
                    time.monotonic() + self.cfg.global_timeout_s,
                    lambda m, r=r: isinstance(m, Message) and m.header.type == "UPDATE" and m.header.round >= r,
                )
                if item is None:
                    self.log.emit("error", round=r, detail=f"no UPDATE for round {r} within {self.cfg.global_timeout_s} s")
                    return 1
                assert isinstance(item, Message)
                r = item.header.round
                first = item
                start = self.log.emit("round_start", round=r)
            acc = self._own_update(r)
            stragglers = self._collect(r, acc, start, first)
            tensors = acc.result() if acc.num_examples > 0 else None
            pieces = encode_message(
                type="UPDATE",
                task=self.cfg.task,
                round=r,
                sender=self.cfg.site,
                tensors=tensors,
                num_examples=acc.num_examples,
                max_chunk_bytes=self.cfg.max_chunk_bytes,
            )
            self.log.emit("aggregated", round=r, num_examples=acc.num_examples, num_updates=acc.num_updates,
                          stragglers=stragglers)
            self.send(self.cfg.upload_parent, self.cfg.upload_port, pieces, round=r, what="update_sent")
            for t in senders:
                t.join()
            r += 1
        return 0

    def run(self) -> int:
        self.bind()
        self.log.emit(
            "ready",
            host=self.cfg.host,
            model_bytes=self.learner.model_bytes,
            num_examples=self.learner.num_examples,
            pid=os.getpid(),
        )
        try:
            status = self.run_global() if self.cfg.is_global else self.run_node()
        finally:
            self.close()
        self.log.emit("done", status=status)
        return status


def load_config(args: argparse.Namespace) -> AgentConfig:
    if args.config_json is not None:
        raw = json.loads(args.config_json)
    else:
        raw = json.loads(Path(args.config).read_text())
    return AgentConfig.from_dict(raw)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.agent", description=__doc__.split("\n")[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="path of the agent's JSON config")
    src.add_argument("--config-json", help="the agent's JSON config inline")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args)
    except (OSError, ValueError) as e:
        print(f"agent: bad config: {e}", file=sys.stderr)
        return 2
    stream: IO[str] = open(cfg.events_path, "a", encoding="utf-8") if cfg.events_path else sys.stdout
    log = EventLog(cfg, stream)
    try:
        return Agent(cfg, log).run()
    except Exception as e:
        log.emit("error", detail=f"{type(e).__name__}: {e}")
        raise
    finally:
        if stream is not sys.stdout:
            stream.close()


if __name__ == "__main__":
    sys.exit(main())
