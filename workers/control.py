"""The site server's control protocol: small JSON messages over one Unix stream socket.

The computing manager (`orchestrator.runtime.compute`) holds one connection to each site server
(`workers.site_server`) and sends requests one at a time; each gets one reply. A message is a
4-byte big-endian length followed by that many bytes of UTF-8 JSON holding one object. Nothing is
ever pickled; every request is checked here, field by field, before the server acts on it.

Requests (``op`` and its fields; every reply has ``ok`` and, when not ok, ``error``):

- ``hello``: the server's site, address, pid, protocol version and its event clock
  (``clock``: `workers.events.now`, from which the manager measures a far machine's offset).
- ``put_module`` ``digest`` ``source``: store a model file's text under its SHA-256 (checked).
- ``start`` ``config`` ``events``: start a role of a task from an `AgentConfig` (JSON) whose model
  may name a stored module as ``@sha256:<digest>:<factory>``; ``events`` is the role's events file,
  relative to the server's log root.
- ``status``: every role's state (starting, running, done, failed), exit status and last error, and
  the server's CPU seconds and resident memory (read at most once a second: reading PSS walks the
  page tables).
- ``stop`` ``task``: cancel a task's role; ``forget`` ``task``: drop a finished role's record.
- ``shutdown``: stop every role and exit. Closing the connection does the same.
- ``read`` ``path``, ``offset``: whole lines of an events file under the log root from that byte
  (at most 1 MiB): how the events of a server on another machine come back.

The socket is a file in a directory only root can enter; the server binds no network address for
its control (the roles bind their task ports on the site's own address only).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

PROTOCOL_VERSION = 1
#: Largest control message (a model file's source travels in one).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
#: A shipped module's spec: ``@sha256:<64 hex digits>:<factory name>``.
SHIPPED_PREFIX = "@sha256:"
_DIGEST = re.compile(r"[0-9a-f]{64}")
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LEN = struct.Struct(">I")
#: How long a server (a site server, the fork server) waits for its manager to connect before it exits.
ACCEPT_TIMEOUT_S = 600.0
#: How often a server waiting for its manager checks that its control socket's file is still there.
ACCEPT_POLL_S = 1.0

OPS: dict[str, dict[str, type]] = {
    "hello": {},
    "put_module": {"digest": str, "source": str},
    "start": {"config": dict, "events": str},
    "status": {},
    "stop": {"task": int},
    "forget": {"task": int},
    "shutdown": {},
    "read": {"path": str, "offset": int},
}
#: Fields a request may leave out. ``start``: ``checkpoint`` (G writes its global model after every
#: round, beside its events file) and ``init_model`` (G starts from that file, relative to the log root).
OPTIONAL: dict[str, dict[str, type]] = {
    "start": {"checkpoint": bool, "init_model": str},
}


class ProtocolError(ValueError):
    """A malformed or unknown message (the connection stays usable unless the framing broke)."""


def send_message(sock: socket.socket, msg: Mapping[str, Any]) -> None:
    data = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode("utf-8")
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
    sock.sendall(_LEN.pack(len(data)) + data)


def connect_unix(path: str, timeout: float) -> socket.socket | None:
    """A connection to the Unix socket at `path` (requests time out after `timeout` s), or None while
    nothing listens there yet (no file, or refused)."""
    if not os.path.exists(path):
        return None
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    s.settimeout(timeout)
    return s


def _recv_exact(sock: socket.socket, n: int) -> bytes | None:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            if got == 0:
                return None
            raise ConnectionError(f"control connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def recv_message(sock: socket.socket) -> dict[str, Any] | None:
    """One message; None on a clean end of stream. Raises ConnectionError on a torn message and
    ProtocolError (after reading it whole) on one that is not a JSON object."""
    head = _recv_exact(sock, _LEN.size)
    if head is None:
        return None
    (n,) = _LEN.unpack(head)
    if n > MAX_MESSAGE_BYTES:
        raise ConnectionError(f"control message of {n} bytes exceeds {MAX_MESSAGE_BYTES}")
    body = _recv_exact(sock, n)
    if body is None:
        raise ConnectionError("control connection closed inside a message")
    try:
        msg = json.loads(body.decode("utf-8"), parse_constant=_no_constants)
    except RecursionError:
        raise ProtocolError("not JSON: nested too deeply") from None
    except ValueError as e:  # bad UTF-8, bad JSON, NaN or a number too long to convert
        raise ProtocolError(f"not JSON: {e}") from e
    if not isinstance(msg, dict):
        raise ProtocolError("a control message must be a JSON object")
    return msg


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def check_request(msg: Mapping[str, Any]) -> str:
    """The request's op, after checking its fields' presence and types (no others allowed)."""
    op = msg.get("op")
    if not isinstance(op, str) or op not in OPS:
        raise ProtocolError(f"unknown op {op!r}: one of {sorted(OPS)}")
    fields = OPS[op]
    optional = OPTIONAL.get(op, {})
    extra = set(msg) - set(fields) - set(optional) - {"op"}
    if extra:
        raise ProtocolError(f"{op}: unknown fields {sorted(extra)}")
    for name, kind in optional.items():
        if name in msg and (not isinstance(msg[name], kind) or (kind is not bool and isinstance(msg[name], bool))):
            raise ProtocolError(f"{op}: {name!r} has the wrong type ({type(msg[name]).__name__})")
    for name, kind in fields.items():
        if name not in msg:
            raise ProtocolError(f"{op}: missing {name!r}")
        value = msg[name]
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ProtocolError(f"{op}: {name!r} has the wrong type ({type(value).__name__})")
    if op == "put_module":
        if not _DIGEST.fullmatch(msg["digest"]):
            raise ProtocolError("put_module: digest must be 64 lowercase hex digits")
        if module_digest(msg["source"]) != msg["digest"]:
            raise ProtocolError("put_module: the source does not match its digest")
    return op


def module_digest(source: str) -> str:
    return hashlib.sha256(source.encode("utf-8")).hexdigest()


def shipped_spec(digest: str, factory: str) -> str:
    """The model spec of a shipped module's factory (see `parse_shipped`)."""
    return f"{SHIPPED_PREFIX}{digest}:{factory}"


def parse_shipped(spec: str) -> tuple[str, str] | None:
    """(digest, factory) of a shipped spec, None for any other spec; ProtocolError if malformed."""
    if not spec.startswith(SHIPPED_PREFIX):
        return None
    digest, sep, factory = spec[len(SHIPPED_PREFIX):].partition(":")
    if not sep or not _DIGEST.fullmatch(digest) or not _IDENT.fullmatch(factory):
        raise ProtocolError(f"bad shipped model spec {spec!r}")
    return digest, factory


def listen(sock_path: Path) -> socket.socket:
    """A socket listening on `sock_path` (any stale file there replaced), its file owner-only."""
    sock_path.unlink(missing_ok=True)
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)
    try:
        lsock.bind(str(sock_path))
    finally:
        os.umask(old_umask)
    lsock.listen(1)
    return lsock


def accept_manager(lsock: socket.socket, sock_path: Path, *, out: IO[str],
                   timeout_s: float = ACCEPT_TIMEOUT_S) -> socket.socket | None:
    """The manager's control connection on `lsock` (listening on `sock_path`), or None, said on `out`,
    when none can come: no manager connected within `timeout_s`, or the socket's file was removed
    meanwhile (a manager killed before it connected, whose run a later cleanup removed)."""
    deadline = time.monotonic() + timeout_s
    lsock.settimeout(min(ACCEPT_POLL_S, timeout_s))
    while True:
        try:
            conn, _ = lsock.accept()
            return conn
        except TimeoutError:
            if not sock_path.exists():
                print("the control socket was removed before a manager connected: exiting", file=out, flush=True)
                return None
            if time.monotonic() >= deadline:
                print(f"no manager connected within {timeout_s:.0f} s: exiting", file=out, flush=True)
                sock_path.unlink(missing_ok=True)
                return None
