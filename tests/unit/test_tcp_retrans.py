"""TCP bytes sent and retransmitted: the kernel's figures parsed (`workers.tcpinfo`), read from real
loopback connections and an `Outbound`, summed per task from the roles' events, stored, and shown
beside the carried bytes in the report and `netai validate` (the simulation: not modelled)."""

from __future__ import annotations

import re
import socket
import sqlite3
import struct
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from orchestrator.experiment.simulated import SimRecorder
from orchestrator.results import queries
from orchestrator.results.agreement import point_agreement
from orchestrator.results.agreement_report import point_lines, retrans_line
from orchestrator.results.db import ResultsDB
from orchestrator.results.fidelity import Verdict
from orchestrator.results.report import fidelity_section
from orchestrator.results.schema import SCHEMA
from orchestrator.results.summary import TaskSummary, retrans_share, run_summary
from orchestrator.runtime.summaries import tcp_bytes
from orchestrator.scheduling.tasks import Task
from workers.framing import Header, encode_frame
from workers.tcpinfo import (
    BYTES_RETRANS_OFFSET,
    BYTES_SENT_OFFSET,
    TOTAL_RETRANS_OFFSET,
    UNMEASURED,
    TcpBytes,
    parse_tcp_info,
    read_tcp_bytes,
    wait_acked,
)
from workers.transport import Listener, Outbound, sendmsg_all

#: ``sizeof(struct tcp_info)`` of the Linux 6.x headers.
STRUCT_LEN = 232


def tcp_info_bytes(length: int = STRUCT_LEN, *, sent: int = 0, retrans: int = 0, segments: int = 0) -> bytes:
    """A hand-built ``struct tcp_info`` of `length` bytes with the three figures at their offsets."""
    buf = bytearray(range(256))[:length] if length <= 256 else bytearray(length)  # no zeros to hide behind
    full = bytearray(max(length, STRUCT_LEN))
    full[:len(buf)] = buf
    struct.pack_into("=I", full, TOTAL_RETRANS_OFFSET, segments)
    struct.pack_into("=Q", full, BYTES_SENT_OFFSET, sent)
    struct.pack_into("=Q", full, BYTES_RETRANS_OFFSET, retrans)
    return bytes(full[:length])


# -- parsing ------------------------------------------------------------------------------------------
def test_the_figures_are_read_at_their_offsets_in_native_order() -> None:
    got = parse_tcp_info(tcp_info_bytes(sent=2**40 + 7, retrans=123_456, segments=99))
    assert got == TcpBytes(sent_bytes=2**40 + 7, retrans_bytes=123_456, retrans_segments=99)


@pytest.mark.parametrize(("length", "expected"), [
    (0, UNMEASURED),
    (100, UNMEASURED),  # a struct that ends before tcpi_total_retrans
    (104, TcpBytes(None, None, 5)),  # before Linux 4.19: no byte counters
    (207, TcpBytes(None, None, 5)),
    (208, TcpBytes(1000, None, 5)),
    (216, TcpBytes(1000, 40, 5)),
])
def test_a_figure_the_struct_is_too_short_for_is_not_measured(length: int, expected: TcpBytes) -> None:
    assert parse_tcp_info(tcp_info_bytes(length, sent=1000, retrans=40, segments=5)) == expected


def test_a_sum_with_an_unmeasured_connection_is_not_measured() -> None:
    a, b = TcpBytes(10, 1, 1), TcpBytes(20, 2, 3)
    assert a + b == TcpBytes(30, 3, 4)
    assert a + UNMEASURED == UNMEASURED


# -- real connections on loopback ----------------------------------------------------------------------
def _pair() -> tuple[socket.socket, socket.socket]:
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname(), timeout=10)
    conn, _ = server.accept()
    server.close()
    return client, conn


def _drain(conn: socket.socket, n: int) -> None:
    got = 0
    while got < n:
        chunk = conn.recv(1 << 16)
        assert chunk, "closed early"
        got += len(chunk)


def test_a_real_loopback_connection_counts_what_it_sent_and_retransmits_nothing() -> None:
    client, conn = _pair()
    try:
        payload = bytes(300_000)
        reader = threading.Thread(target=_drain, args=(conn, len(payload)))
        reader.start()
        client.sendall(payload)
        reader.join(timeout=30)
        assert wait_acked(client, 10.0)
        got = read_tcp_bytes(client)
    finally:
        client.close()
        conn.close()
    assert got.sent_bytes is not None and got.sent_bytes >= len(payload)
    assert got.retrans_bytes == 0 and got.retrans_segments == 0


def test_a_socket_without_tcp_info_is_not_measured() -> None:
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        assert read_tcp_bytes(udp) == UNMEASURED
    finally:
        udp.close()


def test_an_outbound_hands_over_its_totals_over_every_connection_when_it_closes() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    frames: list[int] = []
    listener = Listener(host="127.0.0.1", port=port, task=3, kind="upload", expected={"P": "127.0.0.1"},
                        max_payload_bytes=1 << 20, on_frame=lambda _p, _h, payload, _at: frames.append(len(payload)),
                        on_lost=lambda *_: None, on_accept=lambda _p: None, on_reject=lambda *_: None)
    reported: list[tuple[str, TcpBytes, int]] = []
    out = Outbound(peer="Q", peer_host="127.0.0.1", port=port, local_host="127.0.0.1", task=3, site="P",
                   connect_timeout_s=5.0, on_lost=lambda *_: None, on_connect=lambda *_: None,
                   on_tcp=lambda peer, tcp, n: reported.append((peer, tcp, n)))
    frame = encode_frame(Header("UPDATE", 3, 1, "P"), bytes(100_000))
    frame_len = sum(len(memoryview(b).cast("B")) for b in frame)
    listener.start()
    try:
        out._connect()  # a first connection, closed as a broken one is before its reconnect
        assert out.sock is not None
        sendmsg_all(out.sock, frame)
        assert wait_acked(out.sock, 10.0)
        out._close_socket()
        assert reported == []  # handed over once, at the end
        out.start()  # the sender thread connects again
        out.send(frame, round=1)
        assert out.flush_and_close(10.0)
    finally:
        listener.close()
    assert [(peer, n) for peer, _, n in reported] == [("Q", 2)]
    tcp = reported[0][1]
    assert tcp.sent_bytes is not None and tcp.sent_bytes >= 2 * frame_len  # each frame, after a HELLO
    assert tcp.retrans_bytes == 0


# -- a task's figures from its roles' events ---------------------------------------------------------------
def _tcp(connections: int, sent: int | None, retrans: int | None) -> dict[str, Any]:
    return {"event": "tcp", "t": 1.0, "connections": connections, "sent_bytes": sent, "retrans_bytes": retrans}


def test_a_tasks_tcp_bytes_sum_its_roles_connections() -> None:
    events = {"G": [{"event": "done", "t": 2.0}, _tcp(1, 5000, 50)],
              "A": [_tcp(2, 7000, 0), _tcp(1, 1000, 25)],
              "B": [_tcp(0, None, None)]}  # a connection never opened sent nothing
    assert tcp_bytes(events) == (13_000, 75)


def test_a_task_with_an_unmeasured_connection_or_none_at_all_is_not_measured() -> None:
    assert tcp_bytes({"G": [_tcp(1, 5000, 0)], "A": [_tcp(1, None, None)]}) == (None, None)
    assert tcp_bytes({"G": [{"event": "done", "t": 2.0}]}) == (None, None)  # agents that logged none


# -- stored, summarised, reported ---------------------------------------------------------------------
def _task(task_id: int) -> Task:
    return Task(id=task_id, global_site="a", local_sites=("b", "c"), model="mlp", rounds=1, demand_mbps=10.0,
                model_bytes=1000)


def _run(db: ResultsDB, engine: str = "emulation") -> int:
    run_id = db.start_run("t", {}, engine=engine)
    for tid in (1, 2, 3):
        db.record_task(run_id, "mst", _task(tid))
        db.record_round(run_id, "mst", tid, 1, latency_s=0.1, broadcast_s=0.03, train_s=0.04, upload_s=0.03,
                        accuracy=0.5, lower_bound_s=0.05)
        db.set_task_state(run_id, "mst", tid, "done")
    return run_id


def test_stored_tcp_bytes_give_each_task_and_point_its_retransmitted_share(tmp_path: Path) -> None:
    with ResultsDB(tmp_path / "results.db") as db:
        run_id = _run(db)
        db.set_tcp_bytes(run_id, "mst", 1, 100_000, 1_000)
        db.set_tcp_bytes(run_id, "mst", 2, 300_000, 5_000)
        db.set_tcp_bytes(run_id, "mst", 3, None, None)
        summary = run_summary(db, run_id)
    by = {t.task_id: t for t in summary.tasks}
    assert (by[1].sent_bytes, by[1].retrans_bytes, by[1].retrans_share) == (100_000, 1_000, pytest.approx(0.01))
    assert by[3].sent_bytes is None and by[3].retrans_share is None  # NULL, not 0
    (point,) = summary.points
    assert point.retrans_share == pytest.approx(6_000 / 400_000)  # the tasks that measured, summed


def test_a_database_from_before_the_tcp_columns_stays_readable(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    old = sqlite3.connect(path)
    old.executescript(SCHEMA.replace("    sent_bytes INTEGER,\n    retrans_bytes INTEGER,\n", ""))
    old.execute("INSERT INTO runs(name, config_json, status, started_at) VALUES ('old', '{}', 'completed', 0)")
    old.execute("INSERT INTO tasks(run_id, scheduler, task_id, n_locals, global_site, local_sites_json, model, "
                "rounds, demand_mbps, model_bytes, state) VALUES (1, 'mst', 1, 2, 'a', '[]', 'mlp', 1, 1, 1, 'done')")
    old.commit()
    old.close()
    ro = queries.connect_read_only(path)
    assert "sent_bytes" not in queries.columns(ro, "tasks")
    (row,) = queries.tasks_with_schedules(ro, 1)  # read-only: not migrated, the columns read as NULL
    ro.close()
    assert row["sent_bytes"] is None and row["retrans_bytes"] is None
    with ResultsDB(path) as db:  # the writer adds them; the old rows hold NULL (not measured)
        assert {"sent_bytes", "retrans_bytes"} <= queries.columns(db.conn, "tasks")
        assert run_summary(db, 1).tasks[0].sent_bytes is None


def test_a_database_from_before_runs_had_an_engine_gets_it_as_emulated(tmp_path: Path) -> None:
    # the same list of added columns (schema.ADDED_COLUMNS) adds the runs' engine
    path = tmp_path / "older.db"
    old = sqlite3.connect(path)
    # the runs table without its last column (the comment line above it and the comma before)
    old.executescript(re.sub(r",\n\s*--[^\n]*\n\s*engine TEXT NOT NULL DEFAULT 'emulation'", "", SCHEMA, count=1))
    old.execute("INSERT INTO runs(name, config_json, status, started_at) VALUES ('old', '{}', 'completed', 0)")
    old.commit()
    assert "engine" not in queries.columns(old, "runs")
    old.close()
    with ResultsDB(path) as db:
        assert db.conn.execute("SELECT engine FROM runs WHERE id = 1").fetchone()[0] == "emulation"


def test_the_simulation_records_no_tcp_bytes(tmp_path: Path) -> None:
    with ResultsDB(tmp_path / "results.db") as db:
        run_id = _run(db, engine="simulation")
        SimRecorder(db, run_id).tcp_bytes("mst", 1, 100, 0)  # whatever it is handed: it has no TCP
        summary = run_summary(db, run_id)
    assert all(t.sent_bytes is None and t.retrans_bytes is None for t in summary.tasks)
    assert summary.points[0].retrans_share is None


def _summary(task_id: int, sent: int | None, retrans: int | None, carried: int) -> TaskSummary:
    return TaskSummary(scheduler="mst", task_id=task_id, n_locals=8, state="done", reserved_mbps=1.0,
                       carried_bytes=carried, rounds=2, mean_latency_s=1.0, mean_ratio_to_bound=None,
                       final_accuracy=None, sent_bytes=sent, retrans_bytes=retrans)


def test_validate_shows_the_emulations_retransmitted_share_and_the_simulations_as_not_modelled() -> None:
    emu = [_summary(1, 1_000_000, 10_000, 5_000_000), _summary(2, 1_000_000, 30_000, 5_000_000)]
    sim = [_summary(1, None, None, 4_900_000), _summary(2, None, None, 4_900_000)]
    (point,) = point_agreement(emu, sim)
    assert point.emulated_retrans_share == pytest.approx(0.02)
    assert point.simulated_retrans_share is None
    assert point.carried_ratio == pytest.approx(0.98)
    header, row = point_lines([point])
    assert "emu TCP retrans" in header and "0.9800" in row and "2.000%" in row
    assert "2.000% to 2.000%" in retrans_line([point]) and "simulation: not modelled" in retrans_line([point])
    assert retrans_share([]) is None


def _verdict() -> Verdict:
    return Verdict(scheduler="mst", n_locals=2, hops=4, hop_median_s=0.01, chunk_median_s=0.009,
                   overhead_median_s=0.001, trained=2, overruns=0, overrun_median_s=None, compute_modelled=True,
                   reasons=())


@pytest.mark.parametrize(("engine", "cell"), [("emulation", "1.500%"), ("simulation", "not modelled")])
def test_the_reports_fidelity_section_gives_each_point_its_retransmitted_share(
        tmp_path: Path, engine: str, cell: str) -> None:
    with ResultsDB(tmp_path / "results.db") as db:
        run_id = _run(db, engine=engine)
        for tid in (1, 2):
            db.set_tcp_bytes(run_id, "mst", tid, 200_000, 3_000)
        summary = replace(run_summary(db, run_id), verdicts=(_verdict(),))
    lines = fidelity_section(summary)
    row = next(line for line in lines if line.startswith("| mst | 2 |"))
    assert "TCP retransmitted" in lines[3]
    assert f"| {cell} | - | faithful |" in row  # no rounds: no latency / bound


def test_a_frame_sent_with_drain_counts_as_sent_only_once_the_peer_acknowledged_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a peer that accepts, then holds back (its receive buffer small) until told; an
    # Outbound sends 1 MB as written-only, then a short frame with drain (no giving up meanwhile).
    import workers.transport as transport
    from workers.tcpinfo import unacked_bytes

    monkeypatch.setattr(transport, "DRAIN_STALL_S", 60.0)

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    go, got = threading.Event(), []

    def peer() -> None:
        conn, _ = server.accept()
        with conn:
            go.wait(30)
            while chunk := conn.recv(1 << 20):
                got.append(len(chunk))

    reader = threading.Thread(target=peer, daemon=True)
    reader.start()
    out = Outbound(peer="Q", peer_host="127.0.0.1", port=server.getsockname()[1], local_host="127.0.0.1",
                   task=3, site="P", connect_timeout_s=5.0, on_lost=lambda *_: None, on_connect=lambda *_: None)
    written, acked = threading.Event(), threading.Event()
    at_ack: list[int | None] = []

    def on_acked() -> None:
        assert out.sock is not None
        at_ack.append(unacked_bytes(out.sock))
        acked.set()

    try:
        out.start()
        out.send(encode_frame(Header("GLOBAL", 3, 1, "P"), bytes(1 << 20)), round=1, on_sent=written.set)
        out.send(encode_frame(Header("GLOBAL", 3, 1, "P"), b"x"), round=1, on_sent=on_acked, drain=True)

        # Assert: the big frame counted as sent once written, though the peer holds most of it back;
        # the drained one not while the peer holds back, and then with nothing left unacknowledged
        assert written.wait(10)
        assert out.sock is not None and (unacked_bytes(out.sock) or 0) > 0
        assert not acked.is_set()
        go.set()
        assert acked.wait(10)
        assert at_ack == [0]
    finally:
        go.set()
        out.flush_and_close(5.0)
        server.close()


def test_a_paced_frame_sent_with_drain_counts_as_sent_once_the_socket_sent_it_not_once_acknowledged(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: the same peer holding back; acknowledgements that never come (the count of
    # unacknowledged bytes faked to stay 1); a paced Outbound (100 Mbit/s) sends 256 KB, more than the
    # peer's window takes, written-only, then a short frame with drain, as a lane's copy ends
    import workers.transport as transport
    from workers.pacing import FRAME_OVERHEAD_BYTES, SLACK_S
    from workers.tcpinfo import unsent_bytes

    monkeypatch.setattr(transport, "DRAIN_STALL_S", 60.0)
    monkeypatch.setattr(transport, "unacked_bytes", lambda sock: 1)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    go = threading.Event()

    def peer() -> None:
        conn, _ = server.accept()
        with conn:
            go.wait(30)
            while conn.recv(1 << 20):
                pass

    threading.Thread(target=peer, daemon=True).start()
    out = Outbound(peer="Q", peer_host="127.0.0.1", port=server.getsockname()[1], local_host="127.0.0.1",
                   task=3, site="P", connect_timeout_s=5.0, on_lost=lambda *_: None, on_connect=lambda *_: None,
                   pace_mbps=100.0)
    sent, at_sent = threading.Event(), []
    big = encode_frame(Header("GLOBAL", 3, 1, "P"), bytes(256 * 1024))
    small = encode_frame(Header("GLOBAL", 3, 1, "P"), b"x")

    def on_sent() -> None:
        assert out.sock is not None
        at_sent.append((time.monotonic(), unsent_bytes(out.sock)))
        sent.set()

    try:
        out.start()
        t0 = time.monotonic()
        out.send(big, round=1, on_sent=None)
        out.send(small, round=1, on_sent=on_sent, drain=True)

        # Assert: not while the socket still holds what the peer's window kept back; then, the peer
        # reading, once the socket sent it all, though no acknowledgement ever counts; no earlier than
        # the link at 100 Mbit/s would have serialized both frames (their bytes, at least one header)
        assert not sent.wait(1.0)
        go.set()
        assert sent.wait(10)
        (t_sent, unsent), = at_sent
        wire = sum(memoryview(b).nbytes for b in (*big, *small)) + FRAME_OVERHEAD_BYTES
        assert unsent == 0 and t_sent - t0 >= wire * 8 / 100e6 - SLACK_S
    finally:
        go.set()
        out.flush_and_close(5.0)
        server.close()


def test_a_drain_gives_up_once_the_peer_acknowledges_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a peer that never reads, its receive buffer full after the first megabyte; a short stall
    import workers.transport as transport
    from workers.tcpinfo import unacked_bytes

    monkeypatch.setattr(transport, "DRAIN_STALL_S", 0.2)
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    held: list[socket.socket] = []
    accepting = threading.Thread(target=lambda: held.append(server.accept()[0]), daemon=True)
    accepting.start()
    out = Outbound(peer="Q", peer_host="127.0.0.1", port=server.getsockname()[1], local_host="127.0.0.1",
                   task=3, site="P", connect_timeout_s=5.0, on_lost=lambda *_: None, on_connect=lambda *_: None)
    done = threading.Event()
    try:
        out.start()
        out.send(encode_frame(Header("GLOBAL", 3, 1, "P"), bytes(1 << 20)), round=1, on_sent=done.set, drain=True)

        # Assert: the copy counts as sent (the lane goes on) though its peer never acknowledged it all
        assert done.wait(20)
        assert out.sock is not None and (unacked_bytes(out.sock) or 0) > 0
    finally:
        out._stopping.set()
        for conn in held:
            conn.close()
        server.close()
