"""A real agent against fake peers on loopback, speaking the wire protocol by hand.

- bad connections and bad frames are rejected with a logged reason, nothing else is disturbed;
- a relay forwards chunk k before chunk k+1 exists (cut-through, shown by event order);
- G completes a round without a silent, a bad or a broken child, and each chunk of its new model is
  the exact example-weighted mean of what arrived for it.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from workers.agent import Agent, main
from workers.config import AgentConfig, Peer
from workers.events import EventLog
from workers.framing import (
    FIXED,
    MAGIC,
    VERSION,
    Header,
    chunk_layout,
    chunk_view,
    encode_chunk,
    encode_frame,
)
from workers.models import build_model
from workers.transport import hello, read_frame, sendmsg_all

MODEL_ARGS = {"hidden": 4}
CHUNK_BYTES = 1024
BPORT, UPORT = 24680, 24681


def _template() -> dict[str, torch.Tensor]:
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, model_args=MODEL_ARGS).state_dict()


LAYOUT = chunk_layout(_template(), CHUNK_BYTES)


class FakeListener:
    """Accepts connections on host:port and keeps every frame after HELLO, per sender."""

    def __init__(self, host: str, port: int) -> None:
        self.frames: list[Header] = []
        self.payloads: list[bytearray] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._read, args=(conn,), daemon=True).start()

    def _read(self, conn: socket.socket) -> None:
        with conn:
            while True:
                try:
                    got = read_frame(conn, max_payload_bytes=1 << 24)
                except OSError:
                    return
                if got is None:
                    return
                if got[0].type != "HELLO":
                    self.frames.append(got[0])
                    self.payloads.append(got[1])

    def wait_for(self, n: int, type: str, timeout_s: float = 30) -> list[Header]:
        deadline = time.monotonic() + timeout_s
        while len(got := [h for h in self.frames if h.type == type]) < n:
            assert time.monotonic() < deadline, f"fake peer got {len(got)} of {n} {type} frames"
            time.sleep(0.01)
        return got

    def close(self) -> None:
        self.stop.set()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept, so the port is free
        except OSError:
            pass  # not listening any more
        self.sock.close()
        self.thread.join(timeout=5)


def _connect(site: str, src: str, dst: str, port: int, task: int) -> socket.socket:
    """Connect from `src` as `site` and say HELLO, as an agent does."""
    deadline = time.monotonic() + 30
    while True:
        s = socket.socket()
        s.bind((src, 0))
        s.settimeout(10)
        try:
            s.connect((dst, port))
            break
        except ConnectionRefusedError:
            s.close()
            assert time.monotonic() < deadline, f"nothing listens on {dst}:{port}"
            time.sleep(0.02)  # the agent is still loading its model: poll, bounded by the deadline
    sendmsg_all(s, hello(task, site))
    return s


def _chunks(type: str, task: int, round: int, sender: str, state: dict[str, torch.Tensor],
            n: int = 0) -> list[bytes]:
    return [b"".join(bytes(p) for p in encode_chunk(
        Header(type, task, round, sender, num_examples=n, chunk=c.index, chunks=len(LAYOUT)), chunk_view(state, c)))
        for c in LAYOUT]


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _wait_event(path: Path, name: str, timeout_s: float = 30, **match: Any) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        for e in _events(path):
            if e["event"] == name and all(e.get(k) == v for k, v in match.items()):
                return e
        assert time.monotonic() < deadline, f"no {name} {match} event in {path}"
        time.sleep(0.01)


def _start(cfg: AgentConfig) -> tuple[Agent, threading.Thread, dict[str, int]]:
    result: dict[str, int] = {}
    stream = open(cfg.events_path or "", "a")
    agent = Agent(cfg, EventLog(cfg, stream))

    def run() -> None:
        with stream:
            result["status"] = agent.run()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return agent, t, result


def _closed_by_peer(s: socket.socket) -> bool:
    s.settimeout(10)
    try:
        return s.recv(1) == b""
    except OSError:
        return True


@pytest.fixture
def parent() -> Iterator[FakeListener]:
    p = FakeListener("127.0.0.51", UPORT)
    yield p
    p.close()


def test_a_local_rejects_bad_peers_and_frames_and_trains_on_the_good_global(tmp_path: Path,
                                                                            parent: FakeListener) -> None:
    ev = tmp_path / "L1.events.jsonl"
    g = Peer(site="G", host="127.0.0.51")
    cfg = AgentConfig(task=9, site="L1", host="127.0.0.52", broadcast_port=BPORT, upload_port=UPORT, rounds=1,
                      broadcast_parent=g, upload_parent=g, model_args=MODEL_ARGS, num_parts=4, part_index=0,
                      local_epochs=1, max_chunk_bytes=CHUNK_BYTES, events_path=str(ev))
    _agent, thread, result = _start(cfg)
    good = _chunks("GLOBAL", 9, 1, "G", _template())

    impostor = _connect("X", "127.0.0.51", "127.0.0.52", BPORT, 9)  # not the broadcast parent
    wrong_host = _connect("G", "127.0.0.55", "127.0.0.52", BPORT, 9)  # G's name from another address
    junk = socket.create_connection(("127.0.0.52", BPORT))
    junk.sendall(b"JUNK" + b"\0" * 60)
    assert all(_closed_by_peer(s) for s in (impostor, wrong_host, junk))
    bad_shape = _connect("G", "127.0.0.51", "127.0.0.52", BPORT, 9)
    parent.wait_for(1, "READY")  # L1 is set up once G's connection is in
    sendmsg_all(bad_shape, [_chunks("GLOBAL", 9, 1, "G", _template())[0][:-3] + b"xyz"])  # digest fails
    assert _closed_by_peer(bad_shape)
    oversized = _connect("G", "127.0.0.51", "127.0.0.52", BPORT, 9)
    sendmsg_all(oversized, [FIXED.pack(MAGIC, VERSION, 0, 0, 2, 2**40)])
    assert _closed_by_peer(oversized)
    real = _connect("G", "127.0.0.51", "127.0.0.52", BPORT, 9)
    for frame in good:
        real.sendall(frame)
    thread.join(timeout=60)
    real.close()

    reasons = {e["reason"] for e in _events(ev) if e["event"] == "rejected"}
    assert {"unknown_sender", "bad_magic", "bad_checksum", "oversized"} <= reasons
    assert result["status"] == 0
    updates = parent.wait_for(len(LAYOUT), "UPDATE")
    n = _wait_event(ev, "train_end", round=1)["num_examples"]
    assert [u.chunk for u in updates] == list(range(len(LAYOUT)))
    assert all(u.num_examples == n > 0 and u.sender == "L1" and u.round == 1 for u in updates)
    assert not [e for e in _events(ev) if e["event"] == "connect" and e["t"] > _wait_event(ev, "connected")["t"]]


def test_a_relay_forwards_chunk_k_before_chunk_k_plus_1_exists(tmp_path: Path, parent: FakeListener) -> None:
    ev = tmp_path / "R.events.jsonl"
    child = FakeListener("127.0.0.57", BPORT)
    g = Peer(site="G", host="127.0.0.51")
    cfg = AgentConfig(task=4, site="R", host="127.0.0.56", broadcast_port=BPORT, upload_port=UPORT, rounds=1,
                      broadcast_parent=g, upload_parent=g, broadcast_children=(Peer(site="L", host="127.0.0.57"),),
                      upload_children=(Peer(site="L", host="127.0.0.57"),), model_args=MODEL_ARGS,
                      max_chunk_bytes=CHUNK_BYTES, child_timeout_s=30, events_path=str(ev))
    _agent, thread, result = _start(cfg)
    try:
        up = _connect("L", "127.0.0.57", "127.0.0.56", UPORT, 4)
        sendmsg_all(up, encode_frame(Header("READY", 4, 0, "L"), b""))
        down = _connect("G", "127.0.0.51", "127.0.0.56", BPORT, 4)
        parent.wait_for(1, "READY")
        frames = _chunks("GLOBAL", 4, 1, "G", _template())

        for k, frame in enumerate(frames):
            down.sendall(frame)
            # chunk k must reach the child while chunk k+1 has not even been sent to the relay
            assert child.wait_for(k + 1, "GLOBAL")[k].chunk == k
        update = {name: t + 1.0 for name, t in _template().items()}
        for frame in _chunks("UPDATE", 4, 1, "L", update, n=10):
            up.sendall(frame)
        thread.join(timeout=60)
    finally:
        child.close()

    assert result["status"] == 0
    assert [h.sender for h in child.frames] == ["R"] * len(LAYOUT)
    assert child.payloads[0] and len(parent.wait_for(len(LAYOUT), "UPDATE")) == len(LAYOUT)
    order = [e["event"] for e in _events(ev) if e["event"] in ("forward_first", "global_received")]
    assert order == ["forward_first", "global_received"]


def _global(tmp_path: Path, timeout_s: float) -> AgentConfig:
    children = (Peer(site="L1", host="127.0.0.62"), Peer(site="L2", host="127.0.0.63"))
    return AgentConfig(task=3, site="G", host="127.0.0.61", broadcast_port=BPORT, upload_port=UPORT, rounds=1,
                       is_global=True, expects_global=False, broadcast_children=children, upload_children=children,
                       model_args=MODEL_ARGS, child_timeout_s=timeout_s, max_chunk_bytes=CHUNK_BYTES,
                       events_path=str(tmp_path / "G.events.jsonl"))


@pytest.mark.parametrize("l2_sends", ["nothing", "bad_frame", "wrong_shape", "half_then_breaks", "wrong_sender"])
def test_global_completes_the_round_without_a_silent_bad_or_broken_child(tmp_path: Path, l2_sends: str) -> None:
    fakes = [FakeListener("127.0.0.62", BPORT), FakeListener("127.0.0.63", BPORT)]
    cfg = _global(tmp_path, 2.0 if l2_sends == "nothing" else 60.0)
    ev = Path(cfg.events_path or "")
    template = _template()
    l1_update = {k: v + 1.0 for k, v in template.items()}
    l2_update = {k: v + 3.0 for k, v in template.items()}
    half = len(LAYOUT) // 2
    try:
        agent, thread, result = _start(cfg)
        conns = {c: _connect(c, h, "127.0.0.61", UPORT, 3) for c, h in (("L1", "127.0.0.62"), ("L2", "127.0.0.63"))}
        for c, s in conns.items():
            sendmsg_all(s, encode_frame(Header("READY", 3, 0, c), b""))
        for f in fakes:
            f.wait_for(len(LAYOUT), "GLOBAL")
        for frame in _chunks("UPDATE", 3, 1, "L1", l1_update, n=100):
            conns["L1"].sendall(frame)
        l2 = _chunks("UPDATE", 3, 1, "L2", l2_update, n=300)
        if l2_sends == "bad_frame":
            conns["L2"].sendall(l2[0][:-3] + b"xyz")
        elif l2_sends == "wrong_shape":
            piece = LAYOUT[0].pieces[0]
            bad = {piece.name: torch.zeros(piece.shape[0] + 1, *piece.shape[1:])}  # one row too many
            conns["L2"].sendall(b"".join(bytes(p) for p in encode_chunk(
                Header("UPDATE", 3, 1, "L2", num_examples=300, chunk=0, chunks=len(LAYOUT)), bad)))
        elif l2_sends == "half_then_breaks":
            for frame in l2[:half]:
                conns["L2"].sendall(frame)
            conns["L2"].shutdown(socket.SHUT_WR)  # a clean end mid-message: every chunk sent is read first
            conns["L2"].close()
        elif l2_sends == "wrong_sender":
            conns["L2"].sendall(_chunks("UPDATE", 3, 1, "L9", l2_update, n=300)[0])
        thread.join(timeout=60)
    finally:
        for f in fakes:
            f.close()

    done = _wait_event(ev, "round_complete", round=1)
    assert result["status"] == 0
    assert done["stragglers"] == ["L2"]
    expected_event = "child_timeout" if l2_sends == "nothing" else "child_lost"
    assert _wait_event(ev, expected_event, child="L2")["round"] == 1
    rejected = {e["reason"] for e in _events(ev) if e["event"] == "rejected"}
    assert rejected == {"bad_frame": {"bad_checksum"}, "wrong_shape": {"bad_tensors"},
                        "wrong_sender": {"wrong_sender"}}.get(l2_sends, set())
    model = agent.learner.model.state_dict()
    for spec in LAYOUT:
        both = l2_sends == "half_then_breaks" and spec.index < half
        want = {n: (100 * l1_update[p.base] + 300 * l2_update[p.base]) / 400 if both else l1_update[p.base]
                for p in spec.pieces for n in [p.name]}
        for p in spec.pieces:
            got, ref = p.view(model[p.base]), p.view(want[p.name])
            assert torch.allclose(got, ref.to(got.dtype), atol=1e-6), (spec.index, p.name)
    assert done["num_examples"] == (400 if l2_sends == "half_then_breaks" else 100)
    assert done["min_chunk_examples"] == 100


def test_agent_main_rejects_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config-json", json.dumps({"task": 1, "site": "x", "host": "0.0.0.0", "broadcast_port": 1,
                                              "upload_port": 2, "rounds": 1, "is_global": True,
                                              "upload_children": [{"site": "a", "host": "127.0.0.9"}]})]) == 2
    assert "wildcard" in capsys.readouterr().err
    assert main(["--config-json", json.dumps({"task": 1, "site": "x", "host": "127.0.0.1", "broadcast_port": 1,
                                              "upload_port": 2, "rounds": 1, "bogus": 1})]) == 2
