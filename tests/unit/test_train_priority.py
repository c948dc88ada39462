"""Each thread kind runs at the priority docs/data-plane.md gives it, read back from /proc:
training under SCHED_IDLE, network-path threads (the transport's sender, acceptor and readers, an
agent's round loop) raised to nice -10 where the process may raise them; a refused priority is a
logged note, never a failure."""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime.backends import LoopbackBackend
from orchestrator.runtime.compute import ComputeManager
from orchestrator.runtime.task_runner import FLOptions, read_events, run_task
from orchestrator.scheduling.schedule import Schedule
from workers import priority
from workers.learning import run_at_lower_priority
from workers.transport import Listener, Outbound

RAISE_ALLOWED = os.geteuid() == 0


def _kernel_keeps_slices() -> bool:
    """Whether this kernel keeps a fair thread's own time slice (Linux 6.12 on), tried on a thread of
    its own."""
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(priority.set_slice(priority.TRANSFER_SLICE_NS)))
    t.start()
    t.join()
    return got == [priority.TRANSFER_SLICE_NS]


KEEPS_SLICE = _kernel_keeps_slices()
#: What `enter_transfer` adds to what it applied: the network path's short slice, where kept.
SLICE = ", slice 0.1 ms" if KEEPS_SLICE else ""


def _mine() -> tuple[str, int]:
    return priority.thread_priority(threading.get_native_id())


@pytest.fixture(autouse=True)
def _fresh_notes() -> Iterator[None]:
    priority._noted.clear()
    yield
    priority._noted.clear()
    priority.use(priority.DEFAULT_SCHEME)


def test_training_runs_under_sched_idle_on_its_own_thread_and_the_caller_keeps_its_priority() -> None:
    caller = _mine()

    tid, seen = run_at_lower_priority(lambda: (threading.get_native_id(), _mine()))

    assert tid != threading.get_native_id()
    assert seen[0] == "SCHED_IDLE"
    assert _mine() == caller, "only the training thread was lowered"


def test_the_result_and_the_exception_come_back_to_the_caller() -> None:
    assert run_at_lower_priority(lambda: 42) == 42

    def fails() -> int:
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        run_at_lower_priority(fails)


def test_refused_sched_idle_falls_back_to_nice_10_with_one_note(monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    def refuse(*_a: Any) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with caplog.at_level(logging.WARNING, logger="workers.priority"):
        first = run_at_lower_priority(_mine)
        second = run_at_lower_priority(_mine)

    assert first == second == ("SCHED_OTHER", priority.TRAIN_NICE_FALLBACK)
    assert [r.getMessage() for r in caplog.records if "SCHED_IDLE refused" in r.getMessage()] != []
    assert len(caplog.records) == 1, "noted once per process, not per pass"


def test_refused_raise_leaves_a_transfer_thread_as_it_was_with_a_note(monkeypatch: pytest.MonkeyPatch,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    def refuse(*_a: Any) -> None:
        raise PermissionError(13, "Permission denied")

    got: list[Any] = []

    def body() -> None:
        before = _mine()
        got.extend([before, priority.enter_transfer(), _mine()])

    monkeypatch.setattr(os, "setpriority", refuse)
    with caplog.at_level(logging.WARNING, logger="workers.priority"):
        t = threading.Thread(target=body)
        t.start()
        t.join()

    before, applied, after = got
    assert applied == "unchanged" + SLICE and after == before, "refused nice, the slice still asked for"
    assert any("CAP_SYS_NICE" in r.getMessage() for r in caplog.records)


def _by_name(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t.native_id is not None]


def test_the_transport_threads_run_raised() -> None:
    """A listener and a connection to it on loopback: the acceptor, the reader and the sender
    thread each read back SCHED_OTHER at nice -10 (as root), or unchanged without the privilege."""
    expected_nice = priority.TRANSFER_NICE if RAISE_ALLOWED else os.getpriority(os.PRIO_PROCESS, 0)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    events: queue.Queue[str] = queue.Queue()
    listener = Listener(host="127.0.0.1", port=port, task=3, kind="broadcast", expected={"P": "127.0.0.1"},
                        max_payload_bytes=1024, on_frame=lambda *_: None, on_lost=lambda *_: None,
                        on_accept=lambda peer: events.put(f"accepted {peer}"), on_reject=lambda *_: None)
    out = Outbound(peer="Q", peer_host="127.0.0.1", port=port, local_host="127.0.0.1", task=3, site="P",
                   connect_timeout_s=5.0, on_lost=lambda *_: events.put("lost"),
                   on_connect=lambda *_: None)
    listener.start()
    out.start()
    try:
        assert events.get(timeout=5) == "accepted P"
        seen = {prefix: [priority.thread_priority(t.native_id) for t in _by_name(prefix) if t.native_id]
                for prefix in ("send-Q", "accept-broadcast", "recv-broadcast")}
    finally:
        out.flush_and_close(2.0)
        listener.close()

    for prefix, prios in seen.items():
        assert prios, f"no {prefix} thread"
        assert prios == [("SCHED_OTHER", expected_nice)] * len(prios), prefix


def test_a_transfer_thread_made_by_a_training_thread_leaves_sched_idle() -> None:
    got: list[Any] = []

    def made_by_training() -> None:
        t = threading.Thread(target=lambda: got.extend([_mine(), priority.enter_transfer(), _mine()]))
        t.start()
        t.join()

    run_at_lower_priority(made_by_training)

    inherited, applied, now = got
    assert inherited[0] == "SCHED_IDLE", "Linux: a new thread takes its creator's policy"
    if RAISE_ALLOWED:
        assert (applied, now) == ("nice -10" + SLICE, ("SCHED_OTHER", priority.TRANSFER_NICE))
    else:  # leaving SCHED_IDLE needs the privilege: noted, not fatal
        assert applied == "unchanged"


def test_an_unknown_scheme_is_refused_and_train_niced_is_nice_10() -> None:
    with pytest.raises(ValueError, match="unknown priority scheme"):
        priority.use("fast")

    priority.use("train-niced")
    assert run_at_lower_priority(_mine) == ("SCHED_OTHER", priority.TRAIN_NICE_FALLBACK)


@pytest.mark.slow
def test_site_servers_control_loops_and_round_loops_run_raised(tmp_path: Path) -> None:
    """Real site servers on loopback run a task G -> A -> L: every server's control thread reads back
    nice -10 from /proc, and every role's round loop says in its ``ready`` event that it runs raised."""
    sites = ("G", "A", "L")
    expected = (("nice -10" + SLICE, ("SCHED_OTHER", priority.TRANSFER_NICE)) if RAISE_ALLOWED
                else ("unchanged" + SLICE, None))
    sched = Schedule(task_id=5, scheduler="hand", global_site="G", local_sites=("A", "L"), demand_mbps=1.0,
                     broadcast_parent={"A": "G", "L": "A"}, upload_parent={"A": "G", "L": "A"})
    with ComputeManager(LoopbackBackend(sites, log_root=tmp_path / "root"), sites) as cm:
        control = {s: priority.thread_priority(srv.pid, srv.pid) for s, srv in cm.servers.items()}
        log_dir = cm.task_dir("prio")
        result = run_task(sched, manager=cm, options=FLOptions(rounds=1), log_dir=log_dir)

    ready = {e["site"]: e["priority"] for p in log_dir.iterdir() for e in read_events(p) if e["event"] == "ready"}
    assert len(result.rounds) == 1
    assert ready == dict.fromkeys(sites, expected[0])
    if expected[1] is not None:
        assert control == dict.fromkeys(sites, expected[1])


@pytest.mark.skipif(not KEEPS_SLICE, reason="this kernel keeps no time slice for fair threads (before Linux 6.12)")
def test_network_path_threads_ask_for_the_shortest_slice_and_training_goes_back_to_the_default() -> None:
    """Across cgroups (the docker backend's sites) a woken network-path thread preempts another
    site's training only with a shorter slice (docs/data-plane.md, "The network path before
    training"): the transfer thread reads back 0.1 ms, the training it starts the default, as does a
    nice +10 training."""
    got: list[Any] = []

    def transfer_thread() -> None:
        default = priority.thread_slice()
        got.extend([default, priority.enter_transfer(), priority.thread_slice()])
        got.append(run_at_lower_priority(priority.thread_slice))
        priority.use("train-niced")
        got.append(run_at_lower_priority(priority.thread_slice))

    t = threading.Thread(target=transfer_thread)
    t.start()
    t.join()

    default, applied, raised, idle_training, niced_training = got
    assert default > priority.TRANSFER_SLICE_NS, "the kernel's default slice is longer than the least"
    assert applied.endswith(", slice 0.1 ms") and raised == priority.TRANSFER_SLICE_NS
    assert idle_training == niced_training == default, "training does not keep its creator's short slice"


def test_a_slice_is_refused_below_zero_and_zero_restores_the_default() -> None:
    got: list[int] = []

    def body() -> None:
        default = priority.thread_slice()
        priority.set_slice(priority.TRANSFER_SLICE_NS)
        got.extend([default, priority.set_slice(0)])

    with pytest.raises(ValueError, match="negative"):
        priority.set_slice(-1)
    t = threading.Thread(target=body)
    t.start()
    t.join()

    default, restored = got
    assert restored == default
