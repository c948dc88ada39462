"""End to end without root: G and 6 local models on a 3-level tree, roles on loopback site servers
(127.0.0.x), one set of servers for the whole module (they host every test's tasks)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.runtime.backends import LoopbackBackend
from orchestrator.runtime.compute import ComputeManager
from orchestrator.runtime.summaries import TaskResult, missing_events, read_events
from orchestrator.runtime.task_runner import FLOptions, agent_configs, run_task
from orchestrator.scheduling.schedule import Schedule, task_ports

# G -> A, B; A -> L1, L2, L3 ... : three levels, A and B hold local models too.
TREE = {"A": "G", "B": "G", "L1": "A", "L2": "A", "L3": "B", "L4": "B"}
LOCALS = ("A", "B", "L1", "L2", "L3", "L4")


SITES = ("G", *LOCALS, "R", "R1", "R2", "L1'", "L2'", "L3'")


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ComputeManager]:
    root = tmp_path_factory.mktemp("servers")
    with ComputeManager(LoopbackBackend(SITES, log_root=root), SITES) as cm:
        yield cm


def _run(cm: ComputeManager, sched: Schedule, name: str, **options: Any) -> tuple[TaskResult, Path]:
    log_dir = cm.task_dir(name)
    result = run_task(sched, manager=cm, options=FLOptions(**options), log_dir=log_dir)
    return result, log_dir


def _schedule(upload: dict[str, str] | None = None) -> Schedule:
    return Schedule(task_id=11, scheduler="hand", global_site="G", local_sites=LOCALS, demand_mbps=1.0,
                    broadcast_parent=TREE, upload_parent=upload or TREE)


def test_agent_configs_follow_the_trees() -> None:
    # the upload tree differs: L4 reports through relay R, which holds no model
    upload = {**TREE, "L4": "R", "R": "G"}
    sched = _schedule(upload)
    addrs = {n: f"10.0.0.{i + 1}" for i, n in enumerate(sched.overlay_nodes)}

    cfgs = agent_configs(sched, addresses=addrs, options=FLOptions(rounds=2, child_timeout_s=5))

    assert set(cfgs) == {"G", *LOCALS, "R"}
    assert cfgs["G"].is_global and not cfgs["G"].trains
    assert [p.site for p in cfgs["G"].broadcast_children] == ["A", "B"]
    assert [p.site for p in cfgs["G"].upload_children] == ["A", "B", "R"]
    assert cfgs["R"].part_index is None and not cfgs["R"].expects_global
    assert cfgs["R"].upload_parent is not None and cfgs["R"].upload_parent.host == addrs["G"]
    assert sorted(c.part_index for c in cfgs.values() if c.part_index is not None) == list(range(6))
    assert (cfgs["L1"].broadcast_port, cfgs["L1"].upload_port) == task_ports(11)
    # a node waits longer the higher its subtree: G (height 2) twice what A (height 1) waits
    assert cfgs["G"].child_timeout_s == 2 * cfgs["A"].child_timeout_s == 10


def test_agent_configs_reject_a_tree_that_misses_a_local() -> None:
    broken = {k: v for k, v in TREE.items() if k != "L2"}
    with pytest.raises(ConfigError, match="L2"):
        agent_configs(_schedule(broken), addresses=dict.fromkeys(("G", *LOCALS), "10.0.0.1"),
                      options=FLOptions())


@pytest.mark.slow
def test_loopback_task_learns_digits(servers: ComputeManager) -> None:
    sched = _schedule()

    result, log_dir = _run(servers, sched, "learns", rounds=5, model="mlp", partitioning="iid")

    acc = [r.accuracy for r in result.rounds]
    print("loopback accuracy per round:", " ".join(f"{a:.3f}" for a in acc))
    print("round latency (s):", " ".join(f"{r.latency_s:.3f}" for r in result.rounds))
    assert len(acc) == 5
    assert all(b > a for a, b in itertools.pairwise(acc)), acc
    assert acc[-1] > 0.85
    assert all(r.num_examples == 1438 and r.stragglers == () for r in result.rounds)
    assert all(abs(r.broadcast_s + r.train_s + r.upload_s - r.latency_s) < 1e-6 for r in result.rounds)
    events = {n: read_events(servers.events_file(log_dir, n)) for n in sched.overlay_nodes}
    assert missing_events(sched, events, rounds=5) == []
    assert result.rejected == ()
    # every overlay edge's connection logged the kernel's TCP figures as it closed; on loopback
    # nothing is retransmitted, and every frame byte was sent
    tcp = [e for evs in events.values() for e in evs if e["event"] == "tcp"]
    edges = len(sched.broadcast_parent) + len(sched.upload_parent)
    assert len(tcp) == edges and all(e["connections"] == 1 for e in tcp)
    frames = sum(r.broadcast_bytes + r.upload_bytes for r in result.rounds)
    assert result.sent_bytes is not None and result.sent_bytes >= frames
    assert result.retrans_bytes == 0


@pytest.mark.slow
def test_relays_forward_and_aggregate_on_different_trees(servers: ComputeManager) -> None:
    # Broadcast: G -> R1 (relay) -> L1, L2; G -> L3. Upload: L1 -> R1 -> G; L2, L3 -> R2 (upload-only relay) -> G.
    sched = Schedule(task_id=12, scheduler="hand", global_site="G", local_sites=("L1", "L2", "L3"),
                     demand_mbps=1.0, broadcast_parent={"R1": "G", "L1": "R1", "L2": "R1", "L3": "G"},
                     upload_parent={"L1": "R1", "R1": "G", "L2": "R2", "L3": "R2", "R2": "G"})

    result, log_dir = _run(servers, sched, "relays", rounds=2, model="mlp", local_epochs=1)

    events = {n: read_events(servers.events_file(log_dir, n)) for n in sched.overlay_nodes}
    assert missing_events(sched, events, rounds=2) == []
    assert all(r.num_examples == 1438 and r.stragglers == () for r in result.rounds)
    r2 = [e for e in events["R2"] if e["event"] == "child_received" and e["round"] == 2]
    assert sorted(e["child"] for e in r2) == ["L2", "L3"]
    assert not any(e["event"] == "train_start" for e in events["R1"] + events["R2"]), "relays do not train"
    assert any(e["event"] == "forward_first" and e["peer"] == "L2" for e in events["R1"])
