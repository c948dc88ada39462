"""Background clients write in pieces of `WRITE_S` of their rate: a slow flow (a time-dilated run's)
is paced smoothly instead of one 128 KB burst every few seconds."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from orchestrator.emulation.background import (
    MAX_WRITE_BYTES,
    MIN_WRITE_BYTES,
    PACING_HEADROOM,
    WRITE_S,
    BackgroundConfig,
    BackgroundFlow,
    BackgroundTraffic,
    write_bytes,
)


@pytest.mark.parametrize(("rate_mbps", "expected"), [
    (0.05, MIN_WRITE_BYTES),            # 62 bytes in 10 ms: at least one segment
    (0.5, 1448),                         # 625 bytes in 10 ms: still one segment
    (4.0, 5000),                         # a dilated flow: 10 ms of it
    (30.0, 37500),
    (100.0, 125000),
    (1000.0, MAX_WRITE_BYTES),           # iperf3's own default at most
])
def test_a_write_is_ten_milliseconds_of_the_flow_within_bounds(rate_mbps: float, expected: int) -> None:
    assert WRITE_S == 0.01
    assert write_bytes(rate_mbps) == expected


class _Host:
    def __init__(self, name: str, ip: str) -> None:
        self.name, self.pid, self._ip = name, 1, ip

    def IP(self) -> str:  # Mininet's name
        return self._ip


def test_the_client_gets_its_write_length(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hosts = {"A": _Host("h1", "10.0.0.1"), "B": _Host("h2", "10.0.0.2")}
    flow = BackgroundFlow("A", "B", 0.4, 5201, ("A", "B"))
    traffic = BackgroundTraffic(hosts.__getitem__, [flow], BackgroundConfig(), seed=1, log_dir=tmp_path)
    started: list[list[str]] = []

    def popen(site: str, cmd: list[str], *, stdout: Any, log_name: str) -> Any:
        started.append(cmd)
        return subprocess.Popen(["true"])

    monkeypatch.setattr(traffic, "_popen", popen)
    traffic._client(flow, 10.0).wait()

    cmd = started[0]
    assert cmd[:2] == ["iperf3", "-c"] and cmd[cmd.index("-b") + 1] == "0.400M"
    assert cmd[cmd.index("-l") + 1] == str(write_bytes(0.4)) == "1448"
    # its socket paced at its rate and 2 % (TCP paces the payload): no catch-up at the link's rate
    assert cmd[cmd.index("--fq-rate") + 1] == "0.408M" == f"{0.4 * PACING_HEADROOM:.3f}M"
