"""The site server: one long-lived worker process per compute site, hosting the roles of many tasks.

Started once per emulation on the site's backend (its container, its Mininet host, or a loopback
address) by the computing manager (`orchestrator.runtime.compute`)::

    python -m workers.site_server --site NAME --address IP --socket PATH --log-root DIR

It imports torch once, then serves the control protocol (`workers.control`) on the Unix socket
`PATH`: one connection, requests one at a time. A ``start`` request runs a role of a task
(`workers.agent.Agent`) on a thread of this process, so starting a task's roles costs messages,
not processes. When the control connection closes (the manager is done, or died), the server stops
every role and exits.

What it checks before it starts a role: the config is a valid `AgentConfig`; the role binds to this
site's address (``--address``) and no other; its events file lies under ``--log-root``; its model is
a registered name, an importable module, or a module shipped to this server by ``put_module`` (never a
path on the server's file system); at most ``--max-roles`` roles are active.

Memory. A role's agent holds several copies of the model (docs/long-runs.md, "A site's memory"),
and its objects refer to each other (connections call back into the round engine), so reference
counting alone does not free them. When a role ends, when it is forgotten and before a role starts
(a role the manager never forgot), its server drops the agent, collects the cycles and gives the
freed heap back to the system (`release_memory`). Before, a site server kept every ended role of a
40 MB model until the interpreter's occasional full collection, and grew by about 200 MB a task
until its container's memory limit killed it. The objects of the imports and the warm-up are
frozen out of the collector (``gc.freeze``), so a collection walks only the roles' objects: about a
millisecond, not 70.

What it must not do: bind a network address for control, unpickle anything, or load a model file
it was not sent.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from workers import priority
from workers.config import CHECKPOINT_SUFFIX, WILDCARD_ADDRESSES, AgentConfig, checkpoint_of
from workers.control import (
    PROTOCOL_VERSION,
    ProtocolError,
    accept_manager,
    check_request,
    listen,
    parse_shipped,
    recv_message,
    send_message,
)
from workers.events import EventLog
from workers.events import now as events_clock

DEFAULT_MAX_ROLES = 64
#: The most a ``read`` reply carries (well under the protocol's 4 MiB message limit).
READ_BYTES = 1 << 20


class _RoleLog(EventLog):
    """The role's events, remembering its last error for the status reply."""

    last_error = ""

    def emit(self, event: str, round: int | None = None, **extra: Any) -> float:
        if event == "error":
            self.last_error = str(extra.get("detail", "error"))
        return super().emit(event, round, **extra)


class Role:
    """One role of one task on this server, run on its own thread."""

    def __init__(self, cfg: AgentConfig, events_path: Path) -> None:
        self.cfg = cfg
        self.events_path = events_path
        self.state = "starting"
        self.status: int | None = None
        self.error = ""
        self._agent: Any = None
        self._cancel: str | None = None
        self._lock = threading.Lock()
        self.thread = threading.Thread(target=self._main, name=f"task{cfg.task}", daemon=True)

    def _main(self) -> None:
        """Run the role, then free what it held (its agent is unreachable once `_run` returned)."""
        self._run()
        release_memory()

    def _run(self) -> None:
        from workers.agent import Agent

        status, error = 1, ""
        try:
            with open(self.events_path, "a", encoding="utf-8") as stream:
                log = _RoleLog(self.cfg, stream)
                try:
                    agent = Agent(self.cfg, log)
                    with self._lock:
                        self._agent, self.state, cancel = agent, "running", self._cancel
                    if cancel is not None:
                        agent.cancel(cancel)
                    status = agent.run()
                except BaseException as e:  # noqa: BLE001 -- any failure of the role (even SystemExit from a
                    # user's model) is reported; the server and its other roles go on
                    log.emit("error", detail=f"{type(e).__name__}: {e}")
                error = log.last_error
        except OSError as e:
            error = f"cannot write the events file: {e}"
        finally:
            with self._lock:
                self.error = error if status != 0 else ""
                self.status = status
                self.state = "done" if status == 0 else "failed"
                self._agent = None  # the role's model copies go with it (`release_memory`)

    def cancel(self, reason: str) -> None:
        with self._lock:
            self._cancel = reason
            agent = self._agent
        if agent is not None:
            agent.cancel(reason)

    @property
    def active(self) -> bool:
        return self.state in ("starting", "running")

    def report(self) -> dict[str, Any]:
        with self._lock:
            return {"site": self.cfg.site, "state": self.state, "status": self.status, "error": self.error}


def release_memory() -> None:
    """Collect unreachable cycles (an ended role's agent) and return the freed heap to the system
    (glibc's ``malloc_trim``; a no-op where the C library has none)."""
    gc.collect()
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


#: The longest a status reply's memory figures may be stale. Reading PSS walks the process's page
#: tables (``/proc/self/smaps_rollup``) under its memory-map lock; the task runner polls the status
#: every 50 ms, and reading it that often took measurable time from the agent's own transfers.
MEMORY_REFRESH_S = 1.0


def _read_memory() -> tuple[int, int]:
    """(resident, proportional) set size of this process: RSS counts the shared libraries in full in
    every server, PSS divides each shared page among the processes that map it (sums to the machine's)."""
    rss = pss = 0
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss"):
                kib = int(rest.split()[0]) * 1024
                rss, pss = (kib, pss) if key == "Rss" else (rss, kib)
    except (OSError, IndexError, ValueError):
        pass
    return rss, pss


class _MemoryReading:
    """`_read_memory`, read again only once the last reading is `MEMORY_REFRESH_S` old."""

    def __init__(self, clock: Any = time.monotonic, read: Any = _read_memory) -> None:
        self.clock, self.read = clock, read
        self.at: float | None = None
        self.value = (0, 0)

    def __call__(self) -> tuple[int, int]:
        now = self.clock()
        if self.at is None or now - self.at >= MEMORY_REFRESH_S:
            self.value, self.at = self.read(), now
        return self.value


class SiteServer:
    """The roles of one site and the requests that manage them (`handle` answers one request)."""

    def __init__(self, *, site: str, address: str, log_root: Path, cache_dir: Path,
                 max_roles: int = DEFAULT_MAX_ROLES) -> None:
        self.site = site
        self.address = address
        self.log_root = log_root.resolve()
        self.cache_dir = cache_dir
        self.max_roles = max_roles
        self.roles: dict[int, Role] = {}
        self.modules: set[str] = set()
        self._memory = _MemoryReading()

    def handle(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        """The reply to one request; a bad request gets ``ok: false`` and changes nothing."""
        try:
            op = check_request(msg)
            return {"ok": True, **getattr(self, "_op_" + op)(msg)}
        except (ProtocolError, ValueError) as e:
            return {"ok": False, "error": str(e)[:2000]}
        except Exception as e:  # noqa: BLE001 -- a request the checks missed must not end the server
            return {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000]}

    def _op_hello(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        return {"site": self.site, "address": self.address, "pid": os.getpid(), "version": PROTOCOL_VERSION,
                "clock": events_clock()}

    def _op_read(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        """Whole lines of an events file under the log root from byte `offset` (at most `READ_BYTES`):
        how the events of a server on another machine reach the orchestrator."""
        path = self._events_path(msg["path"])
        if msg["offset"] < 0:
            raise ValueError("read: offset must be >= 0")
        if not path.exists():
            return {"data": "", "size": 0}
        with open(path, "rb") as f:
            f.seek(msg["offset"])
            chunk = f.read(READ_BYTES)
        whole = chunk[:chunk.rfind(b"\n") + 1]
        return {"data": whole.decode("utf-8", errors="replace"), "size": len(whole)}

    def _op_put_module(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        path = self.cache_dir / f"{msg['digest']}.py"
        if msg["digest"] not in self.modules:
            path.write_text(msg["source"], encoding="utf-8")
            self.modules.add(msg["digest"])
        return {}

    def _events_path(self, rel: str) -> Path:
        p = Path(rel)
        if p.is_absolute() or ".." in p.parts or not p.parts:
            raise ValueError(f"events path {rel!r} must be relative to the log root, without '..'")
        path = (self.log_root / p).resolve()
        if not path.is_relative_to(self.log_root) or not path.parent.is_dir():
            raise ValueError(f"events path {rel!r} is not in an existing directory under the log root")
        if not path.name.endswith(".events.jsonl") or path.is_dir():
            raise ValueError(f"events path {rel!r} must name a *.events.jsonl file")
        return path

    def _model_file(self, rel: str) -> Path:
        p = Path(rel)
        if p.is_absolute() or ".." in p.parts or not p.parts:
            raise ValueError(f"model file {rel!r} must be relative to the log root, without '..'")
        path = (self.log_root / p).resolve()
        if not path.is_relative_to(self.log_root) or not path.name.endswith(CHECKPOINT_SUFFIX) \
                or not path.is_file():
            raise ValueError(f"model file {rel!r} is not an existing *{CHECKPOINT_SUFFIX} file under the log root")
        return path

    def _model_spec(self, spec: str, what: str = "model") -> str:
        """Where this server loads a model (or, `what`, a selection policy) from: a shipped module's
        cached copy, or the spec itself; a file spec by path is refused."""
        shipped = parse_shipped(spec)
        if shipped is not None:
            digest, factory = shipped
            if digest not in self.modules:
                raise ValueError(f"{what} module {digest[:12]} was not sent to this server (put_module)")
            return f"{self.cache_dir / (digest + '.py')}:{factory}"
        target = spec.rpartition(":")[0]
        if target.endswith(".py"):
            raise ValueError(f"{what} {spec!r}: a {what} file reaches a site server by put_module, not by path")
        return spec

    def _op_start(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        from dataclasses import replace

        cfg = AgentConfig.from_dict(msg["config"])
        if cfg.site != self.site:
            raise ValueError(f"this server hosts site {self.site!r}, not {cfg.site!r}")
        if cfg.host != self.address:
            raise ValueError(f"a role binds to this site's address {self.address}, not {cfg.host}")
        old = self.roles.get(cfg.task)
        if old is not None:
            raise ValueError(f"task {cfg.task} already has a role here ({old.state}); forget it first")
        if sum(r.active for r in self.roles.values()) >= self.max_roles:
            raise ValueError(f"this server already runs {self.max_roles} roles")
        if cfg.init_model is not None or cfg.checkpoint_path is not None:
            raise ValueError("init_model and checkpoint_path are set by the server (start's own fields)")
        events = self._events_path(msg["events"])
        files: dict[str, Any] = {}
        if msg.get("checkpoint") or msg.get("init_model") is not None:
            if not cfg.is_global:
                raise ValueError("only G writes or starts from a global model file")
            if msg.get("checkpoint"):
                files["checkpoint_path"] = str(checkpoint_of(events))
            if msg.get("init_model") is not None:
                files["init_model"] = str(self._model_file(msg["init_model"]))
        if cfg.selection is not None and isinstance(cfg.selection.get("policy"), str):
            policy = self._model_spec(cfg.selection["policy"], "selection policy")
            files["selection"] = {**cfg.selection, "policy": policy}
        cfg = replace(cfg, model=self._model_spec(cfg.model), dataset=self._model_spec(cfg.dataset, "dataset"),
                      events_path=str(events), **files)
        release_memory()  # ended roles' leftovers, before the new role's peak
        role = Role(cfg, events)
        self.roles[cfg.task] = role
        role.thread.start()
        return {}

    def _op_status(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        t = os.times()
        rss, pss = self._memory()
        return {"roles": {str(k): r.report() for k, r in self.roles.items()},
                "cpu_s": t.user + t.system, "rss_bytes": rss, "pss_bytes": pss, "threads": threading.active_count()}

    def _role(self, task: int) -> Role:
        role = self.roles.get(task)
        if role is None:
            raise ValueError(f"no role of task {task} here")
        return role

    def _op_stop(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        self._role(msg["task"]).cancel("stopped by the computing manager")
        return {}

    def _op_forget(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        role = self._role(msg["task"])
        if role.active:
            raise ValueError(f"the role of task {msg['task']} is still {role.state}: stop it first")
        del self.roles[msg["task"]]
        del role
        release_memory()  # what the role's own release could not free yet (its senders still closing)
        return {}

    def _op_shutdown(self, msg: Mapping[str, Any]) -> dict[str, Any]:
        return {}

    def stop_all(self, timeout_s: float = 5.0) -> None:
        for role in self.roles.values():
            if role.active:
                role.cancel("the site server is shutting down")
        for role in self.roles.values():
            role.thread.join(timeout=timeout_s)


def _log_rejected(out: IO[str], what: str, error: object) -> None:
    """One line of the server's output for a refused control message (any text, escaped to print)."""
    line = f"rejected control {what}: {error}"[:2000]
    # control characters (a "\r" in a key name) are escaped, so that the entry stays one line
    line = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in line)
    print(line.encode("utf-8", "backslashreplace").decode("utf-8"), file=out, flush=True)


def serve(server: SiteServer, sock_path: Path, *, out: IO[str]) -> int:
    """Listen on `sock_path`, serve one control connection, stop every role when it ends. A refused
    message or request is answered ``ok: false`` and logged to `out` as one ``rejected control`` line."""
    # the control loop starts, polls and stops roles while others run rounds: network-path work
    applied = priority.enter_transfer()
    lsock = listen(sock_path)
    print(f"site server of {server.site!r} at {server.address}, pid {os.getpid()}, control {sock_path}, "
          f"control thread's priority: {applied}", file=out, flush=True)
    try:
        conn = accept_manager(lsock, sock_path, out=out)
    finally:
        lsock.close()
    if conn is None:
        return 1
    conn.settimeout(None)
    sock_path.unlink(missing_ok=True)
    try:
        while True:
            try:
                msg = recv_message(conn)
            except ProtocolError as e:
                _log_rejected(out, "message", e)
                send_message(conn, {"ok": False, "error": str(e)})
                continue
            if msg is None:
                break
            reply = server.handle(msg)
            if not reply["ok"]:
                _log_rejected(out, f"request {msg.get('op')!r}"[:80], reply["error"])
            try:
                send_message(conn, reply)
            except ProtocolError as e:  # a reply too large to send: say so instead
                send_message(conn, {"ok": False, "error": str(e)})
            if reply["ok"] and msg.get("op") == "shutdown":  # a refused shutdown changes nothing either
                break
    except (ConnectionError, OSError) as e:
        print(f"control connection lost: {e}", file=out, flush=True)
    finally:
        conn.close()
        server.stop_all()
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m workers.site_server", description=__doc__.split("\n")[0])
    parser.add_argument("--site", required=True, help="the site's name (data: any text)")
    parser.add_argument("--address", required=True, help="the site's own IPv4 address; roles bind to it only")
    parser.add_argument("--socket", required=True, type=Path, help="the control socket's path")
    parser.add_argument("--log-root", required=True, type=Path, help="the directory the roles' events go under")
    parser.add_argument("--max-roles", type=int, default=DEFAULT_MAX_ROLES)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (intra-op) of the process")
    parser.add_argument("--log-file", type=Path, help="write the server's own output to this file")
    return parser


def warm(threads: int) -> None:
    """Import torch and the agent's modules and pay their first-use costs, once per process: roles
    then start in milliseconds (the fork server does this once for every server it forks)."""
    import torch

    import workers.agent  # noqa: F401 -- the agent's modules, loaded once too
    from workers.learning import tune_process, warm_process

    tune_process()
    torch.set_num_threads(max(1, threads))
    warm_process()


def address_refusal(address: str) -> str | None:
    """Why a site server refuses `address` as its ``--address`` (a wildcard, `WILDCARD_ADDRESSES`),
    or None: the roles may bind to it."""
    if address in WILDCARD_ADDRESSES:
        return "site server: --address must be the site's own address, not a wildcard"
    return None


def serve_warm(argv: list[str]) -> int:
    """Parse `argv` and serve, in a process that has already run `warm` (this one, or the fork server
    this process was forked from)."""
    args = _parser().parse_args(argv)
    if args.log_file:
        sys.stdout = sys.stderr = open(args.log_file, "a", encoding="utf-8", buffering=1)
    if (why := address_refusal(args.address)) is not None:
        print(why, file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(max(1, args.threads))
    gc.freeze()  # the imports' and warm-up's objects: a role's collection walks its own only
    # beside the control socket, in the run's control directory: the orchestrator removes that on
    # every exit, so a server killed outright (fault injection, a lost machine) leaves no cache behind
    with tempfile.TemporaryDirectory(prefix="models-", dir=args.socket.parent) as cache:
        server = SiteServer(site=args.site, address=args.address, log_root=args.log_root, cache_dir=Path(cache),
                            max_roles=args.max_roles)
        return serve(server, args.socket, out=sys.stdout)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # a bad argument fails before torch is imported
    if address_refusal(args.address) is None:  # a refused one fails in serve_warm, torch not imported
        warm(args.threads)
    return serve_warm(sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    status = main()
    # Served: its roles stopped (their events flushed line by line), its model cache removed. The
    # interpreter's own teardown of torch's modules would take about a second of CPU more (14
    # servers in containers closing at once on two cores took 7 s): exit as a forked server does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
