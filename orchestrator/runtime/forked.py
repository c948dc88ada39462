"""Site servers forked from one warmed process (`workers.forkserver`), for the local backends.

Torch is imported and warmed once per run instead of once per site: the local backends (loopback,
process, attached) start a fork server beside the first site server they launch (the experiment
launches the process backend's ahead, while the emulation comes up: `early_fork_server`),
then ask it for each server, in the site's network namespace. A server so started behaves as one started with
``python -m workers.site_server``: same arguments, same control socket, same output file.

`ForkServerClient.start` runs ``python -m workers.forkserver`` with the servers' environment and
connects to it (`launch` and `connect` are its two halves); `spawn` returns a `ForkedHandle`, which polls, kills and stops its server through the
fork server (the servers are its children, so it reaps them and knows their exit status). `close`
ends the connection: the fork server then stops whatever it forked that still runs, and exits.

What this module must not do: leave the fork server running (`close` on every exit path of the
backend's user; the fork server also exits when its connection closes or the manager never comes),
or send anything across it but JSON (`workers.control`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from orchestrator.emulation import ctl_dirs
from workers.control import ProtocolError, connect_unix, recv_message, send_message

#: ``0`` turns the fork server off: every local site server imports torch on its own.
ENV_FORKSERVER = "NETAI_FORKSERVER"
#: The checkout: the site servers' working directory and first import path.
PROJECT_ROOT = Path(__file__).resolve().parent.parent.parent
#: How long the fork server may take to import torch, warm up and listen.
START_TIMEOUT_S = 180.0
#: One request's answer (a fork takes milliseconds).
REQUEST_TIMEOUT_S = 30.0
#: How long a stopped server gets after SIGTERM, and again after SIGKILL; how often it is polled meanwhile.
STOP_GRACE_S = 5.0
STOP_POLL_S = 0.05


class ForkServerError(RuntimeError):
    """The fork server did not start, or stopped answering."""


def new_ctl_dir() -> Path:
    """A fresh directory for the site servers' control sockets, only its owner may enter (short, so
    socket paths stay under the kernel's 108-byte limit), named after this process so that the next
    run removes it if this one is killed (`orchestrator.emulation.ctl_dirs`)."""
    return ctl_dirs.make()


def server_env() -> dict[str, str]:
    """The environment of a local site server (and of the fork server): the checkout first on the
    import path, one OpenMP thread unless set, unbuffered output."""
    env = dict(os.environ)
    root = str(PROJECT_ROOT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    return env


class ForkServerClient:
    """One fork server and its connection (see the module's doc)."""

    def __init__(self, popen: subprocess.Popen[bytes], sock_path: Path, log_file: Path) -> None:
        self.popen = popen
        self.sock_path = sock_path
        self.log_file = log_file
        self.conn: socket.socket | None = None
        #: Whether its connection was closed (`_drop`): the fork server is stopping; never connected again.
        self._dropped = False
        self._lock = threading.Lock()
        self._launched = time.monotonic()

    @classmethod
    def launch(cls, cmd: list[str], *, sock_path: Path, log_file: Path, **popen_kw: Any) -> ForkServerClient:
        """Run `cmd` (``python -m workers.forkserver``) listening on `sock_path`, and return at once:
        it imports torch meanwhile; `connect` waits for it. The caller closes it on every exit path."""
        with open(log_file, "ab") as out:
            popen = subprocess.Popen([*cmd, f"--socket={sock_path}"], stdout=out, stderr=subprocess.STDOUT,
                                     **popen_kw)
        return cls(popen, sock_path, log_file)

    @classmethod
    def start(cls, cmd: list[str], *, sock_path: Path, log_file: Path, **popen_kw: Any) -> ForkServerClient:
        """`launch`, then `connect` (it is stopped if that fails)."""
        client = cls.launch(cmd, sock_path=sock_path, log_file=log_file, **popen_kw)
        try:
            client.connect()
        except BaseException:
            client.close()
            raise
        return client

    def connect(self) -> None:
        """Connect, once it listens (at once if connected).

        Raises
        ------
        ForkServerError
            It exited, or did not listen within `START_TIMEOUT_S` of its launch, or its connection
            was closed already.
        """
        if self._dropped:
            raise ForkServerError("the fork server's connection was closed: it stopped its servers")
        if self.conn is None:
            self._connect(self._launched + START_TIMEOUT_S)

    def _connect(self, deadline: float) -> None:
        while True:
            status = self.popen.poll()
            if status is not None:
                raise ForkServerError(f"the fork server exited with status {status}: {self._last_words()}")
            self.conn = connect_unix(str(self.sock_path), REQUEST_TIMEOUT_S)
            if self.conn is not None:
                return
            if time.monotonic() > deadline:
                raise ForkServerError(f"the fork server did not listen within {START_TIMEOUT_S:.0f} s: "
                                      f"{self._last_words()}")
            time.sleep(0.05)  # it imports torch, then listens; bounded by the deadline

    def _last_words(self) -> str:
        lines = self.log_file.read_text(errors="replace").strip().splitlines() if self.log_file.exists() else []
        return lines[-1] if lines else f"no output (see {self.log_file})"

    def request(self, msg: dict[str, Any]) -> dict[str, Any]:
        """One request and its reply.

        Raises
        ------
        ForkServerError
            The connection is closed or broke, or the fork server refused the request.
        """
        with self._lock:
            if self.conn is None:
                raise ForkServerError("the fork server's connection is closed")
            try:
                send_message(self.conn, msg)
                reply = recv_message(self.conn)
            except (OSError, ConnectionError, ProtocolError) as e:
                raise ForkServerError(f"the fork server stopped answering: {e}") from e
            except BaseException:  # Ctrl-C between the request and its reply: the next request would read
                self._drop()       # this one's reply, so the connection goes (its servers with it)
                raise
        if reply is None:
            raise ForkServerError("the fork server closed its connection")
        if not reply.get("ok"):
            raise ForkServerError(f"the fork server refused {msg.get('op')}: {reply.get('error')}")
        return reply

    def spawn(self, argv: list[str], *, netns_pid: int | None, log_file: Path) -> ForkedHandle:
        """A site server forked with `argv`, in the network namespace of `netns_pid` (None: this one)."""
        reply = self.request({"op": "spawn", "argv": list(argv), "netns_pid": netns_pid,
                              "log_file": str(log_file.resolve())})
        return ForkedHandle(self, int(reply["pid"]))

    def _drop(self) -> None:
        """Close the connection, if open: the fork server stops the servers it forked and exits."""
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
            self.conn = None
            self._dropped = True

    def close(self) -> None:
        """Close the connection (the fork server stops its servers and exits); wait for it. One that
        never got a connection (stopped while it started: it forked nothing) would wait for one, so
        it is terminated."""
        with self._lock:
            connected = self.conn is not None or self._dropped
            self._drop()
        if not connected and self.popen.poll() is None:
            self.popen.terminate()
        try:
            self.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(timeout=5)


class ForkedHandle:
    """A site server forked by a `ForkServerClient` (what `ProcessHandle` is for a process of ours)."""

    def __init__(self, client: ForkServerClient, pid: int) -> None:
        self.client = client
        self.pid = pid
        self._status: int | None = None

    def poll(self) -> int | None:
        if self._status is None:
            try:
                status = self.client.request({"op": "status", "pid": self.pid})["status"]
            except ForkServerError:
                status = -int(signal.SIGKILL)  # the fork server is gone: it took its servers with it
            self._status = None if status is None else int(status)
        return self._status

    def _signal(self, sig: int) -> None:
        with contextlib.suppress(ForkServerError):
            self.client.request({"op": "signal", "pid": self.pid, "signal": int(sig)})

    def kill(self) -> None:
        """SIGKILL (a crash, for fault injection)."""
        if self.poll() is None:
            self._signal(signal.SIGKILL)

    def _signal_and_wait(self, sig: int, timeout_s: float) -> int | None:
        """Send `sig`, then poll until the server has exited or `timeout_s` passed; its status."""
        self._signal(sig)
        deadline = time.monotonic() + timeout_s
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(STOP_POLL_S)  # it stops its roles and exits; bounded
        return self.poll()

    def stop(self) -> None:
        """SIGTERM, up to `STOP_GRACE_S` for the server to exit, then SIGKILL and as long again."""
        if self.poll() is None and self._signal_and_wait(signal.SIGTERM, STOP_GRACE_S) is None:
            self._signal_and_wait(signal.SIGKILL, STOP_GRACE_S)


def launch_fork_server(python: str, *, ctl_dir: Path, out_dir: Path, env: dict[str, str]) -> ForkServerClient:
    """`ForkServerClient.launch` of ``python -m workers.forkserver`` with its socket in `ctl_dir` and its
    output in `out_dir`, from the checkout with the servers' environment `env` (`server_env`, plus what a
    backend adds)."""
    return ForkServerClient.launch([python, "-m", "workers.forkserver"], sock_path=ctl_dir / "fork.sock",
                                   log_file=out_dir / "forkserver.out.txt", cwd=str(PROJECT_ROOT), env=env)


@contextlib.contextmanager
def early_fork_server(kind: str, *, log_root: Path) -> Iterator[ForkServerClient | None]:
    """The process backend's fork server, launched now, ahead of the emulation whose hosts it forks
    into: it imports torch while the network comes up (`backends.open_compute` takes it and connects).
    None for another backend or with ``NETAI_FORKSERVER=0``. Stopped on exit, if the backend has not
    stopped it already, and its socket's directory removed."""
    if kind != "process" or os.environ.get(ENV_FORKSERVER, "1") == "0":
        yield None
        return
    (log_root / "servers").mkdir(parents=True, exist_ok=True)
    ctl = new_ctl_dir()
    try:
        forks = launch_fork_server(sys.executable, ctl_dir=ctl, out_dir=log_root / "servers", env=server_env())
        try:
            yield forks
        finally:
            forks.close()
    finally:
        shutil.rmtree(ctl, ignore_errors=True)
