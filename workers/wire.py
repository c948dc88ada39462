"""The workers' wire format: framed TCP messages carrying tensor sets as safetensors.

A frame is::

    fixed header (20 bytes, big endian)       JSON header (header_len bytes, UTF-8)    payload
    magic b"NAI1" | version u8 | flags u8 |   {"type", "task", "round", "sender",      safetensors
    reserved u16 | header_len u32 |            "num_examples", "nbytes", "sha256",      bytes
    payload_len u64                            "chunk", "chunks"}                       (nbytes)

A tensor set may travel as several frames (``chunks`` > 1), each a safetensors blob holding a
disjoint subset of the tensors, so a later pipelined transfer can cut a model into pieces without a
format change. `read_message` reassembles them.

What this module must never do: execute anything from the wire. No pickle, no ``torch.load``:
payloads are parsed by safetensors only, after the length limits and the SHA-256 check, and the
tensors are then checked against an expected template (names, shapes, dtypes) by `check_tensors`.
Every rejection raises `FrameError` with a reason that the agent logs.
"""

from __future__ import annotations

import hashlib
import json
import socket
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

MAGIC: Final = b"NAI1"
VERSION: Final = 1
FIXED = struct.Struct(">4sBBHIQ")
FIXED_LEN: Final = FIXED.size  # 20
MAX_HEADER_BYTES: Final = 64 * 1024
#: Default payload limit; agents pass a tighter one derived from their model's size.
DEFAULT_MAX_PAYLOAD_BYTES: Final = 2 * 1024**3
MAX_CHUNKS: Final = 4096

#: Message types. GLOBAL: the global weights, parent -> child (broadcast port).
#: UPDATE: a (partial) aggregate with its example count, child -> parent (upload port).
#: STOP: end the task early (no payload).
MESSAGE_TYPES: Final = frozenset({"GLOBAL", "UPDATE", "STOP"})
HEADER_KEYS: Final = frozenset(
    {"type", "task", "round", "sender", "num_examples", "nbytes", "sha256", "chunk", "chunks"}
)

TensorSet = dict[str, torch.Tensor]


class FrameError(ValueError):
    """A frame was rejected. `reason` is a short machine-friendly tag, the message says why."""

    def __init__(self, reason: str, message: str, header: Header | None = None) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        #: The frame's header when it parsed (lets the receiver stop waiting for that sender).
        self.header = header


@dataclass(frozen=True)
class Header:
    """The JSON header of one frame."""

    type: str
    task: int
    round: int
    sender: str
    num_examples: int = 0
    nbytes: int = 0
    sha256: str = ""
    chunk: int = 0
    chunks: int = 1

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "type": self.type,
                "task": self.task,
                "round": self.round,
                "sender": self.sender,
                "num_examples": self.num_examples,
                "nbytes": self.nbytes,
                "sha256": self.sha256,
                "chunk": self.chunk,
                "chunks": self.chunks,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Header:
        """Parse and validate a JSON header. Raises `FrameError` on anything unexpected."""
        try:
            d = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FrameError("bad_header", f"JSON header does not parse: {e}") from e
        if not isinstance(d, dict):
            raise FrameError("bad_header", "JSON header is not an object")
        unknown = set(d) - HEADER_KEYS
        missing = {"type", "task", "round", "sender"} - set(d)
        if unknown or missing:
            raise FrameError(
                "bad_header", f"unknown keys {sorted(unknown)} / missing keys {sorted(missing)}"
            )
        if d["type"] not in MESSAGE_TYPES:
            raise FrameError("bad_header", f"unknown message type {d['type']!r}")
        ints: dict[str, int] = {}
        for k, default in (("task", None), ("round", None), ("num_examples", 0), ("nbytes", 0),
                           ("chunk", 0), ("chunks", 1)):
            v = d.get(k, default)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise FrameError("bad_header", f"{k} must be a non-negative integer, got {v!r}")
            ints[k] = v
        if not isinstance(d["sender"], str) or not isinstance(d.get("sha256", ""), str):
            raise FrameError("bad_header", "sender and sha256 must be strings")
        if not 1 <= ints["chunks"] <= MAX_CHUNKS or ints["chunk"] >= ints["chunks"]:
            raise FrameError("bad_header", f"chunk {ints['chunk']} of {ints['chunks']} is out of range")
        return cls(
            type=d["type"],
            task=ints["task"],
            round=ints["round"],
            sender=d["sender"],
            num_examples=ints["num_examples"],
            nbytes=ints["nbytes"],
            sha256=d.get("sha256", ""),
            chunk=ints["chunk"],
            chunks=ints["chunks"],
        )


@dataclass
class Message:
    """A whole message: the first frame's header (chunk fields aside) and the merged tensors."""

    header: Header
    tensors: TensorSet = field(default_factory=dict)
    wire_bytes: int = 0


# -- encoding -------------------------------------------------------------------------------------
def encode_frame(header: Header, payload: bytes) -> list[bytes]:
    """The byte pieces of one frame (fixed header + JSON header, payload), for `sendmsg`-style IO.

    `header.nbytes` and `header.sha256` are filled in from `payload`.
    """
    h = Header(
        type=header.type,
        task=header.task,
        round=header.round,
        sender=header.sender,
        num_examples=header.num_examples,
        nbytes=len(payload),
        sha256=hashlib.sha256(payload).hexdigest() if payload else "",
        chunk=header.chunk,
        chunks=header.chunks,
    ).to_json()
    return [FIXED.pack(MAGIC, VERSION, 0, 0, len(h), len(payload)) + h, payload]


def split_tensors(tensors: Mapping[str, torch.Tensor], max_chunk_bytes: int | None) -> list[TensorSet]:
    """Group tensors (in name order) into chunks of at most `max_chunk_bytes` (one tensor may exceed
    it on its own). None or 0: a single chunk."""
    names = sorted(tensors)
    if not max_chunk_bytes:
        return [{n: tensors[n] for n in names}]
    chunks: list[TensorSet] = []
    cur: TensorSet = {}
    size = 0
    for n in names:
        t = tensors[n]
        nb = t.numel() * t.element_size()
        if cur and size + nb > max_chunk_bytes:
            chunks.append(cur)
            cur, size = {}, 0
        cur[n] = t
        size += nb
    chunks.append(cur)
    return chunks


def encode_message(
    *,
    type: str,
    task: int,
    round: int,
    sender: str,
    tensors: Mapping[str, torch.Tensor] | None = None,
    num_examples: int = 0,
    max_chunk_bytes: int | None = None,
) -> list[bytes]:
    """All byte pieces of a message (one or more frames)."""
    if type not in MESSAGE_TYPES:
        raise ValueError(f"unknown message type {type!r}")
    if not tensors:
        return encode_frame(Header(type, task, round, sender, num_examples), b"")
    groups = split_tensors(tensors, max_chunk_bytes)
    pieces: list[bytes] = []
    for i, group in enumerate(groups):
        payload = st_save({n: t.detach().contiguous().cpu() for n, t in group.items()})
        pieces += encode_frame(
            Header(type, task, round, sender, num_examples, chunk=i, chunks=len(groups)), payload
        )
    return pieces


def send_message(sock: socket.socket, pieces: list[bytes]) -> int:
    """Send encoded pieces; returns the bytes sent."""
    total = 0
    for p in pieces:
        if p:
            sock.sendall(p)
            total += len(p)
    return total


# -- decoding -------------------------------------------------------------------------------------
def _recv_exact(sock: socket.socket, n: int, what: str) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 4 * 1024 * 1024))
        if k == 0:
            raise FrameError("truncated", f"connection closed after {got} of {n} bytes of {what}")
        got += k
    return bytes(buf)


def read_frame(
    sock: socket.socket, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> tuple[Header, bytes] | None:
    """Read one frame. Returns None on a clean end of stream before a frame starts.

    Raises
    ------
    FrameError
        Bad magic/version, oversized header or payload (checked before reading it), a header that
        does not parse or disagrees with the fixed header, a truncated frame, a SHA-256 mismatch.
    """
    first = sock.recv(FIXED_LEN)
    if not first:
        return None
    fixed = first if len(first) == FIXED_LEN else first + _recv_exact(sock, FIXED_LEN - len(first), "fixed header")
    magic, version, _flags, _reserved, header_len, payload_len = FIXED.unpack(fixed)
    if magic != MAGIC:
        raise FrameError("bad_magic", f"frame starts with {magic!r}, not {MAGIC!r}")
    if version != VERSION:
        raise FrameError("bad_version", f"frame version {version}, this agent speaks {VERSION}")
    if header_len > MAX_HEADER_BYTES:
        raise FrameError("oversized", f"JSON header of {header_len} bytes exceeds {MAX_HEADER_BYTES}")
    if payload_len > max_payload_bytes:
        raise FrameError("oversized", f"payload of {payload_len} bytes exceeds the limit {max_payload_bytes}")
    header = Header.from_json(_recv_exact(sock, header_len, "JSON header"))
    if header.nbytes != payload_len:
        raise FrameError("bad_header", f"header says {header.nbytes} payload bytes, frame says {payload_len}")
    payload = _recv_exact(sock, payload_len, "payload") if payload_len else b""
    if payload and hashlib.sha256(payload).hexdigest() != header.sha256:
        raise FrameError("bad_checksum", "payload SHA-256 does not match the header")
    return header, payload


def decode_payload(payload: bytes) -> TensorSet:
    """Parse a safetensors payload (never pickle). Raises `FrameError` if it does not parse."""
    if not payload:
        return {}
    try:
        return dict(st_load(payload))
    except Exception as e:
        raise FrameError("bad_payload", f"payload is not a valid safetensors blob: {e}") from e


def read_message(
    sock: socket.socket, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> Message | None:
    """Read one message (all its chunks) from a connection; None on a clean end of stream.

    `max_payload_bytes` bounds the sum of all chunks' payloads.
    """
    got = read_frame(sock, max_payload_bytes=max_payload_bytes)
    if got is None:
        return None
    first, payload = got
    total = FIXED_LEN + len(payload)
    tensors = decode_payload(payload)
    budget = max_payload_bytes - len(payload)
    for i in range(1, first.chunks):
        nxt = read_frame(sock, max_payload_bytes=budget)
        if nxt is None:
            raise FrameError("truncated", f"stream ended after chunk {i} of {first.chunks}")
        h, payload = nxt
        if (h.type, h.task, h.round, h.sender, h.chunks, h.chunk) != (
            first.type, first.task, first.round, first.sender, first.chunks, i
        ):
            raise FrameError("bad_chunk", f"chunk {h.chunk} does not continue chunk {i - 1} of the message")
        budget -= len(payload)
        total += FIXED_LEN + len(payload)
        part = decode_payload(payload)
        dup = set(part) & set(tensors)
        if dup:
            raise FrameError("bad_chunk", f"tensors {sorted(dup)[:3]} appear in two chunks")
        tensors.update(part)
    return Message(header=first, tensors=tensors, wire_bytes=total)


def check_tensors(tensors: Mapping[str, torch.Tensor], template: Mapping[str, Any]) -> None:
    """Check names, shapes and dtypes of received tensors against a template state dict.

    Raises
    ------
    FrameError
        ``bad_tensors`` naming the first difference; non-finite values are rejected too.
    """
    if set(tensors) != set(template):
        missing = sorted(set(template) - set(tensors))[:3]
        extra = sorted(set(tensors) - set(template))[:3]
        raise FrameError("bad_tensors", f"tensor names differ: missing {missing}, unexpected {extra}")
    for name, ref in template.items():
        t = tensors[name]
        if tuple(t.shape) != tuple(ref.shape):
            raise FrameError("bad_tensors", f"{name}: shape {tuple(t.shape)}, expected {tuple(ref.shape)}")
        if t.dtype != ref.dtype:
            raise FrameError("bad_tensors", f"{name}: dtype {t.dtype}, expected {ref.dtype}")
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise FrameError("bad_tensors", f"{name}: non-finite values")
