"""Blocking socket I/O of the wire format (`workers.framing`): send frames, read frames and messages.

What this module must never do: execute anything from the wire; every payload is checked by
`workers.framing` before it is parsed.
"""

from __future__ import annotations

import socket
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from workers.framing import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    FIXED,
    FIXED_LEN,
    MAGIC,
    MAX_HEADER_BYTES,
    VERSION,
    Buffer,
    FrameError,
    Header,
    Message,
    SliceAssembler,
    _verify,
    decode_payload,
)


def send_message(sock: socket.socket, pieces: Sequence[Buffer]) -> int:
    """Send encoded pieces; returns the bytes sent."""
    total = 0
    for p in pieces:
        n = len(p) if isinstance(p, bytes) else p.nbytes
        if n:
            sock.sendall(p)
            total += n
    return total


# -- decoding -------------------------------------------------------------------------------------
def _recv_exact(sock: socket.socket, n: int, what: str) -> bytearray:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], min(n - got, 4 * 1024 * 1024))
        if k == 0:
            raise FrameError("truncated", f"connection closed after {got} of {n} bytes of {what}")
        got += k
    return buf


def _recv_payload(sock: socket.socket, n: int) -> bytes:
    """Receive exactly `n` bytes into one bytes object. On a blocking socket (kernel receive
    timeout, SO_RCVTIMEO) MSG_WAITALL fills it in place, without the extra copy of `_recv_exact`."""
    if sock.gettimeout() is not None:
        return bytes(_recv_exact(sock, n, "payload"))
    parts: list[bytes] = []
    got = 0
    while got < n:
        part = sock.recv(n - got, socket.MSG_WAITALL)
        if not part:
            raise FrameError("truncated", f"connection closed after {got} of {n} bytes of payload")
        parts.append(part)
        got += len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _read_frame_unverified(sock: socket.socket, max_payload_bytes: int) -> tuple[Header, bytes] | None:
    first = sock.recv(FIXED_LEN)
    if not first:
        return None
    fixed = first if len(first) == FIXED_LEN else first + _recv_exact(sock, FIXED_LEN - len(first), "fixed header")
    magic, version, _flags, _reserved, header_len, payload_len = FIXED.unpack(fixed)
    if magic != MAGIC:
        raise FrameError("bad_magic", f"frame starts with {bytes(magic)!r}, not {MAGIC!r}")
    if version != VERSION:
        raise FrameError("bad_version", f"frame version {version}, this agent speaks {VERSION}")
    if header_len > MAX_HEADER_BYTES:
        raise FrameError("oversized", f"JSON header of {header_len} bytes exceeds {MAX_HEADER_BYTES}")
    if payload_len > max_payload_bytes:
        raise FrameError("oversized", f"payload of {payload_len} bytes exceeds the limit {max_payload_bytes}")
    header = Header.from_json(bytes(_recv_exact(sock, header_len, "JSON header")))
    if header.nbytes != payload_len:
        raise FrameError("bad_header", f"header says {header.nbytes} payload bytes, frame says {payload_len}", header)
    try:
        payload = _recv_payload(sock, payload_len) if payload_len else b""
    except FrameError as e:
        e.header = header  # the receiver then knows whose message broke off
        raise
    return header, payload


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
    got = _read_frame_unverified(sock, max_payload_bytes)
    if got is None:
        return None
    header, payload = got
    _verify(header, payload)
    return header, payload


def read_message(
    sock: socket.socket, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
) -> Message | None:
    """Read one message (all its chunks) from a connection; None on a clean end of stream.

    `max_payload_bytes` bounds the sum of all chunks' payloads. Chunk i is verified (SHA-256) and
    parsed in a helper thread while chunk i+1 is still arriving, so checking overlaps the transfer.
    """
    got = _read_frame_unverified(sock, max_payload_bytes)
    if got is None:
        return None
    first, payload = got
    asm = SliceAssembler(max_bytes=max_payload_bytes)
    total = FIXED_LEN + len(payload)
    error: list[FrameError] = []

    def absorb(header: Header, data: bytes) -> None:
        try:
            _verify(header, data)
            asm.add(decode_payload(data), header)
        except FrameError as e:
            error.append(e)

    if first.chunks == 1:
        absorb(first, payload)
    else:
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(absorb, first, payload)
            budget = max_payload_bytes - len(payload)
            for i in range(1, first.chunks):
                if error:
                    break
                nxt = _read_frame_unverified(sock, budget)
                if nxt is None:
                    error.append(FrameError("truncated", f"stream ended after chunk {i} of {first.chunks}", first))
                    break
                h, payload = nxt
                if (h.type, h.task, h.round, h.sender, h.chunks, h.chunk) != (
                    first.type, first.task, first.round, first.sender, first.chunks, i
                ):
                    error.append(FrameError("bad_chunk", f"chunk {h.chunk} does not continue chunk {i - 1}", first))
                    break
                budget -= len(payload)
                total += FIXED_LEN + len(payload)
                pool.submit(absorb, h, payload)
    try:
        if not error:
            tensors = asm.result()
    except FrameError as e:
        error.append(e)
    if error:
        err = error[0]
        if err.header is None:
            err.header = first
        raise err
    return Message(header=first, tensors=tensors, wire_bytes=total)
