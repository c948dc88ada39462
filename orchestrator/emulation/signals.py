"""Signals around one run, so that its teardown always runs and runs to the end.

While a run is up, SIGTERM and SIGHUP raise `Terminated` in the main thread (as Ctrl-C raises
KeyboardInterrupt), so the `with Emulation(...)` block unwinds and tears down. During the teardown,
a second Ctrl-C, SIGTERM or SIGHUP is ignored. Off the main thread nothing is changed (Python
delivers signals to the main thread only).
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any


class Terminated(SystemExit):
    """Raised in the main thread on SIGTERM/SIGHUP so that context managers tear down."""


def _raise_terminated(signum: int, _frame: FrameType | None) -> None:
    raise Terminated(128 + signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def terminate_on_signals() -> dict[int, Any]:
    """Make SIGTERM and SIGHUP raise `Terminated`; returns the handlers they had."""
    if not _main_thread():
        return {}
    return {sig: signal.signal(sig, _raise_terminated) for sig in (signal.SIGTERM, signal.SIGHUP)}


def ignore_signals() -> dict[int, Any]:
    """Keep a second Ctrl-C or SIGTERM from interrupting the teardown itself; returns the handlers."""
    if not _main_thread():
        return {}
    return {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}


def restore_signals(saved: dict[int, Any]) -> None:
    for sig, handler in saved.items():
        signal.signal(sig, handler)
