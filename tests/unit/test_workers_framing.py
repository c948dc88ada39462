"""Wire format: round trips, chunking, and every kind of bad frame is rejected with a reason."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import socket
import struct
from pathlib import Path

import pytest
import torch

from workers.framing import (
    FIXED,
    MAGIC,
    FrameError,
    Header,
    Message,
    check_tensors,
    encode_frame,
    encode_message,
    merge_slices,
    message_bytes,
    split_tensors,
)
from workers.transport import read_message, send_message

TENSORS = {"a.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4), "a.bias": torch.ones(4)}


def _roundtrip(raw: bytes, **kw: int) -> Message | None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(raw)
        a.shutdown(socket.SHUT_WR)
        return read_message(b, **kw)


def _frame(header: dict, payload: bytes, *, magic: bytes = MAGIC, version: int = 1) -> bytes:
    h = json.dumps(header).encode()
    return FIXED.pack(magic, version, 0, 0, len(h), len(payload)) + h + payload


def _good_header(payload: bytes) -> dict:
    return {"type": "GLOBAL", "task": 1, "round": 1, "sender": "G", "num_examples": 0,
            "nbytes": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}


@pytest.mark.parametrize("max_chunk_bytes", [None, 16, 10**9])
def test_roundtrip_single_and_chunked(max_chunk_bytes: int | None) -> None:
    pieces = encode_message(type="UPDATE", task=5, round=2, sender="L1", tensors=TENSORS,
                            num_examples=42, max_chunk_bytes=max_chunk_bytes)

    msg = _roundtrip(message_bytes(pieces))

    assert msg is not None
    assert msg.header.type == "UPDATE" and msg.header.task == 5 and msg.header.round == 2
    assert msg.header.num_examples == 42
    assert (msg.header.chunks > 1) == (max_chunk_bytes == 16)
    assert set(msg.tensors) == set(TENSORS)
    for k, t in TENSORS.items():
        assert torch.equal(msg.tensors[k], t)
    assert msg.wire_bytes > sum(t.numel() * 4 for t in TENSORS.values())


def test_payloadless_message_and_clean_eof() -> None:
    msg = _roundtrip(message_bytes(encode_message(type="STOP", task=1, round=1, sender="G")))
    assert msg is not None and msg.header.type == "STOP" and msg.tensors == {}
    assert _roundtrip(b"") is None


def test_send_message_counts_bytes() -> None:
    a, b = socket.socketpair()
    pieces = encode_message(type="GLOBAL", task=1, round=1, sender="G", tensors=TENSORS)
    with a, b:
        n = send_message(a, pieces)
    assert n == sum(len(p) for p in pieces)


def _payload() -> bytes:
    return message_bytes(encode_message(type="GLOBAL", task=1, round=1, sender="G", tensors=TENSORS)[1:])


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"XXXX" + b"\0" * 40, "bad_magic"),
        (_frame(_good_header(b""), b"", version=9), "bad_version"),
        (_frame(_good_header(_payload()), _payload())[:-10], "truncated"),
        (_frame(_good_header(_payload()), _payload())[:7], "truncated"),
        (_frame(_good_header(_payload()), _payload()[:-1] + b"?"), "bad_checksum"),
        (FIXED.pack(MAGIC, 1, 0, 0, 10**7, 0), "oversized"),
        (FIXED.pack(MAGIC, 1, 0, 0, 10, 10**12), "oversized"),
        (_frame({"type": "GLOBAL"}, b""), "bad_header"),
        (_frame({**_good_header(b""), "type": "EXEC"}, b""), "bad_header"),
        (_frame({**_good_header(b""), "task": -1}, b""), "bad_header"),
        (_frame({**_good_header(b""), "extra": 1}, b""), "bad_header"),
        (_frame({**_good_header(b""), "nbytes": 5}, b""), "bad_header"),
        (FIXED.pack(MAGIC, 1, 0, 0, 4, 0) + b"\xff\xfe{}", "bad_header"),
        (_frame(_good_header(b"not safetensors"), b"not safetensors"), "bad_payload"),
    ],
    ids=["magic", "version", "truncated-payload", "truncated-fixed", "checksum", "oversized-header",
         "oversized-payload", "missing-keys", "unknown-type", "negative-task", "unknown-key",
         "length-mismatch", "not-utf8", "not-safetensors"],
)
def test_bad_frames_are_rejected(raw: bytes, reason: str) -> None:
    with pytest.raises(FrameError) as e:
        _roundtrip(raw, max_payload_bytes=1024 * 1024)
    assert e.value.reason == reason


def test_oversized_payload_is_rejected_against_the_agent_limit() -> None:
    raw = message_bytes(encode_message(type="GLOBAL", task=1, round=1, sender="G", tensors=TENSORS))
    with pytest.raises(FrameError) as e:
        _roundtrip(raw, max_payload_bytes=32)
    assert e.value.reason == "oversized"


class _Boom:
    def __reduce__(self) -> tuple:
        return (os.system, (f"touch {_Boom.marker}",))

    marker = ""


def test_pickle_payload_is_never_executed(tmp_path: Path) -> None:
    marker = tmp_path / "executed"
    _Boom.marker = str(marker)
    evil = pickle.dumps({"w": _Boom()})

    with pytest.raises(FrameError) as e:
        _roundtrip(_frame(_good_header(evil), evil))

    assert e.value.reason == "bad_payload"
    assert not marker.exists()


def test_chunk_from_another_message_is_rejected() -> None:
    first = encode_message(type="GLOBAL", task=1, round=1, sender="G", tensors=TENSORS, max_chunk_bytes=16)
    other = encode_message(type="GLOBAL", task=1, round=2, sender="G", tensors=TENSORS, max_chunk_bytes=16)
    with pytest.raises(FrameError) as e:
        _roundtrip(message_bytes(first[:2] + other[2:]))
    assert e.value.reason == "bad_chunk"


@pytest.mark.parametrize(
    ("tensors", "needle"),
    [
        ({"a.weight": torch.zeros(4, 3), "a.bias": torch.ones(4)}, "shape"),
        ({"a.weight": torch.zeros(3, 4, dtype=torch.float64), "a.bias": torch.ones(4)}, "dtype"),
        ({"a.weight": torch.zeros(3, 4)}, "names"),
        ({"a.weight": torch.full((3, 4), float("nan")), "a.bias": torch.ones(4)}, "non-finite"),
    ],
    ids=["shape", "dtype", "missing", "nan"],
)
def test_check_tensors_rejects_mismatch(tensors: dict, needle: str) -> None:
    with pytest.raises(FrameError, match=needle) as e:
        check_tensors(tensors, TENSORS)
    assert e.value.reason == "bad_tensors"


def test_encode_frame_fills_length_and_checksum() -> None:
    head, _payload = encode_frame(Header("UPDATE", 3, 1, "L2", 7), b"abc")
    magic, _v, _f, _r, hlen, plen = struct.unpack(">4sBBHIQ", head[:20])
    h = json.loads(head[20 : 20 + hlen])
    assert (magic, plen, h["nbytes"], h["sha256"]) == (MAGIC, 3, 3, hashlib.sha256(b"abc").hexdigest())


def test_zero_copy_encoding_is_valid_safetensors() -> None:
    from safetensors.torch import load as st_load

    tensors = {**TENSORS, "c": torch.tensor(3.5), "d": torch.arange(6, dtype=torch.int64).reshape(2, 3)}
    pieces = encode_message(type="GLOBAL", task=1, round=1, sender="G", tensors=tensors)

    decoded = st_load(message_bytes(pieces[1:]))

    assert set(decoded) == set(tensors)
    assert all(torch.equal(decoded[k], v) for k, v in tensors.items())


def test_large_tensor_is_sliced_across_chunks_and_merged() -> None:
    big = {"w": torch.randn(100, 7), "b": torch.randn(7)}
    groups = split_tensors(big, 7 * 4 * 30)  # 30 rows per chunk
    pieces = encode_message(type="UPDATE", task=1, round=1, sender="L", tensors=big, num_examples=3,
                            max_chunk_bytes=7 * 4 * 30)

    msg = _roundtrip(message_bytes(pieces))

    assert len(groups) >= 4 and any("w@" in n for g in groups for n in g)
    assert msg is not None and msg.header.chunks == len(groups)
    assert torch.equal(msg.tensors["w"], big["w"]) and torch.equal(msg.tensors["b"], big["b"])


def test_slices_that_do_not_tile_are_rejected() -> None:
    with pytest.raises(FrameError) as e:
        merge_slices({"w@0": torch.zeros(2, 3), "w@3": torch.zeros(2, 3)})
    assert e.value.reason == "bad_chunk"
