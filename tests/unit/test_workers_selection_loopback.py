"""Local-model selection end to end without root: G and 6 local models on a 3-level tree, roles on
loopback site servers (127.0.0.150 on, apart from test_workers_loopback's), real agents and sockets."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.runtime.backends import LoopbackBackend
from orchestrator.runtime.compute import ComputeManager
from orchestrator.runtime.summaries import TaskResult, missing_events, read_events
from orchestrator.runtime.task_runner import FLOptions, run_task
from orchestrator.scheduling.schedule import Schedule

TREE = {"A": "G", "B": "G", "L1": "A", "L2": "A", "L3": "B", "L4": "B"}
LOCALS = ("A", "B", "L1", "L2", "L3", "L4")
SITES = ("G", *LOCALS)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComputeManager]:
    root = tmp_path_factory.mktemp("servers")
    with ComputeManager(LoopbackBackend(SITES, log_root=root, first_octet=150), SITES) as cm:
        yield cm


def _run(cm: ComputeManager, task_id: int, name: str, **options: Any) -> tuple[TaskResult, dict[str, Any]]:
    sched = Schedule(task_id=task_id, scheduler="hand", global_site="G", local_sites=LOCALS, demand_mbps=1.0,
                     broadcast_parent=TREE, upload_parent=TREE)
    log_dir = cm.task_dir(name)
    result = run_task(sched, manager=cm, options=FLOptions(**options), log_dir=log_dir)
    events = {n: read_events(cm.events_file(log_dir, n)) for n in sched.overlay_nodes}
    assert missing_events(sched, events, rounds=options["rounds"]) == []
    return result, events


@pytest.mark.slow
def test_random_k_still_learns_digits_and_sends_fewer_update_bytes(servers: ComputeManager) -> None:
    selected, _events = _run(servers, 37, "random3", rounds=5, model="mlp",
                             selection={"policy": "random", "k": 3, "seed": 1})
    everyone, _ = _run(servers, 38, "all", rounds=5, model="mlp")

    for label, res in (("random k=3", selected), ("all", everyone)):
        print(f"{label}: accuracy", " ".join(f"{r.accuracy:.3f}" for r in res.rounds),
              "| latency (s)", " ".join(f"{r.latency_s:.3f}" for r in res.rounds),
              "| upload bytes", " ".join(str(r.upload_bytes) for r in res.rounds))
    acc = [r.accuracy for r in selected.rounds]
    assert acc[-1] > acc[0] and acc[-1] > 0.8, acc
    assert all(len(r.selected) == 3 and set(r.selected) <= set(LOCALS) for r in selected.rounds)
    assert all(r.selected == () for r in everyone.rounds)
    assert all(r.num_examples < 1438 for r in selected.rounds)
    assert all(r.num_examples == 1438 for r in everyone.rounds)
    assert sum(r.upload_bytes for r in selected.rounds) < sum(r.upload_bytes for r in everyone.rounds)


@pytest.mark.slow
def test_contribution_by_update_norm_reports_norms_through_real_agents(servers: ComputeManager) -> None:
    result, events = _run(servers, 39, "contribution", rounds=4, model="mlp",
                          selection={"policy": "contribution", "k": 2})

    chosen = [list(r.selected) for r in result.rounds]
    assert chosen[:3] == [["A", "B"], ["L1", "L2"], ["L3", "L4"]], chosen  # every local measured once first
    assert len(chosen[3]) == 2
    skipped = {(e["site"], e["round"]) for evs in events.values() for e in evs if e.get("event") == "skipped"}
    assert skipped == {(s, r + 1) for r, sites in enumerate(chosen) for s in LOCALS if s not in sites}


@pytest.mark.slow
def test_a_policy_from_a_file_reaches_g_by_content(servers: ComputeManager, tmp_path: Path) -> None:
    f = tmp_path / "oldest.py"
    f.write_text("from workers.selection import SelectionPolicy\n\n"
                 "class Oldest(SelectionPolicy):\n"
                 "    def rank(self, round, stats):\n"
                 "        return sorted(stats, key=lambda s: (stats[s].round, s))\n")

    result, events = _run(servers, 40, "file_policy", rounds=3, model="mlp", local_epochs=1,
                          selection={"policy": f"{f}:Oldest", "k": 2})

    assert [list(r.selected) for r in result.rounds] == [["A", "B"], ["L1", "L2"], ["L3", "L4"]]
    assert any(e.get("event") == "selected" and e.get("policy") == "Oldest" for e in events["G"])
