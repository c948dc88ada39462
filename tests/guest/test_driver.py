"""The guest driver's pure parts: where the checks run, the command, reading the console (no root)."""

from __future__ import annotations

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
