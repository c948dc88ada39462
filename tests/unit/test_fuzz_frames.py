"""Property-based fuzzing of the agents' frames: decoding, an agent's listeners, the site server's control.

- Decoding (`workers.framing`): any JSON header or chunk payload either parses into exactly what it
  must be or raises `FrameError`; nothing else escapes.
- Listeners (`workers.transport.Listener` as an agent sets them up, with the agent's own checks): one
  agent per module; every bad connection (random bytes, truncated or lying headers, wrong magic or
  version, oversize, wrong tensors, NaN/inf, wrong kinds, wrong peers) is closed and logged as one
  ``rejected`` event with its reason; a good peer's frame is taken right after; memory stays bounded.
- The site server's control channel (`workers.site_server.serve`): every malformed or refused request
  gets ``ok: false`` with an error, is logged as one ``rejected control`` line, and the next
  request is served.
"""

from __future__ import annotations

import contextlib
import json
import math
import resource
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from workers.agent import Agent
from workers.config import AgentConfig, Peer
from workers.control import MAX_MESSAGE_BYTES, ProtocolError, check_request, module_digest, send_message
from workers.events import EventLog
from workers.framing import (
    FIXED,
    MAGIC,
    MAX_HEADER_BYTES,
    VERSION,
    FrameError,
    Header,
    chunk_layout,
    chunk_view,
    encode_chunk,
    encode_frame,
    parse_chunk,
)
from workers.models import build_model
from workers.site_server import SiteServer, serve
from workers.transport import hello

pytestmark = pytest.mark.fuzz

HOST = "127.0.0.1"
OTHER_HOST = "127.0.0.2"  # a known peer's name from an address that is not its own
TASK = 9
ROUNDS = 3
CHUNK_BYTES = 1024
#: Generous: a loaded two-core machine may be slow, and a slow answer is not what is tested here.
TIMEOUT_S = 60.0
#: How much the test process's peak memory may grow over 1000 bad connections (lying lengths of up
#: to 2**64 bytes must not be allocated).
MEMORY_GROWTH_BYTES = 256 * 1024 * 1024
FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _template() -> dict[str, torch.Tensor]:
    return build_model("mlp", input_shape=(1, 8, 8), num_classes=10, model_args={"hidden": 4}).state_dict()


TEMPLATE = _template()
LAYOUT = chunk_layout(TEMPLATE, CHUNK_BYTES)


def _frame(header: Header, payload: bytes) -> bytes:
    return b"".join(bytes(p) for p in encode_frame(header, payload))


def _chunk(type: str, *, sender: str = "G", round: int = 1, chunk: int = 0, n: int = 0) -> tuple[Header, bytes]:
    """A good chunk frame's header and payload (the template's values)."""
    h = Header(type, TASK, round, sender, num_examples=n, chunk=chunk, chunks=len(LAYOUT))
    parts = encode_chunk(h, chunk_view(TEMPLATE, LAYOUT[chunk]))
    return Header.from_json(bytes(parts[0])[FIXED.size:]), b"".join(bytes(p) for p in parts[1:])


# -- strategies ----------------------------------------------------------------------------------------
json_scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63, max_value=2**70)
                | st.floats() | st.text(max_size=12))
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=3)
                           | st.dictionaries(st.text(max_size=8), kids, max_size=3), max_leaves=10)
#: JSON texts a parser chokes on, or that are not what a header must be.
odd_json = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.integers(min_value=1, max_value=60_000).map(lambda n: b"[" * n),
    st.integers(min_value=4301, max_value=20_000).map(lambda n: b'{"task":' + b"1" * n + b"}"),
    st.sampled_from([b"NaN", b"\xff\xfe", '{"type":"\ud800"}'.encode("utf-8", "surrogatepass")]),
)
header_fields = {"type": st.sampled_from(["GLOBAL", "UPDATE", "HELLO", "READY", "STOP"]) | json_values,
                 "task": st.integers(-1, 2**65) | json_values, "round": st.integers(-1, 2**65) | json_values,
                 "sender": st.sampled_from(["G", "L2", ""]) | json_values,
                 "num_examples": st.integers(-1, 2**65) | json_values, "nbytes": st.integers(-1, 2**65) | json_values,
                 "digest": st.text(max_size=40) | json_values, "chunk": st.integers(-1, 5000) | json_values,
                 "chunks": st.integers(-1, 5000) | json_values, "extra": json_values}
json_headers = st.one_of(
    odd_json,
    st.fixed_dictionaries({}, optional=header_fields).map(lambda d: json.dumps(d).encode()),
)


def _st_header(pieces: dict[str, Any]) -> bytes:
    raw = json.dumps(pieces, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


@st.composite
def chunk_payloads(draw: st.DrawFn) -> tuple[int, bytearray]:
    """A chunk's payload with its safetensors header or its values changed (or left as they are)."""
    k = draw(st.integers(0, len(LAYOUT) - 1))
    spec = LAYOUT[k]
    meta = {p.name: {"dtype": "F32", "shape": list(p.shape), "data_offsets": [0, 0]} for p in spec.pieces}
    offset = 0
    for p in spec.pieces:
        meta[p.name]["data_offsets"] = [offset, offset + p.nbytes]
        offset += p.nbytes
    values = torch.cat([chunk_view(TEMPLATE, spec)[p.name].reshape(-1) for p in spec.pieces]).clone()
    how = draw(st.sampled_from(["none", "name", "shape", "dtype", "offsets", "extra", "drop", "value", "bytes",
                                "header", "length"]))
    name = draw(st.sampled_from(sorted(meta)))
    if how == "name":
        meta[name + draw(st.text(min_size=1, max_size=3))] = meta.pop(name)
    elif how == "shape":
        meta[name]["shape"] = draw(st.lists(st.integers(0, 2**40), max_size=3) | json_values)
    elif how == "dtype":
        meta[name]["dtype"] = draw(st.sampled_from(["F64", "F16", "BF16", "I64", "I32", "U8", "BOOL", "f32", ""])
                                   | json_values)
    elif how == "offsets":
        meta[name]["data_offsets"] = draw(st.lists(st.integers(-1, 2**64), max_size=3) | json_values)
    elif how == "extra":
        meta[draw(st.text(max_size=5))] = draw(json_values)
    elif how == "drop":
        del meta[name]
    elif how == "value" and values.numel():
        values[draw(st.integers(0, values.numel() - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
    data = values.numpy().tobytes()
    if how == "bytes":
        data = draw(st.binary(max_size=len(data) * 2))
    head = _st_header(meta)
    if how == "header":
        head = struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + draw(odd_json)
    elif how == "length":
        head = struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + head[8:]
    return k, bytearray(head + data)


# -- decoding ------------------------------------------------------------------------------------------
@FUZZ
@given(raw=json_headers)
def test_a_json_header_parses_into_a_valid_header_or_is_a_frame_error(raw: bytes) -> None:
    try:
        h = Header.from_json(raw)
    except FrameError as e:
        assert e.reason == "bad_header" and str(e)
        return
    assert h.type in ("GLOBAL", "UPDATE", "HELLO", "READY", "STOP") and isinstance(h.sender, str)
    assert all(isinstance(v, int) and v >= 0 for v in (h.task, h.round, h.num_examples, h.nbytes, h.chunk))
    assert 0 <= h.chunk < h.chunks


@FUZZ
@given(got=chunk_payloads())
def test_a_chunk_payload_parses_into_its_exact_tensors_or_is_a_frame_error(got: tuple[int, bytearray]) -> None:
    k, payload = got
    spec = LAYOUT[k]
    try:
        tensors = parse_chunk(payload, spec)
    except FrameError as e:
        assert e.reason in ("bad_payload", "bad_tensors") and str(e)
        return
    assert list(tensors) == [p.name for p in spec.pieces]
    for p in spec.pieces:
        assert tensors[p.name].shape == p.shape and tensors[p.name].dtype == p.dtype
        assert bool(torch.isfinite(tensors[p.name]).all())


# -- an agent's listeners ------------------------------------------------------------------------------
@dataclass
class Harness:
    """An agent's broadcast and upload listeners, its round engine's events taken here instead of by its
    round loop: rejections are logged by the engine (its events file), good frames are counted."""

    agent: Agent
    events_path: Path
    ports: dict[str, int]
    frames: int = 0
    lost: int = 0
    cond: threading.Condition = field(default_factory=threading.Condition)
    _events: IO[str] | None = None
    _partial: str = ""

    def pump(self) -> None:
        engine = self.agent.engine
        while True:
            event = engine.events.get()
            if event[0] == "stop":
                return
            if event[0] == "rejected":
                engine._on_rejected(*event[1:])  # what the engine's loop does with it: one event logged
            with self.cond:
                self.frames += event[0] == "frame"
                self.lost += event[0] == "lost"
                self.cond.notify_all()

    def rejections(self) -> list[dict[str, Any]]:
        """The ``rejected`` events logged since the last call."""
        assert self._events is not None
        self._partial += self._events.read()
        *lines, self._partial = self._partial.split("\n")  # a line being written is read when complete
        return [e for e in map(json.loads, lines) if e["event"] == "rejected"]

    def wait(self, what: Callable[[], bool], why: str) -> None:
        with self.cond:
            assert self.cond.wait_for(what, timeout=TIMEOUT_S), why

    def wait_rejected(self) -> dict[str, Any]:
        deadline = time.monotonic() + TIMEOUT_S
        while not (got := self.rejections()):
            assert time.monotonic() < deadline, "no rejected event logged"
            time.sleep(0.001)
        assert len(got) == 1, got
        return got[0]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    ev = tmp_path_factory.mktemp("agent") / "L1.events.jsonl"
    g, l2 = Peer(site="G", host=HOST), Peer(site="L2", host=HOST)
    cfg = AgentConfig(task=TASK, site="L1", host=HOST, broadcast_port=1, upload_port=2, rounds=ROUNDS,
                      broadcast_parent=g, upload_parent=g, upload_children=(l2,), model_args={"hidden": 4},
                      num_parts=4, part_index=0, max_chunk_bytes=CHUNK_BYTES, events_path=str(ev))
    stream = ev.open("a", encoding="utf-8")
    a = Agent(cfg, EventLog(cfg, stream))
    a._listen("broadcast", 0, {"G": HOST})  # port 0: the kernel picks free ports
    a._listen("upload", 0, {"L2": HOST})
    h = Harness(a, ev, {lst.kind: lst.sock.getsockname()[1] for lst in a.listeners})
    pump = threading.Thread(target=h.pump, daemon=True)
    pump.start()
    for lst in a.listeners:
        lst.start()
    with ev.open(encoding="utf-8") as h._events:
        h.rejections()
        yield h
    for lst in a.listeners:
        lst.close()
    a.engine.post("stop")
    pump.join(timeout=TIMEOUT_S)
    stream.close()


def _send(port: int, data: bytes, *, source: str = HOST) -> None:
    """Connect from `source`, send `data`, shut down the writing side; returns once the agent closed."""
    with socket.create_connection((HOST, port), timeout=TIMEOUT_S, source_address=(source, 0)) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            while s.recv(65536):
                pass  # the agent sends nothing: wait for its end of the connection
        except OSError:
            pass  # reset by the agent before it read everything (ECONNRESET, EPIPE, ENOTCONN): a rejection too


def _hello(site: str = "G", task: int = TASK) -> bytes:
    return b"".join(bytes(p) for p in hello(task, site))


def _good_peer_is_served(h: Harness) -> None:
    """G connects, sends a good GLOBAL chunk, and the agent takes it."""
    header, payload = _chunk("GLOBAL")
    before = h.frames
    with socket.create_connection((HOST, h.ports["broadcast"]), timeout=TIMEOUT_S, source_address=(HOST, 0)) as s:
        s.sendall(_hello() + _frame(header, payload))
        h.wait(lambda: h.frames > before, "the good peer's frame was not taken")


@st.composite
def bad_connections(draw: st.DrawFn) -> tuple[str, str, bytes, frozenset[str], bytes | None]:
    """(port kind, source address, bytes sent, reasons it may be rejected for, the JSON header of a frame
    with no payload sent after HELLO: it may happen to be a good one)."""
    kind = draw(st.sampled_from(["broadcast", "upload"]))
    peer = "G" if kind == "broadcast" else "L2"
    case = draw(st.sampled_from(["random", "fixed", "hello", "json", "kind", "who", "round", "chunk", "tensors",
                                 "digest", "length", "oversize"]))
    good_type = "GLOBAL" if kind == "broadcast" else "UPDATE"
    header, payload = _chunk(good_type, sender=peer, chunk=draw(st.integers(0, len(LAYOUT) - 1)), n=5)
    fixed = FIXED.pack(MAGIC, VERSION, 0, 0, len(header.to_json()), header.nbytes)
    if case == "random":  # no HELLO at all
        data = draw(st.binary(max_size=100))
        assume(data[:4] != MAGIC)
        return kind, HOST, data, frozenset({"bad_magic", "truncated", "no_hello"}), None
    if case == "fixed":  # the fixed header of a HELLO, changed
        h = _hello(peer)
        magic, version, flags, reserved, hlen, plen = FIXED.unpack(h[:FIXED.size])
        which = draw(st.sampled_from(["magic", "version", "hlen", "plen", "cut"]))
        if which == "magic":
            magic = draw(st.binary(min_size=4, max_size=4).filter(lambda m: m != MAGIC))
        elif which == "version":
            version = draw(st.integers(0, 255).filter(lambda v: v != VERSION))
        elif which == "hlen":
            hlen = draw(st.integers(0, 2**32 - 1).filter(lambda n: n != hlen))
        elif which == "plen":
            plen = draw(st.integers(1, 2**64 - 1))
        data = FIXED.pack(magic, version, flags, reserved, hlen, plen) + h[FIXED.size:]
        if which == "cut":
            data = h[: draw(st.integers(0, len(h) - 1))]
        return kind, HOST, data, frozenset({"bad_magic", "bad_version", "oversized", "bad_header", "truncated",
                                            "no_hello"}), None
    if case == "hello":  # a HELLO from someone not expected here, or for another task
        which = draw(st.sampled_from(["sender", "task", "address", "type"]))
        if which == "sender":
            who = draw(st.text(max_size=10).filter(lambda s: s != peer))
            return kind, HOST, _hello(who), frozenset({"unknown_sender"}), None
        if which == "task":
            return kind, HOST, _hello(peer, draw(st.integers(0, 2**63).filter(lambda t: t != TASK))), frozenset(
                {"wrong_task"}), None
        if which == "address":
            return kind, OTHER_HOST, _hello(peer), frozenset({"unknown_sender"}), None
        return kind, HOST, _frame(header, payload), frozenset({"no_hello", "oversized"}), None
    if case == "json":  # a JSON header that is not one
        raw = draw(json_headers)
        assume(len(raw) <= MAX_HEADER_BYTES)
        return kind, HOST, _hello(peer) + FIXED.pack(MAGIC, VERSION, 0, 0, len(raw), 0) + raw, frozenset(
            {"bad_header", "wrong_sender", "wrong_port", "bad_round", "bad_chunk", "bad_payload", "bad_tensors"}), raw
    if case == "kind":  # a message kind that never comes on this port
        wrong = draw(st.sampled_from(["UPDATE", "READY", "HELLO"] if kind == "broadcast" else ["GLOBAL", "STOP",
                                                                                                  "HELLO"]))
        bad = Header(wrong, TASK, 1, peer, num_examples=5, chunk=header.chunk, chunks=len(LAYOUT))
        return kind, HOST, _hello(peer) + _frame(bad, payload if wrong in ("GLOBAL", "UPDATE") else b""), frozenset(
            {"wrong_port"}), None
    if case == "who":  # a frame naming another sender or task on this peer's connection
        other = draw(st.sampled_from([("L2" if peer == "G" else "G", TASK), (peer, TASK + 1), ("X", 0)]))
        bad = Header(good_type, other[1], 1, other[0], num_examples=5, chunk=header.chunk, chunks=len(LAYOUT))
        return kind, HOST, _hello(peer) + _frame(bad, payload), frozenset({"wrong_sender"}), None
    if case == "round":
        bad = Header(good_type, TASK, draw(st.sampled_from([0, ROUNDS + 1, 2**63])), peer, num_examples=5,
                     chunk=header.chunk, chunks=len(LAYOUT))
        return kind, HOST, _hello(peer) + _frame(bad, payload), frozenset({"bad_round"}), None
    if case == "chunk":
        chunks = draw(st.integers(1, 4096).filter(lambda c: c != len(LAYOUT)))
        bad = Header(good_type, TASK, 1, peer, num_examples=5, chunk=draw(st.integers(0, chunks - 1)), chunks=chunks)
        return kind, HOST, _hello(peer) + _frame(bad, payload), frozenset({"bad_chunk"}), None
    if case == "tensors":  # names, shapes, dtypes or values (NaN, inf) that are not the chunk's
        k, bad_payload = draw(chunk_payloads())
        try:
            parse_chunk(bytearray(bad_payload), LAYOUT[k])
        except FrameError:
            pass
        else:
            bad_payload += b"\0"  # it came out right: one byte too many makes it wrong
        bad = Header(good_type, TASK, 1, peer, num_examples=5, chunk=k, chunks=len(LAYOUT))
        return kind, HOST, _hello(peer) + _frame(bad, bytes(bad_payload)), frozenset({"bad_payload", "bad_tensors"}), None
    if case == "digest":
        where = draw(st.integers(0, len(payload) - 1))
        flipped = payload[:where] + bytes([payload[where] ^ draw(st.integers(1, 255))]) + payload[where + 1:]
        return kind, HOST, _hello(peer) + fixed + header.to_json() + flipped, frozenset({"bad_checksum"}), None
    if case == "length":  # the fixed header's payload length disagrees with the JSON header, or the payload ends early
        if draw(st.booleans()):
            plen = draw(st.integers(0, 2 * len(payload)).filter(lambda n: n != len(payload)))
            data = FIXED.pack(MAGIC, VERSION, 0, 0, len(header.to_json()), plen) + header.to_json() + payload
            return kind, HOST, _hello(peer) + data, frozenset({"bad_header"}), None
        return kind, HOST, _hello(peer) + fixed + header.to_json() + payload[: draw(st.integers(0, len(payload) - 1))
                                                                             ], frozenset({"truncated"}), None
    # oversize: a payload beyond what any chunk of this model needs (checked before it is read)
    plen = draw(st.integers(max(c.nbytes for c in LAYOUT) + 64 * 1024 + 1, 2**64 - 1))
    return kind, HOST, _hello(peer) + FIXED.pack(MAGIC, VERSION, 0, 0, 2, plen) + b"{}", frozenset({"oversized"}), None


def _is_good_empty_frame(h: Harness, kind: str, raw: bytes) -> bool:
    """Whether a frame with this JSON header and no payload passes every check on `kind`'s port."""
    peer = "G" if kind == "broadcast" else "L2"
    try:
        header = Header.from_json(raw)
        if header.sender != peer or header.task != TASK or header.nbytes != 0:
            return False
        h.agent.engine.check_frame(kind, peer, header, bytearray())
    except FrameError:
        return False
    return True


@FUZZ
@given(bad=bad_connections())
def test_a_listener_rejects_every_bad_connection_with_a_logged_reason_and_keeps_serving(
    agent: Harness, bad: tuple[str, str, bytes, frozenset[str], bytes | None]
) -> None:
    kind, source, data, reasons, raw = bad
    if raw is not None:
        assume(not _is_good_empty_frame(agent, kind, raw))
    peak_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    _send(agent.ports[kind], data, source=source)

    event = agent.wait_rejected()
    assert event["reason"] in reasons and event["port_kind"] == kind and event["detail"], event
    _good_peer_is_served(agent)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - peak_before < MEMORY_GROWTH_BYTES


# -- the site server's control channel -----------------------------------------------------------------
@dataclass
class Control:
    sock: socket.socket
    out: IO[str]
    server: SiteServer

    def ask(self, body: bytes) -> dict[str, Any]:
        self.sock.sendall(struct.pack(">I", len(body)) + body)
        head = self._exact(4)
        return dict(json.loads(self._exact(struct.unpack(">I", head)[0])))

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            got = self.sock.recv(n - len(buf))
            assert got, "the site server closed its control connection"
            buf += got
        return buf


@contextlib.contextmanager
def _served(server: SiteServer, path: Path, out_path: Path) -> Iterator[tuple[socket.socket, threading.Thread,
                                                                               list[int]]]:
    """`serve(server)` on a thread, once it has written its first line to `out_path`; a connection
    to its control socket; the list its exit status goes into."""
    with out_path.open("w", encoding="utf-8") as out:
        result: list[int] = []
        t = threading.Thread(target=lambda: result.append(serve(server, path, out=out)), daemon=True)
        t.start()
        deadline = time.monotonic() + TIMEOUT_S
        while not out_path.read_text():
            assert time.monotonic() < deadline, "the site server did not start"
            time.sleep(0.01)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(TIMEOUT_S)
            sock.connect(str(path))
            yield sock, t, result


@pytest.fixture(scope="module")
def control(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Control]:
    root = tmp_path_factory.mktemp("site")
    (root / "logs" / "t1").mkdir(parents=True)
    (root / "cache").mkdir()
    server = SiteServer(site="A", address="127.0.0.9", log_root=root / "logs", cache_dir=root / "cache")
    out_path = root / "server.out"
    with _served(server, root / "control.sock", out_path) as (sock, t, result), \
            out_path.open(encoding="utf-8") as reader:
        reader.readlines()
        yield Control(sock, reader, server)
        send_message(sock, {"op": "shutdown"})
        t.join(timeout=TIMEOUT_S)
    assert result == [0]


def _agent_config(**over: Any) -> dict[str, Any]:
    cfg = AgentConfig(task=1, site="A", host="127.0.0.9", broadcast_port=20000, upload_port=20001, rounds=1,
                      broadcast_parent=Peer(site="G", host="127.0.0.8"), upload_parent=Peer(site="G", host="127.0.0.8"),
                      part_index=0)
    return cfg.to_dict() | over


_CONFIG = _agent_config()
#: Events paths a role may never get (so that no request can start one).
bad_events = st.sampled_from(["../A.events.jsonl", "/etc/A.events.jsonl", "nodir/A.events.jsonl", "t1",
                              "t1/A.out.txt", "", "t1/../../x.events.jsonl"]) | st.text(max_size=20).filter(
    lambda t: not t.endswith(".events.jsonl"))
control_requests = st.one_of(
    st.fixed_dictionaries({"op": st.sampled_from(["hello", "status", "shutdown", "stop", "forget", "put_module",
                                                  "start", "launch", ""]) | json_values},
                          optional={"task": json_values, "digest": st.text(max_size=70) | json_values,
                                    "source": json_values, "config": json_values, "events": bad_events | json_values,
                                    "checkpoint": json_values, "init_model": json_values, "extra": json_values}),
    st.builds(lambda key, value, events: {"op": "start", "config": {**_CONFIG, key: value}, "events": events},
              st.sampled_from(sorted(_CONFIG)) | st.text(max_size=8), json_values, bad_events),
    st.builds(lambda key, events: {"op": "start", "config": {k: v for k, v in _CONFIG.items() if k != key},
                                   "events": events}, st.sampled_from(sorted(_CONFIG)), bad_events),
    st.builds(lambda source, digest: {"op": "put_module", "source": source, "digest": digest},
              st.text(max_size=50), st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)),
)


def _accepted(msg: dict[str, Any]) -> bool:
    """Whether the server would carry the request out (hello, status, shutdown, a matching put_module)."""
    try:
        op = check_request(msg)
    except ProtocolError:
        return False
    if op == "put_module":
        return module_digest(msg["source"]) == msg["digest"]
    return op in ("hello", "status", "shutdown")


@FUZZ
@given(body=st.one_of(odd_json, control_requests.map(
    lambda m: json.dumps(m, ensure_ascii=False).encode("utf-8", "surrogatepass"))))
def test_the_control_channel_refuses_bad_requests_logs_them_and_keeps_serving(control: Control, body: bytes) -> None:
    assume(len(body) <= MAX_MESSAGE_BYTES)
    try:
        msg = json.loads(body)
    except (ValueError, RecursionError):
        msg = None
    assume(not (isinstance(msg, dict) and _accepted(msg)))

    reply = control.ask(body)

    assert reply["ok"] is False and isinstance(reply["error"], str) and reply["error"], reply
    logged = control.out.readlines()
    assert len(logged) == 1 and logged[0].startswith("rejected control "), logged
    assert control.ask(b'{"op":"hello"}')["ok"] is True
    assert control.server.roles == {}


@pytest.mark.parametrize("data", [struct.pack(">I", MAX_MESSAGE_BYTES + 1), struct.pack(">I", 100) + b'{"op":'])
def test_a_broken_control_stream_ends_the_server_as_a_closed_connection_does(tmp_path: Path, data: bytes) -> None:
    server = SiteServer(site="A", address="127.0.0.9", log_root=tmp_path, cache_dir=tmp_path)
    out_path = tmp_path / "server.out"
    with _served(server, tmp_path / "control.sock", out_path) as (sock, t, result):
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        t.join(timeout=TIMEOUT_S)

    assert result == [0]
    assert "control connection lost" in out_path.read_text()
