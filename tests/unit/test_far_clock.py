"""A far site server's clock mapped onto this machine's, and its events brought back over the control
protocol (`orchestrator.runtime.far_clock`), against a real `SiteServer` answering in this process
with the tests' clock skew (`workers.events`, ``NETAI_TEST_CLOCK_SKEW_S``)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

import workers.events as events
from orchestrator.runtime.far_clock import EventMirror, mapped_line, measure_offset
from workers.config import AgentConfig
from workers.site_server import SiteServer

SKEW_S = 7.25


def _server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> SiteServer:
    monkeypatch.setattr(events, "_SKEW_S", SKEW_S)
    root = tmp_path / "far"
    (root / "tasks" / "t1").mkdir(parents=True)
    return SiteServer(site="A", address="127.0.0.2", log_root=root, cache_dir=tmp_path / "cache")


def _ok(reply: dict[str, Any]) -> dict[str, Any]:
    assert reply["ok"], reply
    return reply


def test_the_offset_is_the_skew_within_its_uncertainty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(tmp_path, monkeypatch)
    offset, uncertainty = measure_offset(lambda: _ok(server.handle({"op": "hello"})))
    assert abs(offset - SKEW_S) <= uncertainty + 1e-3
    assert uncertainty < 0.05


def test_events_come_back_whole_lines_on_this_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(tmp_path, monkeypatch)
    far_file = server.log_root / "tasks" / "t1" / "A.events.jsonl"
    stream = io.StringIO()
    log = events.EventLog(cast(AgentConfig, SimpleNamespace(task=1, site="A")), stream)  # what EventLog reads
    here_before = time.monotonic()
    log.emit("round_start", round=1)
    log.emit("round_complete", round=1, latency_s=0.5)
    here_after = time.monotonic()
    far_file.write_text(stream.getvalue() + '{"t": 1.0, "event": "half')  # a line still being written

    mirror = EventMirror(lambda site, rel, off: _ok(server.handle({"op": "read", "path": rel, "offset": off})),
                         lambda site: _ok(server.handle({"op": "hello"})))
    mirror.measure("A")
    local = tmp_path / "here" / "tasks" / "t1" / "A.events.jsonl"
    mirror.add("A", "tasks/t1/A.events.jsonl", local)
    mirror.sync(["A"])

    rows = [json.loads(x) for x in local.read_text().splitlines()]
    assert [r["event"] for r in rows] == ["round_start", "round_complete"]  # not the half-written line
    for r in rows:  # on this machine's clock: within the emit calls, not SKEW_S later
        assert here_before - 0.05 <= r["t"] <= here_after + 0.05, (r["t"], here_before, here_after)
    far_file.write_text(far_file.read_text() + '"}\n')  # the line completed: it comes on the next sync
    mirror.sync(["A"])
    assert len(local.read_text().splitlines()) == 3


def test_read_refuses_paths_outside_the_log_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server = _server(tmp_path, monkeypatch)
    for path in ("../x.events.jsonl", "/etc/passwd", "tasks/t1/secret.txt"):
        reply = server.handle({"op": "read", "path": path, "offset": 0})
        assert not reply["ok"], (path, reply)
    assert not server.handle({"op": "read", "path": "tasks/t1/A.events.jsonl", "offset": -1})["ok"]


def test_a_line_without_a_time_is_kept() -> None:
    assert mapped_line("not json", 3.0) == "not json"
    assert json.loads(mapped_line('{"t": 10.0, "event": "x"}', 3.0))["t"] == 7.0
