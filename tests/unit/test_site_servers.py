"""Site servers: the control protocol's checks, safe file names, and (slow) real servers on loopback
hosting several tasks at once, a shipped model file, awkward site names, and a server killed mid-run."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.runtime.backends import LoopbackBackend
from orchestrator.runtime.compute import ComputeManager, check_model
from orchestrator.runtime.summaries import read_events
from orchestrator.runtime.task_runner import FLOptions, TaskExecution, run_task
from orchestrator.scheduling.schedule import Schedule
from tests.site_memory import hand_schedule
from workers.config import AgentConfig, Peer, file_stem
from workers.control import (
    MAX_MESSAGE_BYTES,
    ProtocolError,
    module_digest,
    recv_message,
    send_message,
    shipped_spec,
)
from workers.site_server import SiteServer, _MemoryReading, _read_memory, address_refusal

ROOT = Path(__file__).resolve().parents[2]

AWKWARD = ("Kansas City", "São Paulo", "$(touch pwned);", "-west")


# -- the protocol's checks (no sockets, no roles started) -------------------------------------------------
def _server(tmp_path: Path) -> SiteServer:
    (tmp_path / "logs" / "t1").mkdir(parents=True)
    (tmp_path / "cache").mkdir()
    return SiteServer(site="A", address="127.0.0.9", log_root=tmp_path / "logs", cache_dir=tmp_path / "cache")


def _cfg(**over: Any) -> dict[str, Any]:
    cfg = AgentConfig(task=1, site="A", host="127.0.0.9", broadcast_port=20000, upload_port=20001, rounds=1,
                      broadcast_parent=Peer(site="G", host="127.0.0.8"), upload_parent=Peer(site="G", host="127.0.0.8"),
                      part_index=0)
    return cfg.to_dict() | over


@pytest.mark.parametrize(("msg", "why"), [
    ({"op": "launch"}, "unknown op"),
    ({"op": "status", "extra": 1}, "unknown fields"),
    ({"op": "stop"}, "missing 'task'"),
    ({"op": "stop", "task": "1"}, "wrong type"),
    ({"op": "stop", "task": True}, "wrong type"),
    ({"op": "put_module", "digest": "0" * 64, "source": "x = 1"}, "does not match"),
    ({"op": "put_module", "digest": "ABC", "source": "x = 1"}, "64 lowercase hex"),
    ({"op": "start", "config": _cfg(host="127.0.0.10"), "events": "t1/A.events.jsonl"}, "binds to this site's address"),
    ({"op": "start", "config": _cfg(host="0.0.0.0"), "events": "t1/A.events.jsonl"}, "wildcard"),
    ({"op": "start", "config": _cfg(site="B"), "events": "t1/A.events.jsonl"}, "hosts site 'A'"),
    ({"op": "start", "config": _cfg(), "events": "../A.events.jsonl"}, "without '..'"),
    ({"op": "start", "config": _cfg(), "events": "/etc/A.events.jsonl"}, "relative"),
    ({"op": "start", "config": _cfg(), "events": "nodir/A.events.jsonl"}, "existing directory"),
    ({"op": "start", "config": _cfg(model="/tmp/evil.py:make"), "events": "t1/A.events.jsonl"}, "put_module"),
    ({"op": "start", "config": _cfg(model=shipped_spec("a" * 64, "make")), "events": "t1/A.events.jsonl"},
     "was not sent"),
    ({"op": "start", "config": _cfg(model="@sha256:zz:make"), "events": "t1/A.events.jsonl"}, "bad shipped"),
    ({"op": "start", "config": _cfg(is_global=True, expects_global=False, broadcast_parent=None, upload_parent=None,
                                    upload_children=[{"site": "B", "host": "127.0.0.7"}], part_index=None,
                                    selection={"policy": "/tmp/evil.py:P"}, selection_measures=[]),
      "events": "t1/A.events.jsonl"}, "a selection policy file reaches a site server by put_module"),
    ({"op": "start", "config": _cfg(pickle=b"x".hex()), "events": "t1/A.events.jsonl"}, "unknown agent config keys"),
    ({"op": "forget", "task": 7}, "no role of task 7"),
    ({"op": "start", "config": _cfg(), "events": "t1"}, "must name a *.events.jsonl file"),
    ({"op": "start", "config": _cfg(), "events": "t1/A.out.txt"}, "must name a *.events.jsonl file"),
    ({"op": "start", "config": _cfg(rounds="3"), "events": "t1/A.events.jsonl"}, "rounds must be an integer"),
])
def test_server_refuses_bad_requests_and_starts_nothing(tmp_path: Path, msg: dict[str, Any], why: str) -> None:
    server = _server(tmp_path)

    reply = server.handle(msg)

    assert reply["ok"] is False and why in reply["error"], reply
    assert server.roles == {} and server.modules == set()
    assert not [t for t in threading.enumerate() if t.name.startswith("task")]


@pytest.mark.parametrize(("address", "refused"), [
    ("0.0.0.0", True), ("::", True), ("", True), ("127.0.0.1", False), ("10.0.1.5", False), ("fd00::5", False),
])
def test_a_wildcard_server_address_is_refused_and_a_sites_own_accepted(address: str, refused: bool) -> None:
    why = address_refusal(address)

    assert (why is not None) == refused
    assert why is None or "not a wildcard" in why


def test_a_server_given_a_wildcard_exits_2_before_it_loads_torch(tmp_path: Path) -> None:
    # Execute in a fresh interpreter: `main` (which warms torch up for an address it accepts) and
    # `serve_warm` (what a server forked from the fork server runs), each given a wildcard.
    code = f"""
import contextlib, io, json, sys
from workers.site_server import main, serve_warm
out = []
for entry, address in ((main, "0.0.0.0"), (main, "::"), (serve_warm, "0.0.0.0"), (serve_warm, "")):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = entry(["--site=A", "--address=" + address, "--socket={tmp_path}/s.sock", "--log-root={tmp_path}"])
    out.append([status, err.getvalue().strip()])
print(json.dumps({{"out": out, "torch": "torch" in sys.modules}}))
"""
    res = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         check=False)

    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["out"] == [[2, "site server: --address must be the site's own address, not a wildcard"]] * 4
    assert got["torch"] is False
    assert not (tmp_path / "s.sock").exists()


def test_put_module_stores_by_content_only(tmp_path: Path) -> None:
    server = _server(tmp_path)
    source = "def make(**kw):\n    raise RuntimeError('never called here')\n"
    digest = module_digest(source)

    assert server.handle({"op": "put_module", "digest": digest, "source": source}) == {"ok": True}

    assert (tmp_path / "cache" / f"{digest}.py").read_text() == source
    assert server._model_spec(shipped_spec(digest, "make")) == f"{tmp_path / 'cache' / digest}.py:make"


def test_status_reads_memory_at_most_once_a_second() -> None:
    """Reading PSS walks the page tables; the runner's 50 ms polls must not do it each time."""
    now = [100.0]
    reads: list[float] = []

    def read() -> tuple[int, int]:
        reads.append(now[0])
        return (len(reads) * 10, len(reads))

    memory = _MemoryReading(clock=lambda: now[0], read=read)
    seen = []
    for _ in range(20):  # 1.25 s of polls 1/16 s apart (exact in binary)
        seen.append(memory())
        now[0] += 0.0625

    assert reads == [100.0, 101.0]
    assert seen[0] == (10, 1) and seen[15] == (10, 1) and seen[16] == (20, 2) and seen[19] == (20, 2)
    rss, pss = _read_memory()  # the real reading, of this process
    assert rss > 0 and 0 < pss <= rss


def test_control_framing_rejects_oversized_and_non_objects() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.sendall(struct.pack(">I", 5) + b"[1,2]")
        with pytest.raises(ProtocolError, match="JSON object"):
            recv_message(b)
        send_message(a, {"op": "hello"})
        assert recv_message(b) == {"op": "hello"}
        body = b'{"op":"stop","task":NaN}'
        a.sendall(struct.pack(">I", len(body)) + body)
        with pytest.raises(ProtocolError, match="NaN is not JSON"):
            recv_message(b)
        a.sendall(struct.pack(">I", MAX_MESSAGE_BYTES + 1))
        with pytest.raises(ConnectionError, match="exceeds"):
            recv_message(b)
        a.close()
        assert recv_message(b) is None


def test_file_stems_are_safe_and_distinct() -> None:
    names = [*AWKWARD, "Kansas_City", "A", "../etc", "x/y", "", "ü" * 80]
    stems = [file_stem(n) for n in names]

    assert len(set(stems)) == len(names)
    for stem in stems:
        assert stem and "/" not in stem and not stem.startswith((".", "-")) and stem.isascii()
        assert all(c.isalnum() or c in "_.-" for c in stem)
    assert file_stem("A") == "A"


def test_a_model_that_raises_is_one_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad_model.py"
    bad.write_text("def make(**kw):\n    raise ValueError('no such layer')\n")

    with pytest.raises(ConfigError, match="cannot be built: ValueError: no such layer"):
        check_model(f"{bad}:make", {})
    with pytest.raises(ConfigError, match="unknown model"):
        check_model("no-such-model", {})


# -- real servers on loopback ----------------------------------------------------------------------------
SITES = ("G", "A", "B", *AWKWARD)


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[ComputeManager]:
    with ComputeManager(LoopbackBackend(SITES, log_root=tmp_path / "root"), SITES) as cm:
        yield cm


def _sched(task_id: int, g: str, locals_: tuple[str, ...], relay: str | None = None) -> Schedule:
    parent = {loc: (relay or g) for loc in locals_}
    if relay is not None and relay not in locals_:
        parent[relay] = g
    return hand_schedule(task_id, g, locals_, parent)


@pytest.mark.slow
def test_tasks_share_servers_with_awkward_names_and_a_shipped_model(servers: ComputeManager, tmp_path: Path) -> None:
    user = tmp_path / "elsewhere" / "my model.py"
    user.parent.mkdir()
    user.write_text("from torch import nn\n\ndef make(*, input_shape, num_classes, width=16):\n"
                    "    return nn.Sequential(nn.Flatten(), nn.Linear(64, width), nn.ReLU(), nn.Linear(width, num_classes))\n")
    pids = {s: srv.pid for s, srv in servers.servers.items()}
    one = _sched(1, "Kansas City", ("São Paulo", "$(touch pwned);", "A"), relay="-west")
    two = _sched(2, "B", ("Kansas City", "G"))
    runs = [TaskExecution(one, manager=servers, options=FLOptions(rounds=2, model=f"{user}:make",
                                                                  model_args={"width": 24}),
                          log_dir=servers.task_dir("one")),
            TaskExecution(two, manager=servers, options=FLOptions(rounds=3), log_dir=servers.task_dir("two"))]

    for run in runs:
        run.start()
    # both tasks' roles are on the servers at once ("Kansas City" holds one of each)
    roles = servers.poll()["Kansas City"]["roles"]
    assert set(roles) == {"1", "2"}
    deadline = time.monotonic() + 120
    while not all(run.check(servers.poll()) for run in runs):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    results = [run.result() for run in runs]
    for run in runs:
        run.stop()

    assert [len(r.rounds) for r in results] == [2, 3]
    assert results[0].model_bytes == (64 * 24 + 24 + 24 * 10 + 10) * 4  # the user's model, with its argument
    assert all(r.stragglers == () for res in results for r in res.rounds)
    assert not (Path.cwd() / "pwned").exists() and not (tmp_path / "pwned").exists()
    files = sorted(p.name for p in runs[0].log_dir.iterdir())
    assert files == sorted(f"{file_stem(s)}.events.jsonl" for s in one.overlay_nodes)
    sites = {e["site"] for p in runs[0].log_dir.iterdir() for e in read_events(p)}
    assert sites == set(one.overlay_nodes)
    # no process per task: the same servers, and every role forgotten after the tasks
    assert {s: srv.pid for s, srv in servers.servers.items()} == pids
    assert all(st["roles"] == {} for st in servers.poll().values())


@pytest.mark.slow
def test_a_killed_server_fails_its_task_and_the_rest_closes_clean(tmp_path: Path) -> None:
    cm = ComputeManager(LoopbackBackend(SITES, log_root=tmp_path / "root"), SITES)
    with cm:
        pids = [srv.pid for srv in cm.servers.values()]
        # each server keeps its model cache in the run's control directory, which goes at teardown
        # even for a server killed outright (no cache left under the system's temporary directory)
        assert len(list(cm.backend.ctl_dir.glob("models-*"))) == len(SITES)
        sched = _sched(3, "G", ("A", "B"))
        victim = cm.servers["B"].pid
        killer = threading.Timer(1.0, os.kill, (victim, signal.SIGKILL))
        killer.start()
        try:
            with pytest.raises(RuntimeError, match="B: its site server is gone"):
                run_task(sched, manager=cm, options=FLOptions(rounds=400), log_dir=cm.task_dir("killed"))
        finally:
            killer.cancel()
        assert "B" in cm.lost and "-9" in cm.lost["B"]
        # the others still answer and hold no role of the failed task
        assert set(cm.poll()) == set(SITES) - {"B"}
        assert all(st["roles"] == {} for st in cm.poll().values())
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
    assert not cm.backend.ctl_dir.exists()


@pytest.mark.slow
def test_a_stopped_server_is_lost_at_the_request_timeout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: two real servers whose control requests time out after 1 s (30 s in a run); one stopped
    from orchestrator.runtime import compute

    monkeypatch.setattr(compute, "REQUEST_TIMEOUT_S", 1.0)
    with ComputeManager(LoopbackBackend(("G", "A"), log_root=tmp_path / "root"), ("G", "A")) as cm:
        victim = cm.servers["A"].pid
        os.kill(victim, signal.SIGSTOP)
        try:
            # Execute: the run's poll loop, bounded
            deadline = time.monotonic() + 30
            while "A" not in cm.lost and time.monotonic() < deadline:
                cm.poll()
                time.sleep(0.05)
        finally:
            os.kill(victim, signal.SIGCONT)

        # Assert: lost, said to be stopped; the other still answers
        assert "A" in cm.lost and f"its process {victim} is stopped (SIGSTOP" in cm.lost["A"]
        assert set(cm.poll()) == {"G"}
