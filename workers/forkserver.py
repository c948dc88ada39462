"""The site servers' fork server: torch imported and warmed once, then one fork per site server.

A site server's start is mostly one-time work: importing torch and the agent, and a first forward
and backward pass (`workers.learning.warm_process`), about 3 s of CPU each. Fourteen servers
started at once on a two-core host took 17 s. The fork server pays that work once, in a process
that stays single-threaded, and forks each server from it: the fork shares the warmed interpreter's
pages copy-on-write, enters its site's network namespace, and serves like a server started on its
own (`workers.site_server.serve_warm`).

Started by the local backends (`orchestrator.runtime.backends`) in the orchestrator's namespace::

    python -m workers.forkserver --socket PATH --log-file FILE

It serves one connection on the Unix socket `PATH` (owner only), requests one at a time, framed as
the site servers' control protocol (`workers.control`: JSON, never pickle):

- ``{"op": "spawn", "argv": [...], "netns_pid": PID or null, "log_file": PATH}``: fork a site server
  with these arguments (``--key=value``, as ``python -m workers.site_server`` takes them), in the
  network namespace (and mount namespace, when it differs) of process `PID`, output appended to
  `PATH`; the reply carries its ``pid``;
- ``{"op": "status", "pid": PID}``: its exit status (``None`` while it runs; negative: the signal
  that ended it, as `subprocess.Popen` says it);
- ``{"op": "signal", "pid": PID, "signal": N}``: send a signal to one of its own servers.

When the connection closes, every server it forked that still runs gets SIGTERM, then SIGKILL
after `STOP_GRACE_S`, and the fork server exits. What it must not do: fork from more than one
thread (it checks that it is alone before every fork), signal a process it did not fork, or listen
on anything but its Unix socket.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from workers.control import ProtocolError, accept_manager, listen, recv_message, send_message

#: How long forked servers get to exit on SIGTERM when the manager went away.
STOP_GRACE_S = 5.0
_CLONE_NEWNS, _CLONE_NEWNET = 0x00020000, 0x40000000


class ForkServer:
    """The forked servers' table: spawn, reap, status and signal."""

    def __init__(self) -> None:
        self.running: set[int] = set()
        self.status: dict[int, int] = {}

    def handle(self, msg: Mapping[str, Any], closing: list[socket.socket]) -> dict[str, Any]:
        op = msg.get("op")
        try:
            if op == "spawn":
                return {"ok": True, "pid": self.spawn(msg, closing)}
            pid = msg.get("pid")
            if not isinstance(pid, int) or isinstance(pid, bool):
                raise ValueError("pid must be an integer")
            if op == "status":
                self.reap()
                return {"ok": True, "status": self.status.get(pid) if pid in self.status or pid in self.running
                        else _unknown(pid)}
            if op == "signal":
                sig = msg.get("signal")
                if not isinstance(sig, int) or isinstance(sig, bool) or sig not in (signal.SIGTERM, signal.SIGKILL):
                    raise ValueError("signal must be SIGTERM or SIGKILL")
                self.reap()
                if pid in self.running:
                    os.kill(pid, sig)
                elif pid not in self.status:
                    _unknown(pid)
                return {"ok": True}
            raise ValueError(f"unknown op {op!r}")
        except (ValueError, OSError) as e:
            return {"ok": False, "error": str(e)}

    def spawn(self, msg: Mapping[str, Any], closing: list[socket.socket]) -> int:
        argv, netns_pid, log_file = msg.get("argv"), msg.get("netns_pid"), msg.get("log_file")
        if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
            raise ValueError("argv must be a list of strings")
        if netns_pid is not None and (not isinstance(netns_pid, int) or isinstance(netns_pid, bool)
                                      or netns_pid <= 0):
            raise ValueError("netns_pid must be a positive integer or null")
        if not isinstance(log_file, str) or not os.path.isabs(log_file):
            raise ValueError("log_file must be an absolute path")
        alone = threading.active_count() == 1 and len(os.listdir("/proc/self/task")) == 1
        if not alone:
            raise ValueError("the fork server is not single-threaded: forking it is not safe")
        ns_fds = _namespace_fds(netns_pid) if netns_pid is not None else []
        pid = os.fork()
        if pid == 0:  # the child: never returns
            _child(argv, ns_fds, log_file, closing)
        for fd, _ in ns_fds:
            os.close(fd)
        self.running.add(pid)
        return pid

    def reap(self) -> None:
        for pid in list(self.running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self.running.discard(pid)
                self.status[pid] = os.waitstatus_to_exitcode(status)

    def stop_all(self) -> None:
        self.reap()
        for pid in self.running:
            _signal(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while self.running and time.monotonic() < deadline:
            time.sleep(0.05)  # the servers stop their roles and exit; bounded
            self.reap()
        for pid in self.running:
            _signal(pid, signal.SIGKILL)
        for pid in list(self.running):
            os.waitpid(pid, 0)
        self.running.clear()


def _unknown(pid: int) -> int:
    raise ValueError(f"process {pid} was not forked by this server")


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _namespace_fds(pid: int) -> list[tuple[int, int]]:
    """Open `pid`'s network namespace, and its mount namespace where it differs from ours (as
    Mininet's ``mnexec -a`` enters both): (fd, clone flag) pairs."""
    out = [(os.open(f"/proc/{pid}/ns/net", os.O_RDONLY), _CLONE_NEWNET)]
    if os.stat(f"/proc/{pid}/ns/mnt").st_ino != os.stat("/proc/self/ns/mnt").st_ino:
        out.append((os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY), _CLONE_NEWNS))
    return out


def _child(argv: list[str], ns_fds: list[tuple[int, int]], log_file: str, closing: list[socket.socket]) -> None:
    """The forked site server: its own session, its output to `log_file`, its site's namespaces."""
    code = 70
    try:
        for s in closing:
            s.close()
        os.setsid()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        out = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        libc = ctypes.CDLL(None, use_errno=True)
        for fd, flag in ns_fds:
            if libc.setns(fd, flag) != 0:
                raise OSError(ctypes.get_errno(), f"setns: {os.strerror(ctypes.get_errno())}")
            os.close(fd)
        from workers.site_server import serve_warm

        code = serve_warm(argv)
    except BaseException as e:  # noqa: BLE001 -- the child must never return into the fork server's loop
        print(f"forked site server failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def serve(sock_path: Path) -> int:
    """Listen on `sock_path`, serve one manager connection, stop every forked server when it ends."""
    lsock = listen(sock_path)
    print(f"fork server pid {os.getpid()} at {sock_path}", flush=True)
    try:
        conn = accept_manager(lsock, sock_path, out=sys.stdout)  # gone with its run's folder, or in 600 s
    finally:
        sock_path.unlink(missing_ok=True)
    if conn is None:
        lsock.close()
        return 1
    conn.settimeout(None)
    table = ForkServer()
    try:
        while True:
            try:
                msg = recv_message(conn)
            except ProtocolError as e:
                send_message(conn, {"ok": False, "error": str(e)})
                continue
            if msg is None:
                break
            send_message(conn, table.handle(msg, [lsock, conn]))
    except (ConnectionError, OSError) as e:
        print(f"manager connection lost: {e}", flush=True)
    finally:
        conn.close()
        lsock.close()
        table.stop_all()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.forkserver", description=__doc__.split("\n")[0])
    parser.add_argument("--socket", required=True, type=Path, help="the Unix socket to serve on")
    parser.add_argument("--log-file", type=Path, help="write the fork server's own output to this file")
    args = parser.parse_args(argv)
    if args.log_file:
        sys.stdout = sys.stderr = open(args.log_file, "a", encoding="utf-8", buffering=1)
    # no OpenMP pool before a fork (a forked pool hangs): one thread here; a child's --threads still applies
    os.environ["OMP_NUM_THREADS"] = "1"
    from workers.site_server import warm

    warm(threads=1)
    return serve(args.socket)


if __name__ == "__main__":
    status = main()
    # Its servers stopped (`ForkServer.stop_all`): the interpreter's own teardown of torch's modules
    # would hold the run's close up by about half a second more, as a site server's would (its exit).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
