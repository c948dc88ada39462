"""The workers' wire format on bytes: frames carrying tensor sets as safetensors (no sockets here).

A frame is::

    fixed header (20 bytes, big endian)       JSON header (header_len bytes, UTF-8)    payload
    magic b"NAI2" | version u8 | flags u8 |   {"type", "task", "round", "sender",      safetensors
    reserved u16 | header_len u32 |            "num_examples", "nbytes", "digest",      bytes
    payload_len u64                            "chunk", "chunks"}                       (nbytes)

A model travels as ``chunks`` frames. Every node of a task cuts the model the same way
(`chunk_layout` of the task's template and chunk size), so chunk k of a GLOBAL or of any UPDATE
holds the same tensor pieces everywhere: a relay forwards chunk k as soon as it is checked, and an
aggregator combines chunk k of several updates without waiting for the rest.

Integrity: ``digest`` is the XXH3-128 of the payload. It detects corruption and framing errors
(a torn or misaligned stream) at memory speed; it does not authenticate the sender, which the
transport does by address and HELLO on connections it expects (`workers.transport`). A SHA-256
per chunk capped the agent at a fraction of a veth's rate on two cores.

What this module must never do: execute anything from the wire. No pickle, no ``torch.load``:
a payload is parsed (`parse_chunk`) only after the length limits and the digest check, strictly
against the chunk it must be (names, dtypes, shapes, contiguous offsets), and its values must be
finite. Every rejection raises `FrameError` with a reason that the agent logs.
"""

from __future__ import annotations

import json
import math
import struct
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import torch
import xxhash

MAGIC: Final = b"NAI2"
VERSION: Final = 2
FIXED = struct.Struct(">4sBBHIQ")
FIXED_LEN: Final = FIXED.size  # 20
MAX_HEADER_BYTES: Final = 64 * 1024
MAX_CHUNKS: Final = 4096

#: Message types. GLOBAL: the global weights, parent -> child (broadcast port).
#: UPDATE: a (partial) aggregate with its example count, child -> parent (upload port); each
#: chunk carries the example count of what was aggregated into it.
#: HELLO: the first frame on a connection, naming the sender (no payload).
#: READY: child -> parent on the upload connection: this node's subtree is connected (no payload).
#: STOP: end the task early (no payload).
MESSAGE_TYPES: Final = frozenset({"GLOBAL", "UPDATE", "HELLO", "READY", "STOP"})
HEADER_KEYS: Final = frozenset(
    {"type", "task", "round", "sender", "num_examples", "nbytes", "digest", "chunk", "chunks", "meta"}
)

TensorSet = dict[str, torch.Tensor]

#: Separates a tensor's name from ``<first row>/<rows>`` of one of its slices (`split_tensors`).
SLICE_MARK: Final = "@"


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
    digest: str = ""
    chunk: int = 0
    chunks: int = 1
    #: Small JSON metadata of the round (local-model selection: ``select`` on GLOBAL, ``stats`` on
    #: UPDATE and READY; `workers.selection` validates its content). None: not sent at all.
    meta: Mapping[str, Any] | None = field(default=None, hash=False)

    def to_json(self) -> bytes:
        extra = {} if self.meta is None else {"meta": self.meta}
        return json.dumps(
            {
                "type": self.type,
                "task": self.task,
                "round": self.round,
                "sender": self.sender,
                "num_examples": self.num_examples,
                "nbytes": self.nbytes,
                "digest": self.digest,
                "chunk": self.chunk,
                "chunks": self.chunks,
                **extra,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Header:
        """Parse and validate a JSON header. Raises `FrameError` on anything unexpected."""
        try:
            d = json.loads(raw.decode("utf-8"))
        except RecursionError:
            raise FrameError("bad_header", "JSON header nested too deeply") from None
        except ValueError as e:  # bad UTF-8, bad JSON, or a number too long to convert
            raise FrameError("bad_header", f"JSON header does not parse: {e}") from e
        if not isinstance(d, dict):
            raise FrameError("bad_header", "JSON header is not an object")
        unknown = set(d) - HEADER_KEYS
        missing = {"type", "task", "round", "sender"} - set(d)
        if unknown or missing:
            raise FrameError(
                "bad_header", f"unknown keys {sorted(unknown)} / missing keys {sorted(missing)}"
            )
        if not isinstance(d["type"], str) or d["type"] not in MESSAGE_TYPES:
            raise FrameError("bad_header", f"unknown message type {d['type']!r}")
        ints: dict[str, int] = {}
        for k, default in (("task", None), ("round", None), ("num_examples", 0), ("nbytes", 0),
                           ("chunk", 0), ("chunks", 1)):
            v = d.get(k, default)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise FrameError("bad_header", f"{k} must be a non-negative integer, got {v!r}")
            ints[k] = v
        if not isinstance(d["sender"], str) or not isinstance(d.get("digest", ""), str):
            raise FrameError("bad_header", "sender and digest must be strings")
        if not 1 <= ints["chunks"] <= MAX_CHUNKS or ints["chunk"] >= ints["chunks"]:
            raise FrameError("bad_header", f"chunk {ints['chunk']} of {ints['chunks']} is out of range")
        meta = d.get("meta")
        if meta is not None and not isinstance(meta, dict):
            raise FrameError("bad_header", "meta must be a JSON object")
        return cls(
            type=d["type"],
            task=ints["task"],
            round=ints["round"],
            sender=d["sender"],
            num_examples=ints["num_examples"],
            nbytes=ints["nbytes"],
            digest=d.get("digest", ""),
            chunk=ints["chunk"],
            chunks=ints["chunks"],
            meta=meta,
        )


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

    `header.nbytes` and `header.digest` are filled in from `payload`.
    """
    parts = payload if isinstance(payload, list) else [payload]
    digest = xxhash.xxh3_128()
    for p in parts:
        digest.update(p)
    size = _size(parts)
    return [_header_bytes(replace(header, nbytes=size, digest=digest.hexdigest() if size else "")), *parts]


def _size(parts: list[Buffer]) -> int:
    return sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)


def _header_bytes(header: Header) -> bytes:
    """The fixed header and the JSON header of a frame whose payload has `header.nbytes` bytes."""
    h = header.to_json()
    return FIXED.pack(MAGIC, VERSION, 0, 0, len(h), header.nbytes) + h


def split_tensors(tensors: Mapping[str, torch.Tensor], max_chunk_bytes: int | None) -> list[TensorSet]:
    """Group tensors (in name order) into chunks of at most `max_chunk_bytes`; a tensor larger
    than that is cut along its first dimension (``name`` becomes ``name@<first row>/<rows>``;
    the receiver copies each slice into place). None or 0: a single chunk."""
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


def verify_payload(header: Header, payload: bytes | bytearray) -> None:
    """Check a frame's payload against the digest its header carries (FrameError ``bad_checksum``)."""
    if payload and xxhash.xxh3_128_hexdigest(payload) != header.digest:
        raise FrameError("bad_checksum", "payload digest does not match the header", header)


# -- the chunk layout of a task's model -----------------------------------------------------------
@dataclass(frozen=True)
class PieceSpec:
    """One tensor piece of a chunk: a whole tensor (`first_row` None) or rows of one."""

    name: str
    base: str
    first_row: int | None
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def view(self, whole: torch.Tensor) -> torch.Tensor:
        """This piece of the whole tensor `whole` (a view: writing to it writes `whole`)."""
        return whole if self.first_row is None else whole[self.first_row : self.first_row + self.shape[0]]


@dataclass(frozen=True)
class ChunkSpec:
    """Chunk `index` of a model: its pieces in name order (the safetensors order)."""

    index: int
    pieces: tuple[PieceSpec, ...]

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)


def chunk_layout(template: Mapping[str, torch.Tensor], max_chunk_bytes: int | None) -> tuple[ChunkSpec, ...]:
    """How every node of a task cuts the model into chunks (`split_tensors` of the template).

    Nodes with the same template and chunk size get the same layout, so chunk k means the same
    tensor pieces at a sender, a relay and an aggregator.
    """
    chunks = []
    for i, group in enumerate(split_tensors(template, max_chunk_bytes)):
        pieces = []
        for name in sorted(group):
            base, mark, where = name.rpartition(SLICE_MARK)
            first = int(where.partition("/")[0]) if mark else None
            pieces.append(PieceSpec(name=name, base=base if mark else name, first_row=first,
                                    shape=tuple(group[name].shape), dtype=group[name].dtype))
        chunks.append(ChunkSpec(index=i, pieces=tuple(pieces)))
    return tuple(chunks)


def chunk_view(state: Mapping[str, torch.Tensor], spec: ChunkSpec) -> TensorSet:
    """The pieces of chunk `spec` as views of the whole tensors in `state` (no copy)."""
    return {p.name: p.view(state[p.base]) for p in spec.pieces}


def encode_chunk(header: Header, tensors: Mapping[str, torch.Tensor] | None) -> list[Buffer]:
    """The buffers of one chunk frame (the tensors' memory is viewed, not copied)."""
    return list(LazyFrame(header, tensors))


#: Characters of an XXH3-128 hex digest.
DIGEST_CHARS: Final = 2 * xxhash.xxh3_128().digest_size


def frame_sizes(template: Mapping[str, torch.Tensor], max_chunk_bytes: int | None) -> tuple[int, ...]:
    """The bytes of each chunk frame of one copy of a model shaped like `template`, cut at
    `max_chunk_bytes` (`chunk_layout`): its tensors' bytes with the frame's fixed and JSON headers
    and its safetensors header (`LazyFrame.nbytes`; nothing is hashed). The header is an UPDATE's
    with no metadata, a 16-character sender and 4-digit task, round and example count; a GLOBAL's
    differs by a few bytes a chunk (`tests/unit/test_frame_overhead.py` checks the bound). The
    flow-level simulation sends these frames over each link a copy crosses."""
    layout = chunk_layout(template, max_chunk_bytes)
    return tuple(LazyFrame(Header("UPDATE", 1000, 1000, "s" * 16, num_examples=1000, chunk=c.index,
                                  chunks=len(layout)), chunk_view(template, c)).nbytes for c in layout)


class LazyFrame(Sequence[Buffer]):
    """One chunk frame whose digest is computed when its buffers are first read, once for every
    connection it goes to.

    The round engine queues a model's chunks at once; their bytes are hashed by the sender thread
    that writes them, right before the write. So the payload is read from memory once, by the
    thread that sends it, and written to the socket from the cache, instead of hashed by the
    engine's thread while the sender writes earlier chunks (a third busy thread on two cores, and
    a second pass over the model from memory). The tensors must not change until it is sent, as
    for an eagerly encoded frame.
    """

    def __init__(self, header: Header, tensors: Mapping[str, torch.Tensor] | None) -> None:
        self._header = header
        self._payload: list[Buffer] = safetensors_pieces(tensors) if tensors else [b""]
        self._buffers: list[Buffer] | None = None
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        """The frame's size in bytes (known without hashing: the digest has a fixed length)."""
        size = _size(self._payload)
        h = replace(self._header, nbytes=size, digest="0" * DIGEST_CHARS if size else "")
        return FIXED_LEN + len(h.to_json()) + size

    def _encoded(self) -> list[Buffer]:
        with self._lock:
            if self._buffers is None:
                self._buffers = encode_frame(self._header, self._payload)
            return self._buffers

    def __len__(self) -> int:
        return len(self._encoded())

    def __getitem__(self, i: Any) -> Any:  # Sequence's int and slice overloads
        return self._encoded()[i]

    def __iter__(self) -> Iterator[Buffer]:
        return iter(self._encoded())


def reheader(header: Header, *, sender: str) -> bytes:
    """The fixed + JSON header of a frame forwarded unchanged but for its sender (a relay's
    GLOBAL chunk: the payload and its digest are reused as received)."""
    return _header_bytes(replace(header, sender=sender))


def parse_chunk(payload: bytearray, spec: ChunkSpec, header: Header | None = None) -> TensorSet:
    """The tensors of a checked chunk payload, as views of `payload` (no copy; never pickle).

    The safetensors header must name exactly the pieces of `spec`, with their dtypes and shapes,
    at contiguous offsets that cover the payload; floating-point values must be finite.

    Raises
    ------
    FrameError
        ``bad_payload`` (not a safetensors blob of this chunk) or ``bad_tensors`` (names, dtypes,
        shapes or values differ from the chunk's).
    """
    if len(payload) < 8:
        raise FrameError("bad_payload", f"payload of {len(payload)} bytes has no safetensors header", header)
    (hlen,) = struct.unpack_from("<Q", payload, 0)
    if hlen > min(len(payload) - 8, MAX_HEADER_BYTES):
        raise FrameError("bad_payload", f"safetensors header of {hlen} bytes does not fit", header)
    try:
        meta = json.loads(bytes(payload[8 : 8 + hlen]).decode("utf-8"))
    except RecursionError:
        raise FrameError("bad_payload", "safetensors header nested too deeply", header) from None
    except ValueError as e:  # bad UTF-8, bad JSON, or a number too long to convert
        raise FrameError("bad_payload", f"safetensors header does not parse: {e}", header) from e
    if not isinstance(meta, dict) or set(meta) != {p.name for p in spec.pieces}:
        got = sorted(meta)[:3] if isinstance(meta, dict) else type(meta).__name__
        raise FrameError("bad_tensors", f"chunk {spec.index} must hold {[p.name for p in spec.pieces][:3]}..., "
                         f"got {got}", header)
    base = 8 + hlen
    if len(payload) - base < spec.nbytes:  # before any tensor is viewed: the header may promise more
        raise FrameError("bad_payload", f"payload holds {len(payload) - base} tensor bytes, chunk {spec.index} "
                         f"needs {spec.nbytes}", header)
    offset = 0
    out: TensorSet = {}
    for p in spec.pieces:
        entry = meta[p.name]
        expected = {"dtype": _ST_DTYPES[p.dtype], "shape": list(p.shape), "data_offsets": [offset, offset + p.nbytes]}
        if entry != expected:
            raise FrameError("bad_tensors", f"{p.name}: {entry}, expected {expected}", header)
        n = math.prod(p.shape)
        t = (torch.frombuffer(payload, dtype=p.dtype, count=n, offset=base + offset) if n
             else torch.empty(0, dtype=p.dtype)).view(p.shape)
        # NaN and inf propagate through a sum: only a non-finite sum needs the elementwise check
        if t.is_floating_point() and n and not math.isfinite(float(t.sum())) and not bool(torch.isfinite(t).all()):
            raise FrameError("bad_tensors", f"{p.name}: non-finite values", header)
        out[p.name] = t
        offset += p.nbytes
    if base + offset != len(payload):
        raise FrameError("bad_payload", f"payload has {len(payload) - base - offset} bytes beyond its tensors", header)
    return out
