"""Ctrl-C, remembered: an interrupted command exits 130 on every path.

Python raises `KeyboardInterrupt` at whatever bytecode the main thread runs when SIGINT arrives.
Where that is a ``__del__`` method or a finalizer, the interpreter prints "Exception ignored" and
goes on: the interrupt is lost, and a run could go on to complete and exit 0 (seen once, in the
middle of a task's rounds). So the handler also *remembers* the interrupt: the lifecycle's wait
loops raise it again (`check`), and the command line exits 130 whenever one was received, whatever
the subcommand returned.

Some imports must not be interrupted at all. An interrupt inside ``import torch`` lands in its C++
start-up: seen here, the process aborted ("terminate called after throwing ... KeyboardInterrupt"),
the import swallowed the interrupt and completed, or numpy was left half-imported and a later import
failed ("cannot load module more than once per process"). While `install` is in force, SIGINT is
held during the import of the `HELD_IMPORTS`: one that arrives meanwhile is raised once the
package's own code has run, from its import statement (the import then counts as failed, as any
import a KeyboardInterrupt ends; the command is ending anyway).
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.machinery
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from importlib.machinery import ModuleSpec
from types import FrameType, ModuleType
from typing import Any

#: Top-level packages whose import holds SIGINT until it ends (see the module docstring).
HELD_IMPORTS = frozenset({"torch"})

#: Set once SIGINT has been received by this process (after `install`).
INTERRUPTED = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    INTERRUPTED.set()
    raise KeyboardInterrupt


def install() -> Any:
    """Remember every SIGINT from now on, and hold it during the `HELD_IMPORTS` (main thread only);
    the handler it replaces."""
    if threading.current_thread() is not threading.main_thread():
        return None
    INTERRUPTED.clear()
    if not any(isinstance(finder, _HoldDuringImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _HoldDuringImport())
    return signal.signal(signal.SIGINT, _on_sigint)


def uninstall(previous: Any) -> None:
    """Undo `install`: the handler it returned back in place, imports no longer held."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if not isinstance(finder, _HoldDuringImport)]
    if previous is not None:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold SIGINT for the block (main thread only): one that arrives meanwhile is only noted, and
    raised again (to the handler in place before) when the block ends.

    The handler is swapped rather than the signal blocked: with other threads running (torch's
    own), a blocked main thread does not keep the interpreter from running the handler."""
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield
        return
    arrived: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if arrived:
            signal.raise_signal(signal.SIGINT)


class _HeldLoader(importlib.abc.Loader):
    """The module's own loader, run with SIGINT held; the module ends up with its own loader."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        with held():
            self._loader.exec_module(module)


class _HoldDuringImport(importlib.abc.MetaPathFinder):
    """Finds the `HELD_IMPORTS` as the path finder does and hands them to `_HeldLoader`."""

    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> ModuleSpec | None:
        if name not in HELD_IMPORTS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _HeldLoader(spec.loader)
        return spec


def clear_unhandled_mark() -> None:
    """Take back CPython's mark of an interrupt as unhandled, once the command has handled it.

    CPython (3.11, the platform's) marks a KeyboardInterrupt that leaves code run by ``exec`` of a
    string as unhandled, even when a caller catches it; dataclasses and namedtuples build their
    methods that way, so SIGINT during an import lands there now and then (5 of 60 in a sweep of the
    start-up here). A ``python -m`` process so marked ends by raising SIGINT on itself at exit: status
    -2, not the 130 the command returned. The next ``exec`` of a string clears the mark; this is one.
    Call it only on the way out, after the interrupt was handled."""
    exec("pass")  # clears CPython's mark (see above); runs no code of anyone's


def check() -> None:
    """Raise `KeyboardInterrupt` if SIGINT was received (a wait loop's way to stop, should the
    first one have been swallowed)."""
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt
