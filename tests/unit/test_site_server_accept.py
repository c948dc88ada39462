"""A server (a site server, the fork server) waiting for its manager's control connection
(`workers.control.accept_manager`): it takes the connection when it comes, and gives up, saying why, when none can come."""

from __future__ import annotations

import io
import socket
import threading
from pathlib import Path

from workers.control import accept_manager


def _listening(path: Path) -> socket.socket:
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(str(path))
    lsock.listen(1)
    return lsock


def _waiting(lsock: socket.socket, path: Path, out: io.StringIO, timeout_s: float) -> tuple[threading.Thread, list]:
    got: list = []
    t = threading.Thread(target=lambda: got.append(accept_manager(lsock, path, out=out, timeout_s=timeout_s)))
    t.start()
    return t, got


def test_a_manager_that_connects_gets_the_connection(tmp_path: Path) -> None:
    path = tmp_path / "h1.sock"
    out = io.StringIO()
    with _listening(path) as lsock:
        t, got = _waiting(lsock, path, out, timeout_s=60)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as manager:
            manager.connect(str(path))
            t.join(timeout=30)
            assert got and got[0] is not None
            got[0].close()
    assert out.getvalue() == ""


def test_a_removed_control_socket_ends_the_wait_at_once(tmp_path: Path) -> None:
    # Prepare: a server waiting a long time for a manager that was killed before it connected
    path = tmp_path / "h1.sock"
    out = io.StringIO()
    with _listening(path) as lsock:
        t, got = _waiting(lsock, path, out, timeout_s=600)

        # Execute: the run's cleanup removes its control folder's sockets
        path.unlink()
        t.join(timeout=30)

    # Assert: it gave up within its poll, not its 600 s, and said why
    assert not t.is_alive() and got == [None]
    assert "the control socket was removed before a manager connected: exiting" in out.getvalue()


def test_no_manager_within_the_time_limit_ends_the_wait_and_removes_the_socket(tmp_path: Path) -> None:
    path = tmp_path / "h1.sock"
    out = io.StringIO()
    with _listening(path) as lsock:
        t, got = _waiting(lsock, path, out, timeout_s=0.3)
        t.join(timeout=30)

    assert got == [None]
    assert "no manager connected within 0 s: exiting" in out.getvalue()
    assert not path.exists()
