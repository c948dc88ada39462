"""The guest driver's pure parts: where the checks run, the command, reading the console, a run recorded
by another process and adopted (no root, no guest)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.guest import driver


def test_results_and_the_accelerator_are_read_from_marked_lines_even_after_console_noise() -> None:
    output = "\n".join([
        "[guest-build] guest 0123 is up to date",
        "NETAI-GUEST-ACCEL tcg",
        "*** check rtt",
        '[   12.5] virtio: noise NETAI-GUEST-RESULT {"check": "rtt", "paths": [1, 2]}',
        'NETAI-GUEST-RESULT {"check": "reservation", "task_mbps": 9.1',
        "NETAI-GUEST-EXIT 0",
    ])

    accel, results, bad = driver.parse(output)

    assert accel == "tcg"
    assert results == {"rtt": {"check": "rtt", "paths": [1, 2]}}
    assert bad == ['NETAI-GUEST-RESULT {"check": "reservation", "task_mbps": 9.1']


def test_the_choice_can_be_forced_and_a_bad_choice_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "host_has_stock_paths", lambda: True)
    monkeypatch.setenv(driver.ENV_WHERE, "guest")
    assert driver.choose_where() == "guest"
    monkeypatch.setenv(driver.ENV_WHERE, "auto")
    assert driver.choose_where() == "host"
    monkeypatch.setenv(driver.ENV_WHERE, "vm")
    with pytest.raises(ValueError, match="auto, host or guest"):
        driver.choose_where()


def test_the_host_runs_the_checks_under_the_mininet_lock_and_the_guest_through_run_sh() -> None:
    host = driver.command("host", ["rtt"])
    guest = driver.command("guest", [])

    assert host[:2] == ["flock", driver.MININET_LOCK] and host[-3:] == ["-m", "tests.guest.checks", "rtt"]
    assert guest[:5] == ["nice", "-n", str(driver.GUEST_NICE), "bash", str(driver.RUN_SCRIPT)]
    assert driver.GUEST_NICE < 0, "the guest's QEMU ahead of the unit tests it overlaps"
    assert guest[guest.index("--") + 1:] == ["/opt/venv/bin/python", "-m", "tests.guest.checks"]


def _fake_checks(monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    monkeypatch.setenv(driver.ENV_WHERE, "guest")
    monkeypatch.setattr(driver, "command", lambda where, checks: [sys.executable, "-c", script])


def test_an_interrupt_while_the_checks_run_ends_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: checks that would run for a minute, and Ctrl-C while the suite waits for them
    _fake_checks(monkeypatch, "import time; time.sleep(60)")
    started: list[driver.PendingChecks] = []
    monkeypatch.setattr(driver, "start_checks", lambda *a: started.append(driver.PendingChecks(*a)) or started[-1])

    def interrupted(self: driver.PendingChecks) -> driver.ChecksRun:
        raise KeyboardInterrupt

    monkeypatch.setattr(driver.PendingChecks, "wait", interrupted)

    # Execute
    with pytest.raises(KeyboardInterrupt):
        driver.run_checks()

    # Assert: their process group was ended, not left to run out its time
    assert started[0].proc.wait(timeout=10) == -signal.SIGTERM


def test_a_recorded_run_is_adopted_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_checks(monkeypatch, "print('NETAI-GUEST-ACCEL tcg'); print('NETAI-GUEST-RESULT {\"check\": \"rtt\"}')")

    assert driver.record(tmp_path) == 0
    (tmp_path / "pid").write_text(str(os.getpid()))
    run = driver.RecordedChecks(tmp_path).wait()

    assert (run.where, run.accel, run.status) == ("guest", "tcg", 0)
    assert run.results == {"rtt": {"check": "rtt"}}
    assert not (tmp_path / (driver.RESULT_FILE + ".tmp")).exists()


def test_a_recorder_that_ended_without_a_result_fails_the_run(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    (tmp_path / "pid").write_text(gone)

    run = driver.RecordedChecks(tmp_path).wait()

    assert run.status == -1 and "ended without a result" in run.output and run.results == {}


def test_the_suite_adopts_the_recorded_checks_when_told_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(driver, "_EARLY", None)
    monkeypatch.setenv(driver.ENV_RECORD, str(tmp_path))
    monkeypatch.setattr(driver, "start_checks", lambda *a: pytest.fail("started checks of its own"))

    driver.start_early()

    assert isinstance(driver._EARLY, driver.RecordedChecks) and driver._EARLY.folder == tmp_path


def test_checks_on_the_host_never_start_before_the_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(driver.ENV_WHERE, "host")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("ran the guest's build"))

    assert driver.can_start_early() is False
