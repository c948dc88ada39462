"""The wire format on bytes and on a socket pair: frames, digests, the chunk layout, strict chunk
parsing (never pickle), scatter/gather sends."""

from __future__ import annotations

import json
import os
import pickle
import socket
import struct
import threading
from pathlib import Path

import pytest
import torch
import xxhash

from workers.framing import (
    FIXED,
    MAGIC,
    VERSION,
    FrameError,
    Header,
    LazyFrame,
    chunk_layout,
    chunk_view,
    encode_chunk,
    encode_frame,
    parse_chunk,
    reheader,
    safetensors_pieces,
    split_tensors,
)
from workers.transport import read_frame, sendmsg_all

TEMPLATE = {"a.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4), "a.bias": torch.ones(4),
            "big": torch.randn(100, 7), "steps": torch.tensor(3, dtype=torch.int64)}


def _roundtrip(raw: bytes, max_payload_bytes: int = 1 << 20) -> tuple[Header, bytearray] | None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(raw)
        a.shutdown(socket.SHUT_WR)
        return read_frame(b, max_payload_bytes=max_payload_bytes)


def _join(pieces: list) -> bytes:
    return b"".join(bytes(p) for p in pieces)


def _frame(header: dict, payload: bytes, *, magic: bytes = MAGIC, version: int = VERSION) -> bytes:
    h = json.dumps(header).encode()
    return FIXED.pack(magic, version, 0, 0, len(h), len(payload)) + h + payload


def _good_header(payload: bytes) -> dict:
    return {"type": "GLOBAL", "task": 1, "round": 1, "sender": "G", "num_examples": 0,
            "nbytes": len(payload), "digest": xxhash.xxh3_128_hexdigest(payload), "chunk": 0, "chunks": 1}


def _chunk_payload(layout: tuple, k: int, state: dict | None = None) -> bytearray:
    pieces = encode_chunk(Header("GLOBAL", 1, 1, "G", chunk=k, chunks=len(layout)),
                          chunk_view(state or TEMPLATE, layout[k]))
    return bytearray(_join(pieces[1:]))


def test_layout_is_the_same_everywhere_and_covers_the_model_once() -> None:
    layout = chunk_layout(TEMPLATE, 7 * 4 * 30)  # "big" is cut into 30-row slices
    again = chunk_layout({k: torch.zeros_like(v) for k, v in TEMPLATE.items()}, 7 * 4 * 30)

    assert layout == again
    rows = sorted((p.first_row, p.shape[0]) for c in layout for p in c.pieces if p.base == "big")
    assert rows == [(0, 30), (30, 30), (60, 30), (90, 10)]
    assert sum(c.nbytes for c in layout) == sum(t.numel() * t.element_size() for t in TEMPLATE.values())


@pytest.mark.parametrize("chunk_bytes", [None, 1024, 7 * 4 * 30])
def test_every_chunk_round_trips_exactly_and_without_copy(chunk_bytes: int | None) -> None:
    layout = chunk_layout(TEMPLATE, chunk_bytes)
    state = {k: v.clone() for k, v in TEMPLATE.items()}

    rebuilt = {k: torch.zeros_like(v) for k, v in TEMPLATE.items()}
    for spec in layout:
        payload = _chunk_payload(layout, spec.index, state)
        parsed = parse_chunk(payload, spec)
        for p in spec.pieces:
            p.view(rebuilt[p.base]).copy_(parsed[p.name])
        # the parsed tensors view the payload's memory (no copy): a change to it shows through
        name, t = next((n, t) for n, t in parsed.items() if t.numel() and t.is_floating_point())
        before = t.flatten()[0].item()
        offset = payload.index(t.flatten()[:1].numpy().tobytes(), 8 + int.from_bytes(payload[:8], "little"))
        payload[offset : offset + 4] = struct.pack("<f", before + 1.0)
        changed = struct.unpack("<f", struct.pack("<f", before + 1.0))[0]
        assert parse_chunk(payload, spec)[name].flatten()[0].item() == t.flatten()[0].item() == changed
        payload[offset : offset + 4] = struct.pack("<f", before)

    assert all(torch.equal(rebuilt[k], state[k]) for k in TEMPLATE)


def test_a_frame_survives_a_socket_and_its_digest_is_checked() -> None:
    layout = chunk_layout(TEMPLATE, 1024)
    pieces = encode_chunk(Header("UPDATE", 5, 2, "L1", num_examples=42, chunk=1, chunks=len(layout)),
                          chunk_view(TEMPLATE, layout[1]))

    got = _roundtrip(_join(pieces))

    assert got is not None
    header, payload = got
    assert (header.type, header.task, header.round, header.sender, header.num_examples, header.chunk) == (
        "UPDATE", 5, 2, "L1", 42, 1)
    assert parse_chunk(payload, layout[1]).keys() == {p.name for p in layout[1].pieces}
    assert _roundtrip(b"") is None


def test_sendmsg_all_sends_every_buffer_in_order() -> None:
    bufs = [b"abc", memoryview(bytearray(b"0123456789" * 50_000)), b"", b"xyz"]
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(True)
        received = bytearray()

        def reader() -> None:
            while len(received) < 500_006:
                received.extend(b.recv(1 << 16))

        t = threading.Thread(target=reader)
        t.start()
        n = sendmsg_all(a, bufs)
        t.join(timeout=10)

    assert n == 500_006 and bytes(received) == b"abc" + b"0123456789" * 50_000 + b"xyz"


def test_a_relay_reheaders_a_chunk_without_touching_its_payload() -> None:
    layout = chunk_layout(TEMPLATE, 1024)
    pieces = encode_chunk(Header("GLOBAL", 1, 3, "G", chunk=0, chunks=len(layout)), chunk_view(TEMPLATE, layout[0]))
    header, payload = _roundtrip(_join(pieces)) or (None, None)
    assert header is not None and payload is not None

    forwarded = _roundtrip(reheader(header, sender="R") + bytes(payload))

    assert forwarded is not None
    assert forwarded[0].sender == "R" and forwarded[0].digest == header.digest and forwarded[1] == payload


def _payload() -> bytes:
    return _join(safetensors_pieces({"a.bias": torch.ones(4)}))


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"XXXX" + b"\0" * 40, "bad_magic"),
        (_frame(_good_header(b""), b"", version=1), "bad_version"),
        (_frame(_good_header(_payload()), _payload())[:-10], "truncated"),
        (_frame(_good_header(_payload()), _payload())[:7], "truncated"),
        (_frame(_good_header(_payload()), _payload()[:-1] + b"!"), "bad_checksum"),
        (FIXED.pack(MAGIC, VERSION, 0, 0, 10**7, 0), "oversized"),
        (FIXED.pack(MAGIC, VERSION, 0, 0, 10, 10**12), "oversized"),
        (_frame({"type": "GLOBAL"}, b""), "bad_header"),
        (_frame({**_good_header(b""), "type": "EXEC"}, b""), "bad_header"),
        (_frame({**_good_header(b""), "task": -1}, b""), "bad_header"),
        (_frame({**_good_header(b""), "extra": 1}, b""), "bad_header"),
        (_frame({**_good_header(b""), "nbytes": 5}, b""), "bad_header"),
        (_frame({**_good_header(b""), "chunk": 3, "chunks": 2}, b""), "bad_header"),
        (FIXED.pack(MAGIC, VERSION, 0, 0, 4, 0) + b"\xff\xfe{}", "bad_header"),
    ],
    ids=["magic", "version", "truncated-payload", "truncated-fixed", "checksum", "oversized-header",
         "oversized-payload", "missing-keys", "unknown-type", "negative-task", "unknown-key",
         "length-mismatch", "chunk-out-of-range", "not-utf8"],
)
def test_bad_frames_are_rejected(raw: bytes, reason: str) -> None:
    with pytest.raises(FrameError) as e:
        _roundtrip(raw)
    assert e.value.reason == reason


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda good: bytearray(b"not safetensors"), "bad_payload"),
        (lambda good: bytearray(_join(safetensors_pieces({"a.bias": torch.ones(5)}))), "bad_tensors"),
        (lambda good: bytearray(_join(safetensors_pieces({"a.bias": torch.ones(4, dtype=torch.float64)}))),
         "bad_tensors"),
        (lambda good: bytearray(_join(safetensors_pieces({"other": torch.ones(4)}))), "bad_tensors"),
        (lambda good: bytearray(_join(safetensors_pieces({"a.bias": torch.full((4,), float("nan"))}))),
         "bad_tensors"),
        (lambda good: good + b"\0" * 8, "bad_payload"),
    ],
    ids=["not-safetensors", "shape", "dtype", "names", "nan", "trailing-bytes"],
)
def test_a_chunk_must_be_exactly_its_layout(make: object, reason: str) -> None:
    layout = chunk_layout({"a.bias": torch.ones(4)}, None)
    good = bytearray(_payload())
    assert set(parse_chunk(good, layout[0])) == {"a.bias"}

    with pytest.raises(FrameError) as e:
        parse_chunk(make(good), layout[0])  # type: ignore[operator]

    assert e.value.reason == reason


class _Boom:
    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {_Boom.marker}",))

    marker = ""


def test_pickle_payload_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    _Boom.marker = str(marker)
    evil = bytearray(pickle.dumps({"w": _Boom()}))
    layout = chunk_layout({"a.bias": torch.ones(4)}, None)

    with pytest.raises(FrameError) as e:
        parse_chunk(evil, layout[0])

    assert e.value.reason in ("bad_payload", "bad_tensors")
    assert not marker.exists()


def test_encode_frame_fills_length_and_digest() -> None:
    head, _payload = encode_frame(Header("UPDATE", 3, 1, "L2", 7), b"abc")
    magic, _v, _f, _r, hlen, plen = struct.unpack(">4sBBHIQ", head[:20])
    h = json.loads(head[20 : 20 + hlen])
    assert (magic, plen, h["nbytes"], h["digest"]) == (MAGIC, 3, 3, xxhash.xxh3_128_hexdigest(b"abc"))


def test_a_lazy_frame_is_the_eager_frame_hashed_once_when_first_read() -> None:
    layout = chunk_layout(TEMPLATE, 1024)
    state = {k: v.clone() for k, v in TEMPLATE.items()}
    header = Header("UPDATE", 4, 2, "L1", num_examples=9, chunk=1, chunks=len(layout))
    frame = LazyFrame(header, chunk_view(state, layout[1]))
    size = frame.nbytes  # known before anything is hashed
    chunk = chunk_view(state, layout[1])
    for t in chunk.values():  # written after the frame was queued, before it is sent
        t.add_(1)

    first, again = list(frame), list(frame)

    assert all(a is b for a, b in zip(first, again, strict=True))  # hashed once, for every connection
    assert _join(first) == _join(encode_chunk(header, chunk))
    assert len(_join(first)) == size
    got = _roundtrip(_join(first))
    assert got is not None  # the digest is of the bytes that go out
    parsed = parse_chunk(got[1], layout[1], got[0])
    assert all(torch.equal(parsed[k], chunk[k]) for k in chunk)


def test_a_lazy_frame_without_tensors_has_no_digest() -> None:
    frame = LazyFrame(Header("UPDATE", 4, 2, "L1", chunk=0, chunks=3), None)

    got = _roundtrip(_join(list(frame)))

    assert got is not None and got[1] == bytearray() and got[0].digest == ""
    assert frame.nbytes == len(_join(list(frame)))


def test_zero_copy_encoding_is_valid_safetensors() -> None:
    from safetensors.torch import load as st_load

    tensors = {"c": torch.tensor(3.5), "d": torch.arange(6, dtype=torch.int64).reshape(2, 3), **TEMPLATE}

    decoded = st_load(_join(safetensors_pieces(tensors)))

    assert set(decoded) == set(tensors)
    assert all(torch.equal(decoded[k], v) for k, v in tensors.items())


def test_split_tensors_slices_a_large_tensor_by_rows() -> None:
    groups = split_tensors({"w": torch.randn(100, 7), "b": torch.randn(7)}, 7 * 4 * 30)
    assert len(groups) >= 4 and any("w@" in n for g in groups for n in g)
