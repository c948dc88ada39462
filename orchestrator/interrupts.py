"""Ctrl-C, remembered: an interrupted command exits 130 on every path.

Python raises `KeyboardInterrupt` at whatever bytecode the main thread runs when SIGINT arrives.
Where that is a ``__del__`` method or a finalizer, the interpreter prints "Exception ignored" and
goes on: the interrupt is lost, and a run could go on to complete and exit 0 (seen once, in the
middle of a task's rounds). So the handler also *remembers* the interrupt: the lifecycle's wait
loops raise it again (`check`), and the command line exits 130 whenever one was received, whatever
the subcommand returned.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any

#: Set once SIGINT has been received by this process (after `install`).
INTERRUPTED = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    INTERRUPTED.set()
    raise KeyboardInterrupt


def install() -> Any:
    """Remember every SIGINT from now on (main thread only); the handler it replaces."""
    if threading.current_thread() is not threading.main_thread():
        return None
    INTERRUPTED.clear()
    return signal.signal(signal.SIGINT, _on_sigint)


def check() -> None:
    """Raise `KeyboardInterrupt` if SIGINT was received (a wait loop's way to stop, should the
    first one have been swallowed)."""
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt
