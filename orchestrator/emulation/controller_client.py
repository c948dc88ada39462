"""A small client of the controller's northbound REST API (`controller.rest`), loopback only.

Uses the standard library (urllib). Every call raises `ControllerHTTPError` with the controller's
own error message on a 4xx/5xx answer, and `ControllerUnreachable` when nothing answers. It must
not talk to anything but 127.0.0.1 / ::1 / localhost.
"""

from __future__ import annotations

import ipaddress
import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from typing import Any

from controller.paths import TaskPaths
from topologies.plan import HOST_PORT

DEFAULT_REST_URL = "http://127.0.0.1:8181"
#: Between two ``GET /health`` of a wait (`ControllerClient.wait_for`): a start's wait ends within
#: this of the answer (a refused connection, or an answer, costs well under a millisecond).
POLL_INTERVAL_S = 0.025


class ControllerHTTPError(RuntimeError):
    """The controller answered with an error status; `status` and `message` say which and why."""

    def __init__(self, status: int, message: str, *, method: str, path: str) -> None:
        super().__init__(f"controller: {method} {path} -> {status}: {message}")
        self.status = status
        self.message = message


class ControllerUnreachable(RuntimeError):
    """Nothing answered at the controller's REST address."""


def _check_loopback(url: str) -> str:
    host = urllib.parse.urlsplit(url).hostname or ""
    if host != "localhost":
        try:
            ok = ipaddress.ip_address(host).is_loopback
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"the controller client talks to loopback only, not {host!r}")
    return url.rstrip("/")


class ControllerClient:
    """JSON over HTTP to the controller (see `controller.rest` for the endpoints)."""

    def __init__(self, base_url: str = DEFAULT_REST_URL, *, timeout_s: float = 10.0) -> None:
        self.base_url = _check_loopback(base_url)
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                message = json.loads(raw).get("error", raw.decode(errors="replace"))
            except (ValueError, AttributeError):
                message = raw.decode(errors="replace")
            raise ControllerHTTPError(e.code, str(message), method=method, path=path) from e
        except (urllib.error.URLError, ConnectionError, TimeoutError) as e:
            raise ControllerUnreachable(f"controller at {self.base_url} unreachable: {e}") from e

    # -- endpoints ---------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", "/health")
        return result

    def topology(self) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", "/topology")
        return result

    def tasks(self) -> list[dict[str, Any]]:
        return list(self.request("GET", "/tasks")["tasks"])

    def task(self, task_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", f"/tasks/{task_id}")
        return result

    def install_task(self, paths: TaskPaths | dict[str, Any]) -> dict[str, Any]:
        """Install a task's paths (`orchestrator.emulation.task_paths` builds them from a schedule)."""
        body = paths.to_dict() if isinstance(paths, TaskPaths) else paths
        result: dict[str, Any] = self.request("PUT", f"/tasks/{body['task_id']}", body)
        return result

    def remove_task(self, task_id: int) -> dict[str, Any]:
        result: dict[str, Any] = self.request("DELETE", f"/tasks/{task_id}")
        return result

    def flows(self, task_id: int | None = None) -> list[dict[str, Any]]:
        path = "/flows" if task_id is None else f"/flows?task={task_id}"
        return list(self.request("GET", path)["flows"])

    def background_flows(self) -> list[dict[str, Any]]:
        """The background routes' entries only (`controller.flows.BACKGROUND_COOKIE`), with counters."""
        return list(self.request("GET", "/flows?kind=background")["flows"])

    def task_bytes(self, task_id: int) -> int:
        """Carried bytes of a task: the byte counters of its entries that forward onto a link between
        switches, summed, so that a byte counts once per link it crosses (the entry delivering to a
        host, on the last switch of a path, is not a link; docs/metrics.md, "Carried bytes").

        Open vSwitch updates OpenFlow counters from its datapath every ~0.5-1 s, so read this a
        second after the traffic stops (or poll it) for a final figure.
        """
        return sum(int(f["bytes"]) for f in self.flows(task_id) if onto_link(f))

    def link_stats(self, *, read_now: bool = False) -> list[dict[str, Any]]:
        """``GET /stats/ports``: per directed link, its bytes (read from the switches now if
        `read_now`, else as last polled) with their ``read_s``, its rate over the last poll."""
        return list(self.request("GET", "/stats/ports?read=now" if read_now else "/stats/ports")["links"])

    def set_background(self, pairs: Sequence[Sequence[str]]) -> dict[str, Any]:
        result: dict[str, Any] = self.request("PUT", "/background", {"pairs": [list(p) for p in pairs]})
        return result

    def background(self) -> dict[str, Any]:
        result: dict[str, Any] = self.request("GET", "/background")
        return result

    # -- waiting -----------------------------------------------------------------------------------
    def wait_for(
        self,
        what: str,
        check: Callable[[dict[str, Any]], bool],
        *,
        timeout_s: float,
        alive: Callable[[], str | None] = lambda: None,
    ) -> dict[str, Any]:
        """Poll /health until `check(health)` holds; `alive()` returns a reason to give up early.

        Raises
        ------
        TimeoutError
            Naming `what` and the last health seen (or the last error).
        """
        deadline = time.monotonic() + timeout_s
        last: Any = "no answer yet"
        while True:
            reason = alive()
            if reason:
                raise RuntimeError(f"while waiting for {what}: {reason}")
            try:
                health = self.health()
                if check(health):
                    return health
                last = health
            except (ControllerUnreachable, ControllerHTTPError) as e:
                last = str(e)
            if time.monotonic() >= deadline:
                raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}; last seen: {last}")
            time.sleep(POLL_INTERVAL_S)


def onto_link(entry: dict[str, Any]) -> bool:
    """Whether a flow entry (as `ControllerClient.flows` lists it) forwards onto a link between
    switches: it outputs to a port other than the host's."""
    ports = [a.get("port") for a in entry.get("actions", ()) if a.get("type") == "OUTPUT"]
    return bool(ports) and all(p != HOST_PORT for p in ports)
