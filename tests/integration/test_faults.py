"""Faults and rescheduling, for real (docs/faults.md, "Faults and rescheduling"): Mininet, OVS,
the controller, site servers and PyTorch training, with events injected while a task runs.

- A link under a running task is cut: with ``on_failure`` the task completes on new paths, the move
  and its interruption recorded; with ``never`` (same trace) it fails with the reason.
- A local model's site server is killed mid-task: the round completes with the exact example-weighted
  aggregate of the other updates, and the site rejoins once its server is back. Then the controller
  is restarted: it restores the task from its database and the task completes.

Both runs are trimmed copies of experiments/faults.yaml (one task, no background load).
"""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrator.emulation.cleanup import run_states
from tests.integration.test_experiment import ROOT, leftovers, netai, run_dir_of

pytestmark = [pytest.mark.root, pytest.mark.slow]


def faults_config(tmp_path: Path, **changes: Any) -> Path:
    cfg = yaml.safe_load((ROOT / "experiments" / "faults.yaml").read_text())
    cfg.update(changes)
    cfg["background"] = {"enabled": False}
    cfg["emulation"] = {"max_link_mbps": 100, "backend": "process"}
    path = tmp_path / "faults.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def run(tmp_path: Path, config: Path) -> tuple[Path, sqlite3.Connection, str]:
    out = tmp_path / "runs"
    proc = netai("experiment", str(config), "--out", str(out), "--no-progress", "--no-figures")
    stdout, _ = proc.communicate(timeout=1200)
    assert proc.returncode == 0, stdout[-4000:]
    run_dir = run_dir_of(out)
    conn = sqlite3.connect(run_dir / "results.db")
    conn.row_factory = sqlite3.Row
    assert leftovers() == {"bridges": [], "veths": [], "controller": [], "containers": []}
    assert not [s for s in run_states() if s.live]
    return run_dir, conn, stdout


def rows(conn: sqlite3.Connection, sql: str, *params: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(sql, params)]


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_link_cut_moves_the_task_or_fails_it(tmp_path: Path, figures: list[str]) -> None:
    # The cut comes after round 40 (the orchestrator reads progress about once a second: a few dozen
    # rounds of this small model at most, about 37 on a fast machine), well before the last, whatever
    # the machine's speed.
    rounds = 150
    config = faults_config(tmp_path, task={"model": "mlp", "model_args": {"hidden": 100}, "rounds": rounds,
                                           "demand_mbps": 1000},
                           events=[{"at_round": {"task": 1, "round": 40}, "action": "link_down", "on_task": 1}],
                           reschedule={"policies": ["on_failure", "never"]})
    run_dir, conn, _ = run(tmp_path, config)

    cut = rows(conn, "SELECT * FROM faults WHERE action = 'link_down' ORDER BY scheduler")
    assert [(f["scheduler"], f["ok"]) for f in cut] == [("mst/never", 1), ("mst/on_failure", 1)], cut
    link = tuple(cut[1]["detail"].split(" - ")) if " - " in cut[1]["detail"] else None
    assert link is not None, cut

    # on_failure: the task completed every round, on paths that avoid the cut link.
    task = rows(conn, "SELECT * FROM tasks WHERE scheduler = 'mst/on_failure'")[0]
    assert task["state"] == "done", task
    done_rounds = [r["round"] for r in rows(conn, "SELECT round FROM rounds WHERE scheduler = 'mst/on_failure' "
                                                  "ORDER BY round")]
    assert done_rounds == list(range(1, rounds + 1))
    moves = rows(conn, "SELECT * FROM moves WHERE scheduler = 'mst/on_failure'")
    assert len(moves) == 1, moves
    move = moves[0]
    assert move["reason"].startswith("link ") and move["reason"].endswith(" down"), move
    assert 1 < move["resumed_round"] <= rounds
    assert move["interruption_s"] is not None and move["interruption_s"] > 0
    assert move["next_round_start_s"] > move["at_s"] >= move["last_round_end_s"]
    old, new = json.loads(move["old_schedule_json"]), json.loads(move["new_schedule_json"])

    def hops(schedule: dict[str, Any]) -> set[tuple[str, ...]]:
        return {tuple(sorted(p)) for e in schedule["paths"] for p in zip(e["nodes"], e["nodes"][1:], strict=False)}

    assert tuple(sorted(link)) in hops(old)
    assert tuple(sorted(link)) not in hops(new)
    figures.append(f"link cut under a running task: moved, interruption {move['interruption_s']:.3f} s, "
                   f"resumed at round {move['resumed_round']}")

    # never: the same trace fails the task, with the reason.
    never = rows(conn, "SELECT * FROM tasks WHERE scheduler = 'mst/never'")[0]
    assert never["state"] == "failed"
    assert "went down (reschedule: never)" in never["reason"], never
    assert not rows(conn, "SELECT * FROM moves WHERE scheduler = 'mst/never'")
    report = (run_dir / "report.md").read_text()
    assert "Faults and rescheduling" in report


def test_site_server_killed_then_controller_restarted(tmp_path: Path, figures: list[str]) -> None:
    # Events at rounds, not times, so that they fall inside the task on any machine (a fast one ran
    # 600 rounds before a restart timed at 16 s): the kill after round 30, the server back 3 s later
    # (over a hundred rounds), the controller restart after round 200 of 400 (the 200 after it last
    # over 5 s even at a fast machine's 37 rounds a second; the restart takes about 2 s).
    rounds = 400
    config = faults_config(
        tmp_path, task={"model": "mlp", "model_args": {"hidden": 100}, "rounds": rounds, "demand_mbps": 1000},
        events=[{"at_round": {"task": 1, "round": 30}, "action": "server_kill", "site": "San-Diego",
                 "restart_after_s": 3},
                {"at_round": {"task": 1, "round": 200}, "action": "controller_restart"}],
        reschedule={"policies": ["on_failure"]})
    run_dir, conn, _ = run(tmp_path, config)

    faults = {f["action"]: f for f in rows(conn, "SELECT * FROM faults")}
    assert set(faults) == {"server_kill", "server_restart", "controller_restart"}
    assert all(f["ok"] for f in faults.values()), faults
    task = rows(conn, "SELECT * FROM tasks")[0]
    assert task["state"] == "done", task
    assert [r["round"] for r in rows(conn, "SELECT round FROM rounds ORDER BY round")] == list(range(1, rounds + 1))
    # The controller came back with the task installed (its install id, before the rejoin's move or after).
    assert "restored tasks [" in faults["controller_restart"]["detail"]
    assert faults["controller_restart"]["detail"] != "restored tasks []", faults["controller_restart"]

    # The round in which San-Diego's server died: completed without it. The aggregate is chunked, so
    # the server may die part way through its update: the chunks that arrived carry it, the rest not.
    task_dir = run_dir / "tasks" / "mst-1"
    first = {p.name: events(p) for p in task_dir.glob("*.events.jsonl")}
    g = task["global_site"] if "global_site" in task else "Salt-Lake-City"
    complete = [e for e in first[f"{g}.events.jsonl"] if e["event"] == "round_complete"]
    hit = [e for e in complete if "San-Diego" in e["stragglers"]]
    assert hit, "no round completed without San-Diego"
    r = hit[0]["round"]
    left_out = [e for e in first[f"{g}.events.jsonl"]
                if e["event"] in ("child_lost", "child_timeout", "child_absent") and e["round"] == r and e["child"] == "San-Diego"]
    assert len(left_out) == 1, left_out
    contributions = []
    for name, evs in first.items():
        for e in evs:
            if e["event"] == "train_end" and e["round"] == r and not name.startswith("San-Diego"):
                contributions.append((e["num_examples"], e["fingerprint"]))
    assert len(contributions) == 3, contributions
    total = sum(n for n, _ in contributions)
    received = left_out[0]["chunks_received"]
    assert hit[0]["min_chunk_examples"] == total  # at least its last chunk is the others' alone
    if received == 0:
        # nothing of it arrived: the exact weighted mean of the other updates (fingerprints are linear)
        assert hit[0]["num_examples"] == total
        for i in range(2):
            want = sum(n * f[i] for n, f in contributions) / total
            got = hit[0]["fingerprint"][i]
            assert math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-3), (i, got, want)
    else:  # its first chunks arrived and count its examples; every San-Diego update is its partition
        mine = {e["num_examples"] for e in first["San-Diego.events.jsonl"] if e["event"] == "train_end"}
        assert len(mine) == 1, mine
        assert hit[0]["num_examples"] == total + mine.pop()

    # It rejoined: a move onto the same schedule once its server was back, and it trained again.
    moves = rows(conn, "SELECT * FROM moves ORDER BY move")
    assert moves and moves[0]["reason"] == "rejoin San-Diego", moves
    assert moves[0]["old_schedule_json"] == moves[0]["new_schedule_json"]
    later = task_dir / f"move-{moves[-1]['move']}" / "San-Diego.events.jsonl"
    assert any(e["event"] == "train_end" for e in events(later))
    got = "3 of 4 updates exactly" if received == 0 else f"its first {received} chunks with it, the rest 3 of 4"
    figures.append(f"server killed: round {r} aggregated {got}; rejoin interruption "
                   f"{moves[0]['interruption_s']:.3f} s; controller restart detail: {faults['controller_restart']['detail']}")
