"""The site servers' fork server: what it forks, what it refuses, and that nothing outlives it."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.runtime import forked
from orchestrator.runtime.backends import (
    ENV_FORKSERVER,
    LoopbackBackend,
    ProcessBackend,
    ProcessHandle,
    new_ctl_dir,
)
from orchestrator.runtime.compute import ComputeManager, _Server
from orchestrator.runtime.forked import ForkedHandle, ForkServerClient, ForkServerError, early_fork_server
from workers.control import connect_unix, recv_message, send_message

ROOT = Path(__file__).resolve().parents[2]
_CTL_DIRS: list[Path] = []


def _ctl_dir() -> Path:
    """A control directory as the backends make them (short paths), removed after the module."""
    _CTL_DIRS.append(new_ctl_dir())
    return _CTL_DIRS[-1]


@pytest.fixture(scope="module", autouse=True)
def _remove_ctl_dirs() -> Iterator[None]:
    yield
    for d in _CTL_DIRS:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(scope="module")
def forks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServerClient]:
    d = tmp_path_factory.mktemp("forks")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    client = ForkServerClient.start([sys.executable, "-m", "workers.forkserver"], sock_path=_ctl_dir() / "f.sock",
                                    log_file=d / "forkserver.out.txt", cwd=str(ROOT), env=env)
    yield client
    client.close()


def _server_argv(root: Path, sock: Path, address: str = "127.0.0.91") -> list[str]:
    return [f"--site=s {address}", f"--address={address}", f"--socket={sock}", f"--log-root={root}"]


def _connect(sock: Path) -> tuple[socket.socket, dict[str, object]]:
    """The manager's side of a server's control connection (open: the server exits when it closes)
    and its reply to ``hello``."""
    deadline = time.monotonic() + 30
    # as the manager connects (`connect_unix`): the file exists once bound, and is refused until listening
    while (s := connect_unix(str(sock), timeout=30)) is None:
        assert time.monotonic() < deadline, "the forked server never listened"
        time.sleep(0.02)
    send_message(s, {"op": "hello"})
    reply = recv_message(s)
    assert reply is not None
    return s, reply


def test_a_forked_server_answers_from_its_own_pid_and_is_reaped_after_a_kill(
        forks: ForkServerClient, tmp_path: Path) -> None:
    sock = _ctl_dir() / "s.sock"
    handle = forks.spawn(_server_argv(tmp_path, sock), netns_pid=os.getpid(), log_file=tmp_path / "out.txt")
    conn, reply = _connect(sock)
    assert reply["ok"] and reply["pid"] == handle.pid != forks.popen.pid
    assert handle.poll() is None
    handle.kill()
    conn.close()
    deadline = time.monotonic() + 10
    while handle.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert handle.poll() == -signal.SIGKILL
    assert not Path(f"/proc/{handle.pid}").exists(), "reaped, not a zombie"
    assert "site server of 's 127.0.0.91'" in (tmp_path / "out.txt").read_text()


@pytest.mark.parametrize("msg, error", [
    ({"op": "spawn", "argv": "--site=x", "netns_pid": None, "log_file": "/tmp/x"}, "argv must be a list"),
    ({"op": "spawn", "argv": ["--site=x", 3], "netns_pid": None, "log_file": "/tmp/x"}, "argv must be a list"),
    ({"op": "spawn", "argv": [], "netns_pid": True, "log_file": "/tmp/x"}, "netns_pid must be"),
    ({"op": "spawn", "argv": [], "netns_pid": -4, "log_file": "/tmp/x"}, "netns_pid must be"),
    ({"op": "spawn", "argv": [], "netns_pid": None, "log_file": "out.txt"}, "absolute path"),
    ({"op": "status", "pid": 1}, "was not forked by this server"),
    ({"op": "signal", "pid": 1, "signal": 9}, "was not forked by this server"),
    ({"op": "signal", "pid": 1, "signal": 19}, "SIGTERM or SIGKILL"),
    ({"op": "status", "pid": "1"}, "pid must be an integer"),
    ({"op": "exec", "pid": 1}, "unknown op"),
])
def test_bad_requests_are_refused_and_the_server_goes_on(forks: ForkServerClient, msg: dict[str, object],
                                                          error: str) -> None:
    with pytest.raises(ForkServerError, match=error):
        forks.request(msg)
    assert forks.popen.poll() is None


def test_closing_the_connection_stops_every_server_it_forked(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    client = ForkServerClient.start([sys.executable, "-m", "workers.forkserver"], sock_path=_ctl_dir() / "f.sock",
                                    log_file=tmp_path / "forkserver.out.txt", cwd=str(ROOT), env=env)
    try:
        socks = [_ctl_dir() / f"s{i}.sock" for i in range(2)]
        pids = [client.spawn(_server_argv(tmp_path, s, f"127.0.0.{92 + i}"), netns_pid=None,
                             log_file=tmp_path / f"s{i}.txt").pid for i, s in enumerate(socks)]
        conns = [_connect(s)[0] for s in socks]
        assert all(Path(f"/proc/{p}").exists() for p in pids)
    finally:
        client.close()
    assert client.popen.returncode == 0
    assert [p for p in pids if Path(f"/proc/{p}").exists()] == [], "SIGTERM'd though their managers stayed"
    for c in conns:
        c.close()


def test_a_fork_server_stopped_before_it_listened_is_terminated_not_waited_for(tmp_path: Path) -> None:
    # Ctrl-C while it still imports torch: no connection to close, and it would wait for one
    starting = subprocess.Popen(["sleep", "600"])  # stands in for a fork server not listening yet
    client = ForkServerClient(starting, _ctl_dir() / "f.sock", tmp_path / "forkserver.out.txt")

    client.close()

    assert starting.returncode == -signal.SIGTERM  # ended at once, not killed after a wait


def test_a_fork_server_whose_socket_is_removed_before_a_manager_connected_exits(tmp_path: Path) -> None:
    # Prepare: a fork server listening for a manager that was killed before it connected
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    sock = _ctl_dir() / "f.sock"
    log = tmp_path / "forkserver.out.txt"
    client = ForkServerClient.launch([sys.executable, "-m", "workers.forkserver"], sock_path=sock, log_file=log,
                                     cwd=str(ROOT), env=env)
    try:
        deadline = time.monotonic() + 120
        while "fork server pid" not in log.read_text() and client.popen.poll() is None:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)  # poll interval while it imports torch

        # Execute: the killed run's cleanup removes its control folder's sockets
        sock.unlink()

        # Assert: it exits on its own within its poll (not its 600 s), saying why
        assert client.popen.wait(timeout=60) == 1
    finally:
        client.close()
    assert "the control socket was removed before a manager connected: exiting" in log.read_text()


def test_the_local_backends_fork_their_servers_unless_told_not_to(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    sites = ["a", "b"]
    for setting, kind in (("1", ForkedHandle), ("0", ProcessHandle)):
        monkeypatch.setenv(ENV_FORKSERVER, setting)
        backend = LoopbackBackend(sites, log_root=tmp_path / setting, first_octet=96)
        with ComputeManager(backend, sites) as cm:
            assert {type(s.proc) for s in cm.servers.values()} == {kind}
            pids = {s.pid for s in cm.servers.values()}
            forker = backend._forks.popen.pid if backend._forks else None
        assert (forker is None) == (setting == "0")
        assert [p for p in pids if Path(f"/proc/{p}").exists()] == []
        if forker is not None:
            assert not Path(f"/proc/{forker}").exists(), "the fork server is gone with its manager"


def test_a_backend_that_starts_its_servers_its_own_way_is_not_forked(tmp_path: Path) -> None:
    started: list[list[str]] = []

    class OwnWay(LoopbackBackend):  # as a benchmark's backend that pins its servers with taskset
        forked = False

        def _popen(self, site: str, cmd: list[str], **kw: object) -> subprocess.Popen[bytes]:
            started.append(cmd)
            return super()._popen(site, cmd, **kw)  # type: ignore[arg-type]

    backend = OwnWay(["a"], log_root=tmp_path, first_octet=98)
    with ComputeManager(backend, ["a"]) as cm:
        assert isinstance(cm.servers["a"].proc, ProcessHandle) and backend._forks is None
    assert len(started) == 1 and started[0][1:3] == ["-m", "workers.site_server"]


class _Host:
    """What `ProcessBackend` reads of a Mininet host, for a server bound on loopback in this namespace."""

    def __init__(self, ip: str) -> None:
        self.ip, self.name, self.pid = ip, "h1", os.getpid()

    def IP(self) -> str:  # Mininet's name
        return self.ip


def test_an_early_fork_server_is_only_for_the_process_backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with early_fork_server("docker", log_root=tmp_path / "d") as forks:
        assert forks is None
    monkeypatch.setenv(ENV_FORKSERVER, "0")
    with early_fork_server("process", log_root=tmp_path / "p") as forks:
        assert forks is None
    assert not (tmp_path / "d").exists() and not (tmp_path / "p").exists()


def test_an_early_fork_server_never_used_is_stopped_and_its_socket_directory_removed(tmp_path: Path) -> None:
    with early_fork_server("process", log_root=tmp_path) as forks:
        assert forks is not None and forks.conn is None  # launched, not waited for
        sock_dir = forks.sock_path.parent
        assert sock_dir.is_dir()
    assert forks.popen.returncode is not None
    assert not sock_dir.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="a forked server enters its host's network namespace (root)")
def test_the_process_backend_forks_from_the_fork_server_launched_early(tmp_path: Path) -> None:
    with early_fork_server("process", log_root=tmp_path) as forks:
        assert forks is not None
        backend = ProcessBackend({"a": _Host("127.0.0.99")}, log_root=tmp_path, forks=forks)
        with ComputeManager(backend, ["a"]) as cm:
            handle = cm.servers["a"].proc
            assert isinstance(handle, ForkedHandle) and handle.client is forks
            assert forks.conn is not None  # connected on the first server's launch
            pid = handle.pid
        assert not Path(f"/proc/{pid}").exists()
        assert forks.popen.returncode == 0, "the backend closed it: its connection ended"


def test_ctrl_c_between_a_request_and_its_reply_drops_the_connection_and_the_servers_with_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a fork server with one server forked
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    client = ForkServerClient.start([sys.executable, "-m", "workers.forkserver"], sock_path=_ctl_dir() / "f.sock",
                                    log_file=tmp_path / "forkserver.out.txt", cwd=str(ROOT), env=env)
    try:
        handle = client.spawn(_server_argv(tmp_path, _ctl_dir() / "s.sock", "127.0.0.94"), netns_pid=None,
                              log_file=tmp_path / "s.txt")

        # Execute: Ctrl-C lands while the next spawn's reply is awaited (its reply is left unread)
        def interrupted(conn: socket.socket) -> None:
            raise KeyboardInterrupt

        monkeypatch.setattr(forked, "recv_message", interrupted)
        with pytest.raises(KeyboardInterrupt):
            client.spawn(_server_argv(tmp_path, _ctl_dir() / "t.sock", "127.0.0.95"), netns_pid=None,
                         log_file=tmp_path / "t.txt")
        monkeypatch.undo()

        # Assert: no later request reads that reply (a status would have read the spawn's, with no status
        # in it); the fork server, its connection gone, stopped its servers and exited by itself
        assert client.conn is None
        assert handle.poll() == -signal.SIGKILL
        with pytest.raises(ForkServerError, match="was closed"):
            client.connect()
        assert client.popen.wait(timeout=60) == 0
        assert not Path(f"/proc/{handle.pid}").exists()
    finally:
        client.close()


class _NeverTold:
    """A site server launched but never connected to: it would wait for its manager for ever."""

    def __init__(self) -> None:
        self.polled = self.stopped = 0

    def poll(self) -> int | None:
        self.polled += 1
        return None

    def stop(self) -> None:
        self.stopped += 1


def test_closing_stops_a_server_never_connected_to_at_once(tmp_path: Path) -> None:
    # Prepare: Ctrl-C while the servers start: one launched, not yet connected to
    backend = LoopbackBackend([], log_root=tmp_path, first_octet=97)
    cm = ComputeManager(backend, [])
    never = _NeverTold()
    cm.servers["a"] = _Server(site="a", proc=never, sock_path=tmp_path / "a.sock")

    # Execute
    cm.close()

    # Assert: stopped, not first waited for (told nothing, it would not have exited by itself)
    assert never.stopped == 1 and never.polled == 0
