"""The computing manager: one long-lived site server per compute site, and the roles it hosts.

`ComputeManager` starts a site server (`workers.site_server`) on every compute site through a
backend (`orchestrator.runtime.backends`: loopback, process, docker), all at once, and holds one
control connection to each (`workers.control`, a Unix socket in a directory only root can
enter). After that, starting a task's roles costs one ``start`` message per overlay node.

It ships a model given as a file to the servers of the tasks that use it: the orchestrator reads the
file, and the servers get its text by content (``put_module``, keyed by its SHA-256) and load it
under the same rules as any model spec. No image rebuild, no bind mount of the user's paths.

A server that dies (killed, out of memory, crashed) is detected when it is polled or sent a
request: `poll` reports it in `lost`, the tasks with roles there fail with its exit status, and
`close` still stops everything else. `close` runs on every exit path (the manager is a context
manager); closing a server's control connection also makes it stop its roles and exit.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache, partial
from pathlib import Path
from typing import Any, Protocol

from orchestrator.errors import ConfigError
from orchestrator.runtime import model_counts
from orchestrator.runtime.far_clock import EventMirror
from workers.config import AgentConfig, file_stem
from workers.control import (
    ProtocolError,
    connect_unix,
    module_digest,
    recv_message,
    send_message,
    shipped_spec,
)
from workers.spec import DEFAULTS

LOG = logging.getLogger("netai.compute")

#: How long one control request may take before its server counts as hung.
REQUEST_TIMEOUT_S = 30.0
#: How often the events of a far server's running roles are brought here (`far_clock`).
SYNC_S = 0.25


def check_model(spec: str, model_args: Mapping[str, Any], dataset: str = DEFAULTS.dataset,
                dataset_args: Mapping[str, Any] | None = None) -> int:
    """Load the dataset and build the model spec once on this machine, before anything starts, as
    every server will; the size of the model's weights (an uncompressed GLOBAL or UPDATE payload). A
    built-in model whose size is kept (`model_sizes`) is not built again: the same code built it.

    Raises
    ------
    ConfigError
        One line naming the dataset or model and what went wrong (whatever its factory raised).
    """
    return model_sizes(spec, model_args, dataset, dataset_args)[0]


def model_sizes(spec: str, model_args: Mapping[str, Any], dataset: str = DEFAULTS.dataset,
                dataset_args: Mapping[str, Any] | None = None) -> tuple[int, Callable[[int], tuple[int, ...]]]:
    """`check_model`'s size, and the bytes of each chunk frame of one copy when cut at a given chunk
    size (`workers.framing.frame_sizes`, of the model built here), for the flow-level simulation's
    transfers and carried bytes. Kept across processes for a built-in model and dataset
    (`model_counts.kept_sizes`: the model is built only for what is not kept yet). Raises
    `ConfigError` as `check_model`."""
    settings = {"model": spec, "model_args": dict(model_args), "dataset": dataset,
                "dataset_args": dict(dataset_args or {})}
    return model_counts.kept_sizes(settings, partial(_built_sizes, spec, model_args, dataset, dataset_args))


def _built_sizes(spec: str, model_args: Mapping[str, Any], dataset: str,
                 dataset_args: Mapping[str, Any] | None) -> tuple[int, Callable[[int | None], tuple[int, ...]]]:
    """`model_sizes` of the model built here."""
    from workers.data import open_dataset
    from workers.framing import frame_sizes
    from workers.models import build_model, state_nbytes

    try:
        data = open_dataset(dataset, args=dataset_args)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    try:
        built = build_model(spec, input_shape=data.input_shape, num_classes=data.num_classes,
                            model_args=dict(model_args))
    except Exception as e:  # noqa: BLE001 -- the user's factory may raise anything: one line, exit 2
        raise ConfigError(f"model {spec!r} cannot be built: {type(e).__name__}: {e}") from None
    template = {k: v.detach() for k, v in built.state_dict().items()}
    return state_nbytes(built), lru_cache(maxsize=None)(partial(frame_sizes, template))


class ServerProcess(Protocol):
    """A started site server (a process, or an exec in a container)."""

    def poll(self) -> int | None:
        """The exit status, or None while it runs."""

    def stop(self) -> None:
        """Kill it if it still runs; idempotent."""


class SiteBackend(Protocol):
    """Where site servers run (see `orchestrator.runtime.backends`)."""

    name: str
    #: The host directory the servers' log root is (task directories are made under it).
    log_root: Path
    #: The directory of the control sockets, on the host.
    ctl_dir: Path

    def address(self, site: str) -> str:
        """The IPv4 address the site's server and roles bind to."""

    def host_id(self, site: str) -> str:
        """A safe identifier of the site's host (file names); the site name stays data."""

    def launch_server(self, site: str, argv: list[str], *, out_name: str) -> ServerProcess:
        """Start ``python -m workers.site_server`` + `argv` on the site; output to ``servers/<out_name>``
        under the log root."""

    def inside(self, path: Path, site: str | None = None) -> str:
        """`path` (under `log_root` or `ctl_dir`) as `site`'s server sees it."""

    def close(self) -> None:
        """Stop what the backend started beside the servers (the local backends' fork server)."""


def process_state(pid: int) -> str | None:
    """A process's state letter (R, S, D, T, t, Z, ...; /proc/PID/stat); None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


@dataclass
class _Server:
    site: str
    proc: ServerProcess
    sock_path: Path
    conn: socket.socket | None = None
    pid: int = 0
    argv: tuple[str, ...] = ()


class ServerLost(RuntimeError):
    """A site server died or stopped answering."""


class ComputeManager:
    """Site servers on `sites` of `backend`; a context manager (`close` on every exit path)."""

    def __init__(self, backend: SiteBackend, sites: Iterable[str], *, start_timeout_s: float = 180.0,
                 max_roles: int = 64) -> None:
        self.backend = backend
        self.sites = list(dict.fromkeys(sites))
        self.start_timeout_s = start_timeout_s
        self.max_roles = max_roles
        self.servers: dict[str, _Server] = {}
        #: Site -> why its server is gone (detected by `poll` or a failed request).
        self.lost: dict[str, str] = {}
        #: Site -> the largest resident set its server reported (status replies), bytes.
        self.peak_rss: dict[str, int] = {}
        #: Site -> how many times its server was restarted (a role started before knows it is gone).
        self.generation: dict[str, int] = {}
        self._shipped: dict[str, set[str]] = {}
        self._lock = threading.Lock()
        #: The sites whose servers run on other machines: their clocks and events (`far_clock`).
        self.far_sites: set[str] = set(getattr(backend, "far_sites", ()))
        self._synced: dict[str, float] = {}
        #: The folder under the log root that holds the tasks' directories (`task_dir`): a later
        #: session on the same servers (a run on its faithful trial's emulation) takes its own, so
        #: that its tasks' directories (named by scheduler and task id) never meet the trial's.
        self.tasks_folder = "tasks"
        self.mirror = EventMirror(lambda site, rel, offset: self._request(site, {"op": "read", "path": rel,
                                                                                  "offset": offset}),
                                  lambda site: self._request(site, {"op": "hello"}))

    @property
    def name(self) -> str:
        return self.backend.name

    @property
    def log_root(self) -> Path:
        return self.backend.log_root

    def address(self, site: str) -> str:
        return self.backend.address(site)

    # -- life cycle ----------------------------------------------------------------------------------
    def __enter__(self) -> ComputeManager:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> float:
        """Launch every site's server at once and connect to each; the seconds it took.

        Raises
        ------
        RuntimeError
            A server exited before it answered (its last output line in the message).
        TimeoutError
            Not every server answered within `start_timeout_s`.
        """
        t0 = time.monotonic()
        (self.log_root / "servers").mkdir(parents=True, exist_ok=True)
        for site in self.sites:
            hid = self.backend.host_id(site)
            sock = self.backend.ctl_dir / f"{hid}.sock"
            # --key=value: a value that starts with "-" (a site named "-west") stays a value
            inside = partial(self.backend.inside, site=site)
            argv = [f"--site={site}", f"--address={self.backend.address(site)}",
                    f"--socket={inside(sock)}", f"--log-root={inside(self.log_root)}",
                    f"--max-roles={self.max_roles}", f"--log-file={inside(self.log_root / 'servers' / f'{hid}.out.txt')}"]
            proc = self.backend.launch_server(site, argv, out_name=f"{hid}.out.txt")
            self.servers[site] = _Server(site=site, proc=proc, sock_path=sock, argv=tuple(argv))
        deadline = t0 + self.start_timeout_s
        for srv in self.servers.values():
            self._connect(srv, deadline)
        took = time.monotonic() - t0
        LOG.info("%d site servers (%s) up in %.1f s", len(self.servers), self.name, took)
        return took

    def _connect(self, srv: _Server, deadline: float) -> None:
        while True:
            status = srv.proc.poll()
            if status is not None:
                raise RuntimeError(f"the site server of {srv.site!r} exited with status {status} before it "
                                   f"answered: {self.last_words(srv.site)}")
            srv.conn = connect_unix(str(srv.sock_path), REQUEST_TIMEOUT_S)
            if srv.conn is not None:
                reply = self._request(srv.site, {"op": "hello"})
                srv.pid = int(reply.get("pid", 0))
                if srv.site in self.far_sites:
                    offset, within = self.mirror.measure(srv.site)
                    LOG.info("site server of %r: clock offset %+.4f s (+/- %.4f)", srv.site, offset, within)
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the site server of {srv.site!r} did not answer within "
                                   f"{self.start_timeout_s:.0f} s: {self.last_words(srv.site)}")
            time.sleep(0.05)  # waiting for the server to import torch and listen, bounded by the deadline

    # -- faults ----------------------------------------------------------------------------------------
    def kill_server(self, site: str) -> None:
        """Kill `site`'s server at once (SIGKILL: a crash, its roles die with it); it is then lost."""
        srv = self.servers.get(site)
        if srv is None:
            raise ConfigError(f"no site server on {site!r}")
        kill = getattr(srv.proc, "kill", None)
        (kill or srv.proc.stop)()
        deadline = time.monotonic() + 10.0
        while srv.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)  # until the kernel has reaped it; bounded
        if site not in self.lost:
            self._mark_lost(srv, "killed")

    def lose(self, sites: Iterable[str], why: str) -> None:
        """Mark the servers of `sites` lost at once (their machine is gone): no request waits on them."""
        for site in sites:
            srv = self.servers.get(site)
            if srv is not None and site not in self.lost:
                self._mark_lost(srv, why)

    def restart_server(self, site: str) -> float:
        """Start `site`'s server again after it was lost (same arguments); the seconds it took.

        Raises
        ------
        ConfigError
            `site` has no server, or its server is not lost.
        """
        srv = self.servers.get(site)
        if srv is None:
            raise ConfigError(f"no site server on {site!r}")
        if site not in self.lost and srv.proc.poll() is None:
            raise ConfigError(f"the site server of {site!r} is running")
        t0 = time.monotonic()
        srv.proc.stop()
        srv.sock_path.unlink(missing_ok=True)
        srv.proc = self.backend.launch_server(site, list(srv.argv), out_name=f"{self.backend.host_id(site)}.out.txt")
        self._shipped.pop(site, None)
        why = self.lost.pop(site, None)
        self.generation[site] = self.generation.get(site, 0) + 1
        try:
            self._connect(srv, t0 + self.start_timeout_s)
        except BaseException as e:
            self.lost[site] = f"{why or 'lost'}; restart failed: {e}"
            raise
        LOG.info("site server of %r back in %.1f s", site, time.monotonic() - t0)
        return time.monotonic() - t0

    def last_words(self, site: str) -> str:
        """The last line a site's server wrote (for one-line error messages)."""
        out = self.log_root / "servers" / f"{self.backend.host_id(site)}.out.txt"
        lines = out.read_text(errors="replace").strip().splitlines() if out.exists() else []
        return lines[-1] if lines else f"no output (see {out})"

    def close(self) -> None:
        """Shut every server down (closing its connection stops its roles), then make sure it exited.
        A server never connected to (stopped while the servers started) is told nothing, so it is
        stopped at once rather than waited for."""
        told = set()
        for srv in self.servers.values():
            if srv.conn is not None:
                with contextlib.suppress(OSError, ConnectionError, ProtocolError):
                    send_message(srv.conn, {"op": "shutdown"})
                    srv.conn.settimeout(10.0)
                    recv_message(srv.conn)
                with contextlib.suppress(OSError):
                    srv.conn.close()
                srv.conn = None
                told.add(srv.site)
        deadline = time.monotonic() + 10.0
        for srv in self.servers.values():
            try:
                while srv.site in told and srv.proc.poll() is None and time.monotonic() < deadline:
                    time.sleep(0.05)  # the server stops its roles and exits; bounded
                srv.proc.stop()
            except Exception as e:  # noqa: BLE001 -- one server's stop failing must not spare the others
                LOG.warning("stopping the site server of %r: %s", srv.site, e)
        self.servers.clear()
        try:
            self.backend.close()
        except Exception as e:  # noqa: BLE001 -- the control directory still goes
            LOG.warning("stopping the %s backend: %s", self.name, e)
        shutil.rmtree(self.backend.ctl_dir, ignore_errors=True)

    # -- requests ------------------------------------------------------------------------------------
    def _request(self, site: str, msg: Mapping[str, Any]) -> dict[str, Any]:
        """Send one request and return its reply; ServerLost if the server is gone, ConfigError if it
        refused the request."""
        if site in self.lost:
            raise ServerLost(f"the site server of {site!r} is gone: {self.lost[site]}")
        srv = self.servers.get(site)
        if srv is None or srv.conn is None:
            raise ConfigError(f"no site server on {site!r}")
        with self._lock:
            try:
                send_message(srv.conn, msg)
                reply = recv_message(srv.conn)
            except ProtocolError as e:  # too large to send (a model file over the limit): nothing was sent
                raise ConfigError(f"cannot send {msg.get('op')} to the site server of {site!r}: {e}") from e
            except (OSError, ConnectionError) as e:
                reply, why = None, f"{type(e).__name__}: {e}"
            else:
                why = "it closed the control connection"
        if reply is None:
            self._mark_lost(srv, why)
            raise ServerLost(f"the site server of {site!r} is gone: {self.lost[site]}")
        if not reply.get("ok"):
            raise ConfigError(f"the site server of {site!r} refused {msg.get('op')}: {reply.get('error')}")
        return reply

    def _mark_lost(self, srv: _Server, why: str) -> None:
        time.sleep(0.1)  # let a dying process be reaped so its exit status is known
        status = srv.proc.poll()
        self.lost[srv.site] = self._silent_reason(srv, why) if status is None else self._exit_reason(srv, status)
        LOG.warning("site server of %r lost: %s", srv.site, self.lost[srv.site])
        if srv.conn is not None:
            with contextlib.suppress(OSError):
                srv.conn.close()
            srv.conn = None

    def _silent_reason(self, srv: _Server, why: str) -> str:
        """Why a server that still runs counts as lost: `why`, and whether its process is stopped
        (SIGSTOP, a debugger: it cannot answer until continued). Its host pid: the handle's, or the one
        it said hello with (the same pid namespace but in a container)."""
        pid = getattr(srv.proc, "host_pid", None) or srv.pid
        if pid and process_state(int(pid)) in ("T", "t"):
            return f"it stopped answering ({why}): its process {pid} is stopped (SIGSTOP or a debugger)"
        return why

    def _exit_reason(self, srv: _Server, status: int) -> str:
        """Why `srv` exited, one line: killed for memory (its cgroup's limit and peak, `runtime.memory`)
        when its handle can tell, else its exit status."""
        from orchestrator.runtime.memory import lost_reason

        reader = getattr(srv.proc, "memory", None)
        try:
            memory = reader() if reader is not None else None
        except Exception:  # noqa: BLE001 -- the figures are a note: the loss is reported without them
            memory = None
        return lost_reason(srv.site, status, memory, limit_mb=getattr(srv.proc, "memory_mb", None),
                           peak_rss_bytes=self.peak_rss.get(srv.site))

    def ship_model(self, spec: str, sites: Iterable[str]) -> str:
        """The spec the servers of `sites` load the model by: a ``file.py:factory`` spec is read here
        and sent by content (once per server); any other spec is returned unchanged."""
        target, sep, factory = spec.rpartition(":")
        if not sep or not target.endswith(".py"):
            return spec
        path = Path(target)
        try:
            source = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"cannot read model file {path}: {e}") from e
        digest = module_digest(source)
        for site in sites:
            have = self._shipped.setdefault(site, set())
            if digest not in have:
                self._request(site, {"op": "put_module", "digest": digest, "source": source})
                have.add(digest)
        return shipped_spec(digest, factory)

    def start_role(self, site: str, cfg: AgentConfig, events_file: Path, *, checkpoint: bool = False,
                   init_model: Path | None = None) -> None:
        """Start `cfg`'s role on its site's server, logging to `events_file` (under the log root).
        G only: `checkpoint` makes it write its global model after every round (`checkpoint_of`
        its events file); `init_model` (under the log root) is the global model it starts from."""
        msg: dict[str, Any] = {"op": "start", "config": cfg.to_dict(), "events": self._relative(events_file)}
        if site in self.far_sites:  # its events are written there, and brought back here
            getattr(self.backend, "ensure_dir")(site, events_file.parent)  # noqa: B009 -- far backends only
            self.mirror.add(site, msg["events"], events_file)
        if checkpoint:
            msg["checkpoint"] = True
        if init_model is not None:
            msg["init_model"] = self._relative(init_model)
        self._request(site, msg)

    def _relative(self, path: Path) -> str:
        try:
            return str(path.resolve().relative_to(self.log_root.resolve()))
        except ValueError as e:
            raise ConfigError(f"{path} is not under the site servers' log root {self.log_root}") from e

    def stop_roles(self, sites: Iterable[str], task: int) -> None:
        """Cancel a task's roles on `sites` that still run, every one before waiting for any (their
        threads wind down side by side, up to 10 s in all), then drop their records; quiet for a
        server that is gone."""
        def role(site: str) -> dict[str, Any] | None:  # its record on its server (None: none, or gone)
            with contextlib.suppress(ServerLost, ConfigError):
                return dict(self._request(site, {"op": "status"}).get("roles", {}).get(str(task)) or {}) or None
            return None
        roles = {site: role(site) for site in sites}
        held = [site for site, r in roles.items() if r is not None]
        with contextlib.suppress(ServerLost, ConfigError):
            self.mirror.sync([site for site in held if site in self.far_sites])
        winding = [site for site in held if (roles[site] or {}).get("state") in ("starting", "running")]
        for site in winding:
            with contextlib.suppress(ServerLost, ConfigError):
                self._request(site, {"op": "stop", "task": task})
        deadline = time.monotonic() + 10.0
        while winding and time.monotonic() < deadline:
            time.sleep(0.05)  # the roles' threads wind down; bounded
            winding = [site for site in winding if (role(site) or {}).get("state") in ("starting", "running")]
        for site in held:
            with contextlib.suppress(ServerLost, ConfigError):
                self._request(site, {"op": "forget", "task": task})

    def poll(self, sites: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
        """Site -> the server's status reply (roles, cpu_s, rss_bytes), for live servers among
        `sites` (default all); a dead one is added to `lost` instead."""
        out: dict[str, dict[str, Any]] = {}
        for site in self.sites if sites is None else sites:
            if site in self.lost:
                continue
            # a dead server shows as a closed control connection: `_request` marks it lost (no
            # process or Docker query per poll, which runs every few tens of milliseconds)
            with contextlib.suppress(ServerLost):
                out[site] = self._request(site, {"op": "status"})
                rss = int(out[site].get("rss_bytes") or 0)
                if rss > self.peak_rss.get(site, 0):
                    self.peak_rss[site] = rss
                if site in self.far_sites:  # after the status: every line of a role it reports ended is here
                    self._sync(site, out[site])
        return out

    def _sync(self, site: str, status: Mapping[str, Any]) -> None:
        """Bring `site`'s events here (`far_clock.EventMirror`): at most every `SYNC_S` while its roles
        run, at once when one has ended."""
        ended = any(r.get("state") not in ("starting", "running") for r in status.get("roles", {}).values())
        if ended or time.monotonic() - self._synced.get(site, 0.0) >= SYNC_S:
            self._synced[site] = time.monotonic()
            self.mirror.sync([site])

    def events_file(self, log_dir: Path, site: str) -> Path:
        """The events file of `site`'s role in the task directory `log_dir` (a safe file name)."""
        return log_dir / f"{file_stem(site)}.events.jsonl"

    def task_dir(self, name: str) -> Path:
        """A new directory under the log root for one task's events (`name` must be a safe stem)."""
        path = self.log_root / self.tasks_folder / name
        path.mkdir(parents=True, exist_ok=True)
        return path
