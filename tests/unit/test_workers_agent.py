"""The agent against fake peers on loopback: bad frames are rejected with a logged reason and the
round goes on without them; a straggler times out and is recorded."""

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
from workers.framing import FIXED, MAGIC, Buffer, Message, encode_message, message_bytes
from workers.models import build_model
from workers.transport import read_message

MODEL_ARGS = {"hidden": 4}
BPORT, UPORT = 24680, 24681


def _template() -> dict[str, torch.Tensor]:
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, model_args=MODEL_ARGS).state_dict()


class FakePeer:
    """Listens on one address/port and keeps every message it receives."""

    def __init__(self, host: str, port: int) -> None:
        self.messages: list[Message] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            with conn:
                msg = read_message(conn)
                if msg is not None:
                    self.messages.append(msg)

    def wait_for(self, n: int, timeout_s: float = 30) -> list[Message]:
        deadline = time.monotonic() + timeout_s
        while len(self.messages) < n:
            assert time.monotonic() < deadline, f"fake peer got {len(self.messages)} of {n} messages"
            time.sleep(0.02)
        return self.messages

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.sock.close()


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _wait_event(path: Path, name: str, timeout_s: float = 30, **match: Any) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        for e in _events(path):
            if e["event"] == name and all(e.get(k) == v for k, v in match.items()):
                return e
        assert time.monotonic() < deadline, f"no {name} {match} event in {path}"
        time.sleep(0.02)


def _send(host: str, port: int, pieces: list[Buffer]) -> None:
    """Send like an agent; the receiver may drop the connection early (it rejects bad frames)."""
    with socket.create_connection((host, port), timeout=10) as s:
        try:
            for p in pieces:
                s.sendall(p)
            s.shutdown(socket.SHUT_WR)
            s.recv(1)
        except OSError:  # reset / not connected: the receiver closed on a rejected frame
            pass


def _start(cfg: AgentConfig) -> tuple[threading.Thread, dict[str, int]]:
    result: dict[str, int] = {}
    stream = open(cfg.events_path or "", "a")

    def run() -> None:
        with stream:
            result["status"] = Agent(cfg, EventLog(cfg, stream)).run()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


@pytest.fixture
def parent() -> Iterator[FakePeer]:
    p = FakePeer("127.0.0.51", UPORT)
    yield p
    p.close()


def test_local_rejects_bad_frames_then_trains_on_the_good_one(tmp_path: Path, parent: FakePeer) -> None:
    ev = tmp_path / "L1.events.jsonl"
    cfg = AgentConfig(task=9, site="L1", host="127.0.0.52", broadcast_port=BPORT, upload_port=UPORT,
                      rounds=1, upload_parent=Peer(site="G", host="127.0.0.51"), model_args=MODEL_ARGS,
                      num_parts=4, part_index=0, local_epochs=1, events_path=str(ev))
    thread, result = _start(cfg)
    _wait_event(ev, "ready")
    good = _template()
    wrong_shape = {**good, "1.weight": torch.zeros(5, 64)}

    _send("127.0.0.52", BPORT, encode_message(type="GLOBAL", task=8, round=1, sender="G", tensors=good))
    _send("127.0.0.52", BPORT, encode_message(type="GLOBAL", task=9, round=1, sender="G", tensors=wrong_shape))
    _send("127.0.0.52", BPORT, [b"JUNK" + b"\0" * 60])
    _send("127.0.0.52", BPORT, [FIXED.pack(MAGIC, 1, 0, 0, 2, 2**40)])
    whole = message_bytes(encode_message(type="GLOBAL", task=9, round=1, sender="G", tensors=good,
                                         max_chunk_bytes=None))
    _send("127.0.0.52", BPORT, [whole[:-100]])  # truncated: the sender goes away mid-payload
    _send("127.0.0.52", BPORT, [whole[:-1] + bytes([whole[-1] ^ 0xFF])])  # payload altered in flight
    _send("127.0.0.52", BPORT, encode_message(type="GLOBAL", task=9, round=1, sender="G", tensors=good))
    thread.join(timeout=60)

    reasons = {e["reason"] for e in _events(ev) if e["event"] == "rejected"}
    assert {"wrong_task", "bad_tensors", "bad_magic", "oversized", "truncated", "bad_checksum"} <= reasons
    assert result["status"] == 0
    (update,) = parent.wait_for(1)
    assert update.header.type == "UPDATE" and update.header.task == 9 and update.header.round == 1
    assert update.header.num_examples == _wait_event(ev, "train_end", round=1)["num_examples"] > 0
    assert set(update.tensors) == set(good)


def test_local_skips_a_round_whose_global_was_rejected(tmp_path: Path, parent: FakePeer) -> None:
    ev = tmp_path / "L1.events.jsonl"
    cfg = AgentConfig(task=9, site="L1", host="127.0.0.53", broadcast_port=BPORT, upload_port=UPORT,
                      rounds=2, broadcast_parent="G", upload_parent=Peer(site="G", host="127.0.0.51"),
                      model_args=MODEL_ARGS, num_parts=4, part_index=1, local_epochs=1, events_path=str(ev))
    thread, result = _start(cfg)
    _wait_event(ev, "ready")
    good = _template()
    r1 = message_bytes(encode_message(type="GLOBAL", task=9, round=1, sender="G", tensors=good))

    _send("127.0.0.53", BPORT, [r1[:-1] + bytes([r1[-1] ^ 0x01])])  # round 1's GLOBAL damaged in flight
    first = parent.wait_for(1)[0]
    _send("127.0.0.53", BPORT, encode_message(type="GLOBAL", task=9, round=2, sender="G", tensors=good))
    thread.join(timeout=60)

    assert result["status"] == 0
    assert _wait_event(ev, "round_skipped", round=1)["reason"] == "GLOBAL rejected"
    assert (first.header.round, first.header.num_examples, first.tensors) == (1, 0, {})
    second = parent.wait_for(2)[1]
    assert second.header.round == 2 and second.header.num_examples > 0


def _global_cfg(tmp_path: Path, timeout_s: float) -> AgentConfig:
    return AgentConfig(task=3, site="G", host="127.0.0.61", broadcast_port=BPORT, upload_port=UPORT,
                       rounds=1, is_global=True, expects_global=False,
                       broadcast_children=(Peer(site="L1", host="127.0.0.62"), Peer(site="L2", host="127.0.0.63")),
                       upload_children=("L1", "L2"), model_args=MODEL_ARGS, child_timeout_s=timeout_s,
                       events_path=str(tmp_path / "G.events.jsonl"))


@pytest.mark.parametrize("l2_sends", ["bad_shape", "nothing", "wrong_sender"])
def test_global_completes_the_round_without_a_bad_or_missing_child(tmp_path: Path, l2_sends: str) -> None:
    children = [FakePeer("127.0.0.62", BPORT), FakePeer("127.0.0.63", BPORT)]
    timeout_s = 2.0 if l2_sends != "bad_shape" else 30.0
    cfg = _global_cfg(tmp_path, timeout_s)
    ev = Path(cfg.events_path or "")
    try:
        thread, result = _start(cfg)
        for c in children:
            c.wait_for(1)
        update = {k: v + 1.0 for k, v in _template().items()}
        _send("127.0.0.61", UPORT, encode_message(type="UPDATE", task=3, round=1, sender="L1",
                                                  tensors=update, num_examples=100))
        if l2_sends == "bad_shape":
            bad = {**update, "0.bias": torch.zeros(3)}
            _send("127.0.0.61", UPORT, encode_message(type="UPDATE", task=3, round=1, sender="L2",
                                                      tensors=bad, num_examples=100))
        elif l2_sends == "wrong_sender":
            _send("127.0.0.61", UPORT, encode_message(type="UPDATE", task=3, round=1, sender="L9",
                                                      tensors=update, num_examples=100))
        t0 = time.monotonic()
        thread.join(timeout=60)
        waited = time.monotonic() - t0
    finally:
        for c in children:
            c.close()

    done = _wait_event(ev, "round_complete", round=1)
    assert result["status"] == 0
    assert done["num_examples"] == 100
    assert 0.0 <= done["accuracy"] <= 1.0
    if l2_sends == "bad_shape":
        assert _wait_event(ev, "child_rejected", child="L2")
        assert waited < 20, "a rejected child must not be waited for until the timeout"
    else:
        assert done["stragglers"] == ["L2"]
        assert _wait_event(ev, "child_timeout", child="L2")["timeout_s"] == timeout_s


def test_agent_main_rejects_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config-json", json.dumps({"task": 1, "site": "x", "host": "0.0.0.0", "broadcast_port": 1,
                                              "upload_port": 2, "rounds": 1, "is_global": True,
                                              "upload_children": ["a"]})]) == 2
    assert "wildcard" in capsys.readouterr().err
    assert main(["--config-json", '{"bogus": 1}']) == 2
