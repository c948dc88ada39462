"""An interrupted command exits 130 on every path, even where the KeyboardInterrupt itself is
swallowed (raised inside a ``__del__``, which the interpreter reports and ignores)."""

from __future__ import annotations

import argparse
import gc
import os
import signal
from typing import Any

import pytest

from orchestrator import cli, interrupts


def _parser_running(func: Any) -> Any:
    def build() -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser(prog="netai")
        parser.set_defaults(func=func)
        return parser
    return build


class _InterruptedWhileCollected:
    """An object whose finalizer is where SIGINT lands: its KeyboardInterrupt is ignored."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the ignored interrupt itself
def test_an_interrupt_swallowed_in_a_finalizer_still_exits_130(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    ran_on = []
    before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN in a background job

    def subcommand(_args: argparse.Namespace) -> int:
        obj = _InterruptedWhileCollected()
        del obj  # SIGINT arrives inside __del__: "Exception ignored in ..." and the command goes on
        gc.collect()
        ran_on.append("after")
        return 0

    monkeypatch.setattr(cli, "build_parser", _parser_running(subcommand))
    status = cli.main([])
    assert ran_on == ["after"], "the interrupt was not swallowed: this test no longer shows the window"
    assert status == 130
    assert "netai: interrupted" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is before  # the command put back what it found


def test_a_wait_loop_raises_a_remembered_interrupt(monkeypatch: pytest.MonkeyPatch) -> None:
    def subcommand(_args: argparse.Namespace) -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass  # swallowed by some library on the way
        interrupts.check()  # what every lifecycle wait loop calls before it sleeps
        return 0

    monkeypatch.setattr(cli, "build_parser", _parser_running(subcommand))
    assert cli.main([]) == 130


def test_a_normal_end_and_a_usage_error_keep_their_status(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "build_parser", _parser_running(lambda _a: 0))
    assert cli.main([]) == 0

    def bad(_args: argparse.Namespace) -> int:
        raise cli.ConfigError("no such topology")

    monkeypatch.setattr(cli, "build_parser", _parser_running(bad))
    assert cli.main([]) == 2


def test_a_display_ended_by_ctrl_c_may_exit_0(monkeypatch: pytest.MonkeyPatch) -> None:
    def watch(_args: argparse.Namespace) -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            interrupts.INTERRUPTED.clear()  # as `netai flows --watch` and `netai dashboard` do
            return 0
        return 1

    monkeypatch.setattr(cli, "build_parser", _parser_running(watch))
    assert cli.main([]) == 0


def test_an_import_an_interrupt_cut_short_exits_130_not_with_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    """numpy, interrupted mid-import, fails the next import with ImportError ("cannot load module
    more than once per process"): after an interrupt that is an interrupted run, not a crash."""
    def subcommand(_args: argparse.Namespace) -> int:
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            pass
        raise ImportError("cannot load module more than once per process")

    monkeypatch.setattr(cli, "build_parser", _parser_running(subcommand))
    assert cli.main([]) == 130

    def broken(_args: argparse.Namespace) -> int:
        raise ImportError("no module named nothing")

    interrupts.INTERRUPTED.clear()
    monkeypatch.setattr(cli, "build_parser", _parser_running(broken))
    with pytest.raises(ImportError):  # without an interrupt, an error is an error
        cli.main([])


_SLOW_PACKAGE = '''
import os, pathlib, signal
os.kill(os.getpid(), signal.SIGINT)                      # Ctrl-C lands mid-import ...
pathlib.Path(__file__).with_name("ran").write_text("to the end")  # ... and the import runs on
'''


def test_sigint_during_a_held_import_is_delivered_once_the_import_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any,
) -> None:
    """As ``import torch`` is while a command runs: its C++ start-up must not see the interrupt, also
    with other threads running (the interpreter may take the signal on any of them)."""
    import sys
    import threading

    idle = threading.Event()
    bystander = threading.Thread(target=idle.wait, daemon=True)
    bystander.start()

    package = tmp_path / "netai_held_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(_SLOW_PACKAGE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(interrupts, "HELD_IMPORTS", frozenset({"netai_held_pkg"}))
    monkeypatch.delitem(sys.modules, "netai_held_pkg", raising=False)
    seen: list[str] = []

    def subcommand(_args: argparse.Namespace) -> int:
        try:
            import netai_held_pkg  # type: ignore[import-not-found]  # noqa: F401
        except KeyboardInterrupt:
            seen.append((package / "ran").read_text())
            raise
        return 0

    monkeypatch.setattr(cli, "build_parser", _parser_running(subcommand))
    try:
        assert cli.main([]) == 130
    finally:
        idle.set()
    assert seen == ["to the end"]  # the interrupt was raised by the import statement, after its body ran
    assert not any(isinstance(f, interrupts._HoldDuringImport) for f in sys.meta_path)


def test_a_held_import_keeps_its_own_loader(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    import sys

    (tmp_path / "netai_held_plain.py").write_text("VALUE = 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(interrupts, "HELD_IMPORTS", frozenset({"netai_held_plain"}))
    monkeypatch.delitem(sys.modules, "netai_held_plain", raising=False)
    previous = interrupts.install()
    try:
        import netai_held_plain  # type: ignore[import-not-found]
    finally:
        interrupts.uninstall(previous)
    assert netai_held_plain.VALUE == 7
    assert type(netai_held_plain.__loader__).__name__ == "SourceFileLoader"
    assert netai_held_plain.__spec__.loader is netai_held_plain.__loader__


#: Put first on a ``python -m orchestrator.cli`` process's path (its ``sitecustomize``): when the
#: command loads its first subcommand module, Ctrl-C arrives, inside code run by ``exec`` of a string
#: (as a dataclass's methods are made) or in plain code.
_CTRL_C_WHILE_LOADING = '''
import importlib.abc, os, signal, sys

class _CtrlCOnLoad(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "orchestrator.cli.topo":
            sys.meta_path.remove(self)
            if os.environ["NETAI_TEST_WHERE"] == "exec":
                exec("os.kill(os.getpid(), signal.SIGINT)\\nfor _ in range(10000): pass")
            else:
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10000): pass
        return None

sys.meta_path.insert(0, _CtrlCOnLoad())
'''


@pytest.mark.parametrize("where", ["exec", "plain"])
def test_ctrl_c_while_the_subcommands_load_exits_130(tmp_path: Any, where: str) -> None:
    """The command's first phase: its modules loading, before anything is started. CPython marks an
    interrupt that leaves a string's ``exec`` as unhandled even where it is caught, and a ``python
    -m`` process so marked ends killed by SIGINT (status -2, seen 5 times in 60 sweeps of the start-up)."""
    import subprocess
    import sys
    from pathlib import Path

    (tmp_path / "sitecustomize.py").write_text(_CTRL_C_WHILE_LOADING)
    root = Path(__file__).resolve().parents[2]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(root)]), NETAI_TEST_WHERE=where)
    proc = subprocess.run([sys.executable, "-m", "orchestrator.cli", "topo", "show", "triangle"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().splitlines() == ["netai: interrupted"]  # no traceback
    assert proc.stdout == ""  # the subcommand never ran
