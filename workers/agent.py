"""The FL agent: runs one role of one task (global model G, local model, or relay) on one host.

Started as a process with a JSON config (``python -m workers.agent --config FILE`` or
``--config-json '{...}'``), never with a pickled object. It puts together:

- `workers.learning.Learner`: the model, the data part, training and evaluation;
- `workers.transport`: its listeners (bound to its own host address only) and one outbound
  connection per overlay edge it sends on, set up before round 1;
- `workers.rounds.RoundEngine`: the round logic, cut-through and pipelined chunk by chunk;
- `workers.events.EventLog`: JSON-lines timing events; a ``tcp`` event per outbound connection
  as it closes (the kernel's bytes sent and retransmitted, `workers.tcpinfo`).

The chunk layout comes from the model template and `max_chunk_bytes`, the same at every node of
the task (`workers.framing.chunk_layout`). What the agent never does: unpickle or ``torch.load``
anything from the wire, bind a wildcard address, or sleep for readiness.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import IO

from workers import priority
from workers.config import AgentConfig
from workers.events import EventLog
from workers.framing import FrameError, Header, chunk_layout
from workers.learning import Learner, tune_process
from workers.rounds import RoundEngine
from workers.tcpinfo import TcpBytes
from workers.transport import Listener, Outbound

#: Room for a chunk's safetensors header beside its tensor bytes.
CHUNK_HEADER_SLACK_BYTES = 64 * 1024
#: How long the agent lets its last frames drain before it closes.
FLUSH_TIMEOUT_S = 60.0


class Agent:
    """One role of one task; `run` returns the process exit status."""

    def __init__(self, cfg: AgentConfig, log: EventLog) -> None:
        self.cfg = cfg
        self.log = log
        self.learner = Learner(cfg)
        self.layout = chunk_layout(self.learner.template, cfg.max_chunk_bytes)
        self.max_payload_bytes = max(c.nbytes for c in self.layout) + CHUNK_HEADER_SLACK_BYTES
        self.broadcast_out = {c.site: self._outbound("broadcast", c.site, c.host, cfg.broadcast_port)
                              for c in cfg.broadcast_children}
        up = cfg.upload_parent
        self.upload_out = None if up is None else self._outbound("upload", up.site, up.host, cfg.upload_port)
        self.engine = RoundEngine(cfg, self.learner, self.layout, log,
                                  broadcast_out=self.broadcast_out, upload_out=self.upload_out)
        self.listeners: list[Listener] = []
        #: How long `run` lets the last frames drain before it closes (shortened by `cancel`).
        self.flush_timeout_s = FLUSH_TIMEOUT_S

    def _outbound(self, kind: str, site: str, host: str, port: int) -> Outbound:
        """A connection to `site`'s `kind` port (``broadcast``: to a broadcast child; ``upload``: to the
        upload parent). A peer may be both, on two connections: events name the kind."""
        return Outbound(
            peer=site, peer_host=host, port=port, local_host=self.cfg.host, task=self.cfg.task,
            site=self.cfg.site, connect_timeout_s=self.cfg.connect_timeout_s,
            on_lost=lambda peer, e: self.engine.post("lost", "out", peer, str(e), kind),
            on_connect=lambda peer, secs, attempts: self.engine.post("connected", peer, secs, attempts, kind),
            on_tcp=lambda peer, tcp, n: self._log_tcp(kind, peer, tcp, n),
            pace_mbps=self.cfg.pace_mbps.get(f"{kind}:{site}", 0.0),
        )

    def _log_tcp(self, kind: str, peer: str, tcp: TcpBytes, connections: int) -> None:
        """The ``tcp`` event of one outbound connection as it closes: the kernel's data bytes sent and
        retransmitted over its `connections` (null: not measured). Logged at once, not through the
        round engine: the last connections close after its loop ended."""
        self.log.emit("tcp", peer=peer, kind=kind, connections=connections, sent_bytes=tcp.sent_bytes,
                      retrans_bytes=tcp.retrans_bytes, retrans_segments=tcp.retrans_segments)

    def _listen(self, kind: str, port: int, expected: dict[str, str]) -> None:
        def on_frame(peer: str, header: Header, payload: bytearray, arrived: float | None) -> None:
            self.engine.receive(kind, peer, header, payload, arrived)  # FrameError drops the connection

        def on_reject(peer_ip: str, e: FrameError | OSError, port_kind: str) -> None:
            reason = e.reason if isinstance(e, FrameError) else "connection"
            self.engine.post("rejected", port_kind, peer_ip, reason, str(e))

        listener = Listener(
            host=self.cfg.host, port=port, task=self.cfg.task, kind=kind, expected=expected,
            max_payload_bytes=self.max_payload_bytes, on_frame=on_frame,
            on_lost=lambda peer, e: self.engine.post("lost", "in", peer, "end of stream" if e is None else str(e),
                                                     kind),
            on_accept=lambda peer: self.engine.post("accepted", kind, peer),
            on_reject=on_reject,
        )
        self.listeners.append(listener)

    def cancel(self, reason: str) -> None:
        """End the role early (thread-safe): `run` returns 1 soon after, its frames not waited for."""
        self.flush_timeout_s = 1.0
        self.engine.post("cancel", reason)

    def run(self) -> int:
        cfg = self.cfg
        # this thread runs the round loop (aggregating; the readers forward): network-path work
        applied = priority.enter_transfer()
        if cfg.expects_global and cfg.broadcast_parent is not None:
            self._listen("broadcast", cfg.broadcast_port, {cfg.broadcast_parent.site: cfg.broadcast_parent.host})
        if cfg.upload_children:
            self._listen("upload", cfg.upload_port, {c.site: c.host for c in cfg.upload_children})
        self.log.emit("ready", host=cfg.host, model_bytes=self.learner.model_bytes, chunks=len(self.layout),
                      chunk_bytes=max(c.nbytes for c in self.layout), num_examples=self.learner.num_examples,
                      pid=os.getpid(), priority=applied)
        outbound = [*self.broadcast_out.values(), *([self.upload_out] if self.upload_out else [])]
        try:
            for listener in self.listeners:
                listener.start()
            for out in outbound:
                out.start()
            status = self.engine.run()
        finally:
            # every one closes and reports its TCP figures, even after one that did not drain
            drained = all([out.flush_and_close(self.flush_timeout_s) for out in outbound])
            for listener in self.listeners:
                listener.close()
        if not drained:
            self.log.emit("error", detail=f"outgoing frames did not drain within {self.flush_timeout_s:.0f} s")
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
    parser.add_argument("--log-file", help="write the agent's own output (not its events) to this file")
    args = parser.parse_args(argv)
    if args.log_file:
        out = open(args.log_file, "a", encoding="utf-8", buffering=1)
        sys.stdout = sys.stderr = out
    try:
        cfg = load_config(args)
    except (OSError, ValueError) as e:
        print(f"agent: bad config: {e}", file=sys.stderr)
        return 2
    stream: IO[str] = open(cfg.events_path, "a", encoding="utf-8") if cfg.events_path else sys.stdout
    log = EventLog(cfg, stream)
    tune_process()
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
