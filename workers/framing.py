"""The workers' wire format on bytes: frames carrying tensor sets as safetensors (no sockets here).

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
import math
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import torch
from safetensors.torch import load as st_load

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
Buffer = bytes | memoryview

#: safetensors dtype names (https://github.com/huggingface/safetensors, "Format").
_ST_DTYPES: Final = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


def safetensors_pieces(tensors: Mapping[str, torch.Tensor]) -> list[Buffer]:
    """A tensor set in the safetensors format as buffers that view the tensors' memory (no copy).

    The format: an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
    data_offsets; padded with spaces to a multiple of 8 bytes), then the tensors' raw bytes.
    `safetensors.torch.load` of the joined pieces returns the same tensors.
    """
    header: dict[str, Any] = {}
    views: list[Buffer] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        if t.dtype not in _ST_DTYPES:
            raise ValueError(f"{name}: dtype {t.dtype} has no safetensors name")
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        if nbytes:
            views.append(memoryview(t.reshape(-1).view(torch.uint8).numpy()))  # type: ignore[arg-type]
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return [struct.pack("<Q", len(raw)) + raw, *views]


def encode_frame(header: Header, payload: Buffer | list[Buffer]) -> list[Buffer]:
    """The buffers of one frame: fixed header + JSON header, then the payload's buffers.

    `header.nbytes` and `header.sha256` are filled in from `payload`.
    """
    parts = payload if isinstance(payload, list) else [payload]
    digest = hashlib.sha256()
    size = 0
    for p in parts:
        digest.update(p)
        size += len(p) if isinstance(p, bytes) else p.nbytes
    h = Header(
        type=header.type,
        task=header.task,
        round=header.round,
        sender=header.sender,
        num_examples=header.num_examples,
        nbytes=size,
        sha256=digest.hexdigest() if size else "",
        chunk=header.chunk,
        chunks=header.chunks,
    ).to_json()
    return [FIXED.pack(MAGIC, VERSION, 0, 0, len(h), size) + h, *parts]


def split_tensors(tensors: Mapping[str, torch.Tensor], max_chunk_bytes: int | None) -> list[TensorSet]:
    """Group tensors (in name order) into chunks of at most `max_chunk_bytes`; a tensor larger
    than that is cut along its first dimension (``name`` becomes ``name@<first row>/<rows>``;
    `SliceAssembler` puts it back together). None or 0: a single chunk."""
    names = sorted(tensors)
    if not max_chunk_bytes:
        return [{n: tensors[n] for n in names}]
    pieces: list[tuple[str, torch.Tensor]] = []
    for n in names:
        t = tensors[n]
        row = t[0].numel() * t.element_size() if t.dim() > 0 and t.shape[0] > 0 else 0
        if t.dim() > 0 and row and t.numel() * t.element_size() > max_chunk_bytes and t.shape[0] > 1:
            step = max(1, max_chunk_bytes // row)
            rows = t.shape[0]
            pieces += [(f"{n}{SLICE_MARK}{i}/{rows}", t[i : i + step]) for i in range(0, rows, step)]
        else:
            pieces.append((n, t))
    chunks: list[TensorSet] = []
    cur: TensorSet = {}
    size = 0
    for n, t in pieces:
        nb = t.numel() * t.element_size()
        if cur and size + nb > max_chunk_bytes:
            chunks.append(cur)
            cur, size = {}, 0
        cur[n] = t
        size += nb
    chunks.append(cur)
    return chunks


#: Separates a tensor's name from ``<first row>/<rows>`` of one of its slices.
SLICE_MARK: Final = "@"


class SliceAssembler:
    """Collects the tensors of a message's chunks; slices are copied into their whole tensor as
    they arrive (so joining overlaps the transfer). Thread-safe.

    Parameters
    ----------
    max_bytes
        Bound on a whole tensor announced by its slices (the message's payload limit), so a
        header cannot make the receiver allocate more than the sender could send.
    """

    def __init__(self, *, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.tensors: TensorSet = {}
        self._rows: dict[str, tuple[int, list[tuple[int, int]]]] = {}
        self._lock = threading.Lock()

    def add(self, part: Mapping[str, torch.Tensor], header: Header | None = None) -> None:
        """Add one chunk's tensors. Raises `FrameError` (``bad_chunk``) on a clash or bad slice."""
        for name, t in part.items():
            if SLICE_MARK not in name:
                with self._lock:
                    if name in self.tensors:
                        raise FrameError("bad_chunk", f"tensor {name} appears twice", header)
                    self.tensors[name] = t
                continue
            base, _, where = name.rpartition(SLICE_MARK)
            first_s, _, total_s = where.partition("/")
            if not (first_s.isdigit() and total_s.isdigit()) or t.dim() == 0:
                raise FrameError("bad_chunk", f"bad slice name {name!r}", header)
            first, total, rows = int(first_s), int(total_s), int(t.shape[0])
            if first + rows > total or total * (t[0].numel() if rows else 0) * t.element_size() > self.max_bytes:
                raise FrameError("bad_chunk", f"slice {name!r} of {rows} rows does not fit", header)
            with self._lock:
                whole = self.tensors.get(base)
                if whole is None:
                    if base in self._rows:
                        raise FrameError("bad_chunk", f"{base} clashes with another tensor", header)
                    whole = torch.empty((total, *t.shape[1:]), dtype=t.dtype)
                    self.tensors[base] = whole
                    self._rows[base] = (total, [])
                elif base not in self._rows or whole.shape[1:] != t.shape[1:] or whole.dtype != t.dtype \
                        or whole.shape[0] != total:
                    raise FrameError("bad_chunk", f"slice {name!r} does not match {base}", header)
                self._rows[base][1].append((first, rows))
            whole[first : first + rows] = t  # outside the lock: slices of one tensor are disjoint rows

    def result(self) -> TensorSet:
        """The whole tensors. Raises `FrameError` if a sliced tensor's rows are not covered once."""
        for base, (total, spans) in self._rows.items():
            row = 0
            for first, rows in sorted(spans):
                if first != row:
                    raise FrameError("bad_chunk", f"slices of {base} do not tile it (row {first}, expected {row})")
                row += rows
            if row != total:
                raise FrameError("bad_chunk", f"slices of {base} cover {row} of {total} rows")
        return self.tensors


def merge_slices(tensors: TensorSet) -> TensorSet:
    """Join ``name@<first row>/<rows>`` slices back into ``name`` (see `SliceAssembler`)."""
    asm = SliceAssembler(max_bytes=sum(t.numel() * t.element_size() for t in tensors.values()))
    asm.add(tensors)
    return asm.result()


def encode_message(
    *,
    type: str,
    task: int,
    round: int,
    sender: str,
    tensors: Mapping[str, torch.Tensor] | None = None,
    num_examples: int = 0,
    max_chunk_bytes: int | None = None,
) -> list[Buffer]:
    """All buffers of a message (one or more frames); tensor memory is viewed, not copied, so the
    tensors must not change until the message is sent."""
    if type not in MESSAGE_TYPES:
        raise ValueError(f"unknown message type {type!r}")
    if not tensors:
        return encode_frame(Header(type, task, round, sender, num_examples), b"")
    groups = split_tensors(tensors, max_chunk_bytes)
    pieces: list[Buffer] = []
    for i, group in enumerate(groups):
        pieces += encode_frame(
            Header(type, task, round, sender, num_examples, chunk=i, chunks=len(groups)),
            safetensors_pieces(group),
        )
    return pieces


def message_bytes(pieces: Sequence[Buffer]) -> bytes:
    """The pieces joined (tests and tools; senders use `send_message`)."""
    return b"".join(bytes(p) for p in pieces)


def _verify(header: Header, payload: bytes) -> None:
    if payload and hashlib.sha256(payload).hexdigest() != header.sha256:
        raise FrameError("bad_checksum", "payload SHA-256 does not match the header", header)


def decode_payload(payload: bytes) -> TensorSet:
    """Parse a safetensors payload (never pickle). Raises `FrameError` if it does not parse."""
    if not payload:
        return {}
    try:
        return dict(st_load(payload))
    except Exception as e:  # safetensors raises its own error types
        raise FrameError("bad_payload", f"payload is not a valid safetensors blob: {e}") from e


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
        # NaN and inf propagate through a sum, so a finite sum means finite elements; only when the
        # sum is not finite (or overflowed) the exact, slower elementwise check decides
        if t.is_floating_point() and t.numel() and not math.isfinite(float(t.sum())) \
                and not bool(torch.isfinite(t).all()):
            raise FrameError("bad_tensors", f"{name}: non-finite values")
