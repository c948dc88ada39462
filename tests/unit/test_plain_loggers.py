"""The project's loggers stay plain `logging.Logger`s, whenever they are created: Mininet's log
module, on import, would make later ones its own class (level above INFO, a handler of its own)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_a_logger_made_after_mininet_is_imported_is_plain_and_logs_info() -> None:
    pytest.importorskip("mininet.log")
    # a fresh interpreter: the package imported, then Mininet's node module, then a new logger
    code = ("import logging, orchestrator, mininet.node, mininet.log\n"
            "log = logging.getLogger('netai.later')\n"
            "print(type(log).__name__, log.getEffectiveLevel(), len(log.handlers),"
            " type(logging.getLogger('mininet')).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["Logger", str(logging.WARNING), "0", "MininetLogger"]


def test_without_the_package_first_mininet_would_have_taken_it() -> None:
    # the check above can fail: the same lines without importing the package give Mininet's class
    pytest.importorskip("mininet.log")
    code = ("import logging, mininet.log\n"
            "print(type(logging.getLogger('netai.later')).__name__)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["MininetLogger"]
