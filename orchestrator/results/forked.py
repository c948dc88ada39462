"""One piece of a run folder's drawing done in a forked child while this process draws the rest.

A run's figures are drawn after its network is down, on one core of a host that has two or more:
`start` forks a child that calls a function and sends back its result as JSON over a pipe (nothing
is pickled), and `Forked.result` waits for it. The child draws with the matplotlib this process has
already imported and writes its own files; it never touches the results database (its SQLite
connection is this process's) and ends with ``os._exit`` (no exit handler of this process runs
twice). SIGINT and SIGTERM end it at once: a Ctrl-C is the parent's to handle.

Whatever goes wrong with the child (no fork, an exception there, a result that is not JSON, no
answer within `WAIT_S`), `Forked.result` calls the function here instead, so the figures are drawn
either way; the child is then ended and reaped.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import time
from collections.abc import Callable
from typing import Any

LOG = logging.getLogger("netai.figures")

#: How long `Forked.result` waits for the child before drawing here instead (the summary plots take
#: about a second).
WAIT_S = 30.0


class Forked:
    """The function `start` gave a child, and how to get its result (`result`)."""

    def __init__(self, fn: Callable[[], Any], pid: int | None, fd: int | None) -> None:
        self.fn, self.pid, self.fd = fn, pid, fd

    def result(self, wait_s: float = WAIT_S) -> Any:
        """The child's result, JSON-decoded; the function's own (called here) if the child gave none."""
        if self.pid is None or self.fd is None:
            return self.fn()
        data, ok = bytearray(), False
        try:
            deadline = time.monotonic() + wait_s
            while (left := deadline - time.monotonic()) > 0 and select.select([self.fd], [], [], left)[0]:
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:  # the child closed its end: it has sent all and is exiting
                    ok = self._reap(done=True) == 0
                    break
                data += chunk
        finally:
            os.close(self.fd)
            self.fd = None
            self._reap(done=False)
        if ok:
            try:
                return json.loads(data)
            except ValueError:
                pass
        LOG.warning("the forked drawing of %s gave no result: drawn here instead", getattr(self.fn, "__name__", "?"))
        return self.fn()

    def close(self) -> None:
        """The child ended (killed if it still runs) and reaped, its result dropped: for a caller that
        will not ask for it (an exception on its way out)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self._reap(done=False)

    def _reap(self, *, done: bool) -> int | None:
        """The child's exit status (`done`: it closed its end, so it is given 5 s to exit; otherwise,
        or after those, it is killed first). None if it was killed, or reaped already."""
        if self.pid is None:
            return None
        pid, self.pid = self.pid, None
        if not done:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None
        deadline = time.monotonic() + 5.0
        while True:
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                return os.waitstatus_to_exitcode(status)
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                return None
            time.sleep(0.005)


def start(fn: Callable[[], Any]) -> Forked:
    """`fn` called in a forked child from now on (see the module docstring); without fork, later here."""
    if not hasattr(os, "fork"):
        return Forked(fn, None, None)
    r, w = os.pipe()
    try:
        pid = os.fork()
    except OSError as e:
        os.close(r)
        os.close(w)
        LOG.warning("cannot fork to draw %s (%s): drawn here", getattr(fn, "__name__", "?"), e)
        return Forked(fn, None, None)
    if pid == 0:  # the child: never returns into the caller's frames
        code = 1
        try:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.close(r)
            payload = json.dumps(fn()).encode()
            view = memoryview(payload)
            while view:
                view = view[os.write(w, view):]
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    return Forked(fn, pid, r)
