"""The controller's northbound REST API: a plain WSGI app (WebOb) over a `ControllerCore`.

Routes (JSON in and out; errors are ``{"error": message}`` with a 4xx/5xx status; a body must come
with its Content-Length, at most `MAX_BODY_BYTES`, chunked bodies get 411)::

    GET    /health                 switches expected/connected, tasks, recent errors, and
                                   "reservations": {"enforced", "reason"} (are reserved rates shaped?)
    GET    /topology               the emulation plan, connected switches, port-status events
    GET    /tasks                  installed tasks (summaries)
    GET    /tasks/{id}             one task: its paths and entries
    PUT    /tasks/{id}             body = TaskPaths JSON (controller.paths): install (or replace) the task's paths;
                                   the summary's "reservation" says whether its rates are enforced
                                   ({"enforced", "reason", "classid", "capped", "links": [...]})
    DELETE /tasks/{id}             remove the task's entries
    GET    /flows[?task=ID]        entries read live from the switches, with packet/byte counters
                                   and when they were read ("read_s", the controller's monotonic clock)
    GET    /flows?kind=background  only the background routes' entries (their cookie), with counters
    GET    /stats/ports            per directed link: bytes, current rate, utilisation (of the last poll)
    GET    /stats/ports?read=now   the same, its bytes ("tx_bytes" at "read_s") read from the switches now
    GET    /background             background host pairs
    PUT    /background             body = {"pairs": [[site, site], ...]}: replace them
    DELETE /background             remove all background routes

The app serves whatever socket it is given; binding (to 127.0.0.1 only) is the caller's job. It
must not reach into the OpenFlow framework: everything goes through the core.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable, Iterable
from typing import Any

from webob import Request, Response

from controller.core import ControllerCore
from controller.errors import BadRequest, Conflict, ControllerError, NotFound
from controller.paths import TaskPaths

LOG = logging.getLogger(__name__)

_TASK_RE = re.compile(r"^/tasks/([^/]+)/?$")
_DIGITS = re.compile(r"[0-9]{1,19}")
MAX_BODY_BYTES = 10 * 1024 * 1024


class LengthRequired(ControllerError):
    """A body without a Content-Length (chunked): the API reads bodies of a declared, bounded size."""

    status = 411

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _json_response(body: Any, status: int = 200) -> Response:
    return Response(
        body=json.dumps(body, indent=None, sort_keys=False).encode() + b"\n",
        status=status,
        content_type="application/json",
        charset=None,
    )


def _task_id(text: str) -> int:
    # ASCII digits only: int() would also take signs, spaces, underscores and other scripts' digits.
    if not _DIGITS.fullmatch(text):
        raise BadRequest(f"task id must be a positive integer, got {text[:100]!r}")
    value = int(text)
    if not 0 < value < 2**63:
        raise BadRequest(f"task id must be a positive integer below 2**63, got {value}")
    return value


def _body(req: Request) -> Any:
    length = req.content_length
    if length is None and "Transfer-Encoding" in req.headers:
        raise LengthRequired("a request body needs a Content-Length (chunked bodies are not accepted)")
    if length is not None and length > MAX_BODY_BYTES:
        raise BadRequest(f"request body larger than {MAX_BODY_BYTES} bytes")
    raw = _read_body(req, length or 0)
    if not raw:
        raise BadRequest("request body is empty; expected JSON")
    try:
        return json.loads(raw)
    except RecursionError:
        raise BadRequest("malformed JSON: nested too deeply") from None
    except ValueError as e:  # bad JSON, bad UTF-8, or a number too long to convert
        raise BadRequest(f"malformed JSON: {e}") from e


def _read_body(req: Request, length: int) -> bytes:
    """Exactly the `length` bytes the request declared; BadRequest if the client sent fewer."""
    stream = req.body_file_raw
    parts, got = [], 0
    while got < length:
        try:
            part = stream.read(length - got)
        except (OSError, ValueError) as e:
            raise BadRequest(f"request body unreadable after {got} of {length} bytes: {e}") from e
        if not part:
            raise BadRequest(f"request body ended after {got} of the {length} bytes of its Content-Length")
        parts.append(part)
        got += len(part)
    return b"".join(parts)


class RestApi:
    """WSGI callable routing the module docstring's endpoints to `core`."""

    def __init__(self, core: ControllerCore) -> None:
        self.core = core

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        req = Request(environ)
        try:
            resp = self.dispatch(req)
        except ControllerError as e:
            resp = _json_response({"error": str(e)}, status=e.status)
        except UnicodeDecodeError as e:  # webob decodes the path and the query string as UTF-8
            resp = _json_response({"error": f"the URL is not UTF-8: {e}"}, status=400)
        except Exception as e:  # the controller must survive any bad request
            LOG.exception("REST %s %r failed", environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"))
            resp = _json_response({"error": f"internal error: {type(e).__name__}: {e}"}, status=500)
        result: Iterable[bytes] = resp(environ, start_response)
        return result

    def dispatch(self, req: Request) -> Response:
        path, method = req.path_info.rstrip("/") or "/", req.method
        core = self.core
        if path == "/health" and method == "GET":
            return _json_response(core.health())
        if path == "/topology" and method == "GET":
            return _json_response(core.topology())
        if path == "/tasks" and method == "GET":
            return _json_response({"tasks": core.list_tasks()})
        if path == "/flows" and method == "GET":
            task, kind = req.GET.get("task"), req.GET.get("kind")
            if kind not in (None, "background"):
                raise BadRequest(f"kind must be 'background' (or left out), got {str(kind)[:100]!r}")
            return _json_response({"flows": core.flows(_task_id(task) if task else None,
                                                       background=kind == "background")})
        if path == "/stats/ports" and method == "GET":
            read = req.GET.get("read")
            if read not in (None, "now"):
                raise BadRequest(f"read must be 'now' (or left out), got {str(read)[:100]!r}")
            return _json_response({"links": core.link_stats(read_now=read == "now")})
        if path == "/background":
            if method == "GET":
                return _json_response(core.get_background())
            if method == "PUT":
                body = _body(req)
                if not isinstance(body, dict) or not isinstance(body.get("pairs"), list):
                    raise BadRequest('expected {"pairs": [[site, site], ...]}')
                return _json_response(core.set_background(body["pairs"]))
            if method == "DELETE":
                return _json_response(core.set_background([]))
            return self._method_not_allowed(method, path, "GET, PUT, DELETE")
        m = _TASK_RE.match(path)
        if m:
            task_id = _task_id(m.group(1))
            if method == "GET":
                return _json_response(core.get_task(task_id))
            if method == "PUT":
                body = _body(req)
                try:
                    paths = TaskPaths.from_dict(body)
                except ValueError as e:
                    raise BadRequest(str(e)) from e
                if paths.task_id != task_id:
                    raise Conflict(f"URL names task {task_id} but the body is for task {paths.task_id}")
                return _json_response(core.install_task(paths), status=201)
            if method == "DELETE":
                return _json_response(core.remove_task(task_id))
            return self._method_not_allowed(method, path, "GET, PUT, DELETE")
        known = {"/health", "/topology", "/tasks", "/flows", "/stats/ports"}
        if path in known:
            return self._method_not_allowed(method, path, "GET")
        raise NotFound(f"no such endpoint {method} {path}")

    @staticmethod
    def _method_not_allowed(method: str, path: str, allowed: str) -> Response:
        resp = _json_response({"error": f"{method} not allowed on {path} (allowed: {allowed})"}, status=405)
        resp.headers["Allow"] = allowed
        return resp
