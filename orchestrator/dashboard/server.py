"""The dashboard's HTTP server: the page, its data, a live stream and Prometheus metrics, on loopback.

Routes::

    GET /                       the page (static/index.html)
    GET /static/<file>          the page's script, style and vendored libraries (a fixed list)
    GET /api/meta               the run, its topology (with drawing positions) and time range
    GET /api/frame[?t=SECONDS]  the run at time t on its clock (the latest when absent)
    GET /api/stream             live runs: server-sent events, one frame per `push_s` (default 1 s)
    GET /metrics                Prometheus text format (`orchestrator.dashboard.metrics`)

The server binds 127.0.0.1 only. A port in use is a `ConfigError` raised by the constructor, before
anything else starts. It serves from threads; each request reads the database through its own
read-only `RunView` (pooled: as many as requests at once). In replay mode (`live=False`) the stream is refused: the page uses a slider.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from orchestrator.dashboard.view import RunView
from orchestrator.errors import ConfigError

LOG = logging.getLogger(__name__)

HOST = "127.0.0.1"
DEFAULT_PORT = 8050
STATIC_DIR = Path(__file__).parent / "static"
STATIC_FILES = {
    "app.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "cytoscape.min.js": "text/javascript; charset=utf-8",
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    dashboard: Dashboard


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        LOG.debug("dashboard: " + format, *args)

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, body: Any, status: int = 200) -> None:
        self._send(status, json.dumps(body).encode(), "application/json")

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        dash = self.server.dashboard
        url = urlparse(self.path)
        path = url.path
        try:
            if path in ("/", "/index.html"):
                self._send(200, (STATIC_DIR / "index.html").read_bytes(), "text/html; charset=utf-8")
            elif path.startswith("/static/") and path[len("/static/"):] in STATIC_FILES:
                name = path[len("/static/"):]
                self._send(200, (STATIC_DIR / name).read_bytes(), STATIC_FILES[name])
            elif path == "/api/meta":
                self._json(dash.with_view(lambda v: {**v.meta(), "live": dash.live, "push_s": dash.push_s}))
            elif path == "/api/frame":
                t = _time_param(parse_qs(url.query).get("t", [None])[0])
                self._json(dash.frame_now() if t is None and dash.live else dash.with_view(lambda v: v.frame(t)))
            elif path == "/api/stream":
                if not dash.live:
                    self._json({"error": "a replay has no live stream; use /api/frame?t="}, 404)
                else:
                    self._stream()
            elif path == "/metrics":
                body, ctype = dash.metrics()
                self._send(200, body, ctype)
            else:
                self._json({"error": f"no such resource {path}"}, 404)
        except ValueError as e:
            self._json({"error": str(e)}, 400)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:
            LOG.exception("dashboard: GET %s failed", path)
            self._json({"error": f"internal error: {type(e).__name__}: {e}"}, 500)

    def _stream(self) -> None:
        """Server-sent events: a frame now and every `push_s` until the client or the server goes."""
        dash = self.server.dashboard
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-store")
        self.send_header("Connection", "close")
        self.end_headers()
        self.close_connection = True
        while not dash.stopping.is_set():
            frame = dash.frame_now()
            self.wfile.write(b"data: " + json.dumps(frame).encode() + b"\n\n")
            self.wfile.flush()
            dash.pushes += 1
            dash.stopping.wait(dash.push_s)


def _time_param(text: str | None) -> float | None:
    if text is None or text == "":
        return None
    try:
        t = float(text)
    except ValueError:
        raise ValueError(f"t must be a number of seconds, got {text!r}") from None
    if t != t or t in (float("inf"), float("-inf")):
        raise ValueError(f"t must be finite, got {text!r}")
    return t


class Dashboard:
    """The dashboard of one results database, served on 127.0.0.1:`port` (0: any free port).

    Parameters
    ----------
    db_path
        The run's ``results.db``; read on each request, so it may be created after the server
        (a live run binds its port before anything starts, then makes its database).
    live
        A running run (frames are pushed) or a finished one (replay).
    controller
        A `ControllerClient` of the running network, for the per-task flow counters of /metrics.
    show_installed
        Live frames also show the tasks installed at `controller` that are not in the database
        (`netai net up`, where tasks are installed from other terminals).

    Raises
    ------
    ConfigError
        The port is in use (or not allowed).
    """

    def __init__(self, db_path: Path, *, port: int = DEFAULT_PORT, live: bool, run_id: int | None = None,
                 controller: Any = None, push_s: float = 1.0, show_installed: bool = False) -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"dashboard port must be in 0..65535, got {port}")
        self.db_path = Path(db_path)
        self.run_id = run_id
        self.live = live
        self.controller = controller
        self.show_installed = show_installed
        self.push_s = push_s
        self.pushes = 0
        self.stopping = threading.Event()
        self._idle: list[RunView] = []
        self._views_lock = threading.Lock()
        try:
            self.httpd = _Server((HOST, port), _Handler)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ConfigError(f"dashboard: port {port} on {HOST} is in use (another dashboard?); "
                                  f"choose another with --dashboard-port") from None
            raise ConfigError(f"dashboard: cannot listen on {HOST}:{port}: {e.strerror}") from None
        self.httpd.dashboard = self
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        port = self.httpd.server_address[1]
        return f"http://{HOST}:{port}/"

    def with_view(self, fn: Callable[[RunView], Any]) -> Any:
        """`fn` applied to a read-only view of the database: one from the pool of idle views (each
        request thread takes one for the call and gives it back), or a new one."""
        with self._views_lock:
            view = self._idle.pop() if self._idle else None
        if view is None:
            view = RunView(self.db_path, self.run_id)
        try:
            return fn(view)
        finally:
            with self._views_lock:
                if self.stopping.is_set():
                    view.close()
                else:
                    self._idle.append(view)

    def frame_now(self) -> dict[str, Any]:
        """The latest frame; with `show_installed`, plus the tasks installed at the controller that
        no task of the database accounts for (e.g. ``netai schedule --install`` on a running network)."""
        frame: dict[str, Any] = self.with_view(lambda v: v.frame(None))
        if self.show_installed and self.controller is not None:
            frame["tasks"] = frame["tasks"] + self._installed(self.with_view(lambda v: v.task_ids()))
        return frame

    def _installed(self, known: set[int]) -> list[dict[str, Any]]:
        """The tasks installed at the controller but not recorded in the database (`known`: recorded
        ids; a recorded task is shown from its record, also while its paths outlive its end)."""
        try:
            summaries = self.controller.tasks()
        except Exception:  # noqa: BLE001 -- the controller busy or gone: the frame without them
            return []
        out = []
        for summary in summaries:
            install = summary.get("task_id")
            if install in known:
                continue
            try:
                paths = self.controller.task(install).get("paths", [])
            except Exception:  # noqa: BLE001 -- removed in between
                continue
            hops: dict[str, set[tuple[str, str]]] = {}
            for p in paths:
                sites = p.get("sites", [])
                hops.setdefault(p.get("kind") or "broadcast", set()).update(itertools.pairwise(sites))
            out.append({"key": f"installed/{install}", "scheduler": str(summary.get("label") or "installed"),
                        "task_id": install, "state": "installed", "rounds_done": 0, "last_round": None,
                        "schedule": {"global": None, "locals": [], "aggregation_sites": [],
                                     "hops": {k: sorted(v) for k, v in hops.items()},
                                     "reserved_mbps": summary.get("reserved_mbps")}})
        return out

    def metrics(self) -> tuple[bytes, str]:
        from orchestrator.dashboard.metrics import render

        return render(self)

    def start(self) -> Dashboard:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="dashboard", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.httpd.server_close()
        with self._views_lock:
            for v in self._idle:
                v.close()
            self._idle.clear()

    def __enter__(self) -> Dashboard:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

