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
