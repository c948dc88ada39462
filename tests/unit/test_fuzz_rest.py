"""Property-based fuzzing of the controller's REST API over real sockets.

One server per module (`tests.unit.rest_server`: `controller.rest.RestApi` on os-ken's WSGI server,
switches faked) takes every example. Each bad request must get a 4xx whose body is a JSON object
with an ``error`` message: never a 5xx, never a hang, never a dropped connection; and a good request
right after it must still succeed.
"""

from __future__ import annotations

import http.client
import json
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from controller.paths import TaskPaths

pytestmark = pytest.mark.fuzz

HOST = "127.0.0.1"
#: Generous: a loaded two-core machine may be slow, and a slow answer is not what is tested here.
TIMEOUT_S = 60.0
FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])

GOOD_TASK = {
    "task_id": 7,
    "label": "fuzz",
    "paths": [
        {"src": "A", "dst": "B", "sites": ["A", "B"], "tcp_dst": 20007, "reserved_mbps": 1.0, "kind": "broadcast"},
        {"src": "B", "dst": "A", "sites": ["B", "A"], "tcp_dst": 30007, "reserved_mbps": 1.0, "kind": "upload"},
    ],
}


class Server:
    """The REST server process and the requests the tests make to it."""

    def __init__(self, log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.unit.rest_server"], stdout=subprocess.PIPE,
                                     stderr=log.open("w"), text=True, cwd=Path(__file__).parents[2])
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        assert line.strip().isdigit(), f"the REST server did not start: {log.read_text()[-2000:]}"
        self.port = int(line)

    def raw(self, data: bytes, *, half_close: bool = False, method: str = "GET") -> tuple[int, bytes]:
        """Send `data` as is on a new connection (then shut down the writing side if `half_close`); the
        answer's status and body. A connection closed or reset without an answer fails the test."""
        with socket.create_connection((HOST, self.port), timeout=TIMEOUT_S) as s:
            s.sendall(data)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            resp = http.client.HTTPResponse(s, method=method)
            resp.begin()
            return resp.status, resp.read()

    def request(self, method: str, target: str, body: bytes | None = None, *, length: int | None = None,
                headers: tuple[str, ...] = (), half_close: bool = False) -> tuple[int, bytes]:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {HOST}:{self.port}", "Connection: close", *headers]
        if body is not None:
            lines += ["Content-Type: application/json", f"Content-Length: {len(body) if length is None else length}"]
        head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        return self.raw(head + (body or b""), half_close=half_close, method=method)

    def still_serving(self) -> None:
        status, body = self.request("GET", "/health")
        assert status == 200 and json.loads(body)["switches_connected"] == 3

    def close(self) -> str:
        self.proc.kill()
        self.proc.wait(timeout=TIMEOUT_S)
        return self.log.read_text()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("rest") / "server.log")
    yield srv
    log = srv.close()
    assert "Traceback" not in log, log[-4000:]


def rejected(server: Server, status: int, body: bytes, method: str = "GET") -> None:
    """A 4xx with a JSON error message, and the server still serves a good request."""
    assert 400 <= status < 500, (status, body[:500])
    if method != "HEAD":  # a HEAD answer carries no body
        answer = json.loads(body)
        assert isinstance(answer, dict) and isinstance(answer["error"], str) and answer["error"], answer
    server.still_serving()


# -- strategies ----------------------------------------------------------------------------------------
json_scalars = (st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63 - 2, max_value=2**70)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20))
json_values = st.recursive(json_scalars, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=10), kids, max_size=4), max_leaves=12)
#: Bodies that are not JSON, or JSON a parser chokes on.
bad_text = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.integers(min_value=1, max_value=100_000).map(lambda n: b"[" * n + b"]" * (n % 3)),  # nesting
    st.integers(min_value=4301, max_value=20_000).map(lambda n: b"9" * n),  # a number too long to convert
    st.sampled_from([b"NaN", b"Infinity", b"-Infinity", b"1e999", b'{"pairs": [["A", "B"]]', b"\xef\xbb\xbf{}",
                     '{"task_id": 7, "label": "\ud800"}'.encode("utf-8", "surrogatepass")]),
)


def _mutate(base: dict[str, Any], data: st.DataObject) -> dict[str, Any]:
    """`base` with a key removed, added or given another value (at the top or inside a path)."""
    body = json.loads(json.dumps(base))
    target = body
    if "paths" in body and data.draw(st.booleans(), label="inside a path"):
        target = body["paths"][data.draw(st.integers(0, len(body["paths"]) - 1))]
    how = data.draw(st.sampled_from(["drop", "add", "change"]), label="mutation")
    keys = sorted(target)
    if how == "drop":
        del target[data.draw(st.sampled_from(keys))]
    elif how == "add":
        target[data.draw(st.text(min_size=1, max_size=10).filter(lambda k: k not in target))] = data.draw(json_values)
    else:
        target[data.draw(st.sampled_from(keys))] = data.draw(json_values)
    return body


def _task_accepted(body: Any, task_id: int) -> bool:
    try:
        paths = TaskPaths.from_dict(body)
    except ValueError:
        return False
    return paths.task_id == task_id


# -- the tests -----------------------------------------------------------------------------------------
@FUZZ
@given(target=st.sampled_from(["/tasks/7", "/background"]), body=bad_text | json_values.map(
    lambda v: json.dumps(v).encode()))
def test_bodies_that_are_not_the_expected_json_are_rejected(server: Server, target: str, body: bytes) -> None:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        value = None
    else:
        assume(not _task_accepted(value, 7))
        assume(not (target == "/background" and isinstance(value, dict) and value.keys() == {"pairs"}
                    and value["pairs"] == []))

    status, answer = server.request("PUT", target, body)

    rejected(server, status, answer)


@FUZZ
@given(data=st.data())
def test_bodies_with_missing_extra_or_wrongly_typed_fields_are_rejected(server: Server, data: st.DataObject) -> None:
    if data.draw(st.booleans(), label="task"):
        target, body = "/tasks/7", _mutate(GOOD_TASK, data)
        assume(not _task_accepted(body, 7))
    else:
        target = "/background"
        body = data.draw(st.one_of(
            st.fixed_dictionaries({"pairs": st.lists(json_values, min_size=1, max_size=3)}),
            st.fixed_dictionaries({"pairs": st.lists(st.lists(st.sampled_from(["A", "B", "C", "Q", "", "ÄÖ", "\u0000"])
                                                              | json_scalars, max_size=3), min_size=1, max_size=3)}),
            st.dictionaries(st.text(max_size=8), json_values, max_size=3),
        ))
        pairs = body.get("pairs") if isinstance(body, dict) else None
        valid = (isinstance(pairs, list) and set(body) == {"pairs"} and all(
            isinstance(p, list) and len(p) == 2 and all(s in ("A", "B", "C") for s in p) and p[0] != p[1]
            for p in pairs))
        assume(not valid)
    raw = json.dumps(body, ensure_ascii=data.draw(st.booleans(), label="ascii")).encode("utf-8", "surrogatepass")

    status, answer = server.request("PUT", target, raw)

    rejected(server, status, answer)


@FUZZ
@given(target=st.sampled_from(["/tasks/7", "/background"]), body=st.sampled_from([GOOD_TASK, {"pairs": [["A", "B"]]}]),
       how=st.sampled_from(["shorter", "longer", "chunked", "huge"]), cut=st.integers(0, 10_000), data=st.data())
def test_bodies_that_disagree_with_their_declared_length_are_rejected(
    server: Server, target: str, body: dict[str, Any], how: str, cut: int, data: st.DataObject
) -> None:
    raw = json.dumps(body).encode()
    if how == "shorter":  # the body ends before its Content-Length: the client half-closes and waits
        sent = raw[: cut % len(raw)]
        status, answer = server.request("PUT", target, sent, length=len(raw), half_close=True)
    elif how == "longer":  # only a strict prefix of the JSON is within the Content-Length
        status, answer = server.request("PUT", target, raw + data.draw(st.binary(max_size=100)), length=cut % len(raw))
    elif how == "chunked":
        chunk = raw[: cut % (len(raw) + 1)]
        chunked = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n0\r\n\r\n"
        status, answer = server.request("PUT", target, None, headers=("Transfer-Encoding: chunked",),
                                        half_close=True) if not chunk else server.raw(
            (f"PUT {target} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
            .encode() + chunked)
    else:  # a Content-Length beyond the API's limit, with little or nothing behind it
        status, answer = server.request("PUT", target, raw[: cut % len(raw)],
                                        length=10 * 1024 * 1024 + 1 + cut * 2**40, half_close=True)

    rejected(server, status, answer)


methods = st.sampled_from(["GET", "PUT", "DELETE", "POST", "PATCH", "HEAD", "OPTIONS", "TRACE", "FOO"])
segments = st.one_of(
    st.sampled_from(["health", "topology", "tasks", "flows", "stats", "ports", "background", "7", "0", "-1",
                     "99", str(2**63), "1" * 1500, "7.0", " 7", "+7", "7_0", "%D9%A1", "%FF", "%00", "..", "", "x"])
    .map(lambda t: quote(t, safe="%+")),  # the request line itself stays valid HTTP
    st.binary(max_size=12).map(lambda b: quote(b, safe="")),
    st.text(max_size=12).map(lambda t: quote(t.encode("utf-8", "surrogatepass"), safe="")),
)
queries = st.one_of(st.just(""), st.lists(st.tuples(st.sampled_from(["task", "x", "task[]"]), segments),
                                          max_size=3).map(lambda kv: "?" + "&".join(f"{k}={v}" for k, v in kv)))


def _norm(path: str) -> str:
    """The path as the router reads it: repeated slashes as one, no trailing slash."""
    return re.sub("/+", "/", path).rstrip("/")


def _is_listing(method: str, path: str) -> bool:
    """A GET of a listing: answered 200 whatever its query (only /flows reads one, ``task``). The
    router reads repeated slashes as one (``//health`` is ``/health``)."""
    return method == "GET" and _norm(path) in ("/health", "/topology", "/tasks", "/flows", "/stats/ports",
                                                    "/background")


@FUZZ
@given(method=methods, parts=st.lists(segments, min_size=0, max_size=4), query=queries,
       body=st.none() | bad_text)
def test_unknown_paths_and_wrong_methods_are_rejected(
    server: Server, method: str, parts: list[str], query: str, body: bytes | None
) -> None:
    path = "/" + "/".join(parts)
    assume(not (method == "DELETE" and _norm(path) == "/background"))

    status, answer = server.request(method, path + query, body)

    if _is_listing(method, path) and status == 200:
        assert "error" not in json.loads(answer)
        server.still_serving()
    else:
        rejected(server, status, answer, method)
