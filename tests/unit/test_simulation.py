"""The flow-level simulation (`orchestrator.simulation`, `engine: simulation`): hand-computable
rounds, trees followed link by link, config validation, simulated runs marked in the database."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import parse_config
from orchestrator.results.db import ResultsDB
from orchestrator.results.queries import point_parts
from orchestrator.runtime.timing import pipelined_time_s
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.cost import (
    SEGMENT_HEADER_BYTES,
    TCP_MSS,
    TCP_PAYLOAD_SHARE,
    capacity_rate,
    pipelined_bound_s,
)
from orchestrator.scheduling.schedule import OverlayEdge, Schedule
from orchestrator.scheduling.tasks import Task
from orchestrator.simulation import frames as engine_frames
from orchestrator.simulation.frames import chunk_sizes
from orchestrator.simulation.spec import SimParams, TaskRun, build_spec, simulate, train_seconds
from topologies.model import NetworkModel

pytest.importorskip("simgrid")

RATE_MBPS = 80.0
D1_MS, D2_MS = 2.0, 3.0


def line() -> NetworkModel:
    """G - A - B: two links of 80 Mbit/s, 2 ms and 3 ms."""
    return NetworkModel.build("line", [{"name": "G"}, {"name": "A"}, {"name": "B"}], [
        {"a": "G", "b": "A", "capacity_mbps": RATE_MBPS, "delay_ms": D1_MS, "wavelengths": 1},
        {"a": "A", "b": "B", "capacity_mbps": RATE_MBPS, "delay_ms": D2_MS, "wavelengths": 1}])


def chain() -> Schedule:
    """Broadcast G -> A -> B, upload B -> A -> G (A forwards and aggregates)."""
    e = OverlayEdge
    return Schedule(task_id=1, scheduler="hand", global_site="G", local_sites=("A", "B"), demand_mbps=1.0,
                    broadcast_parent={"A": "G", "B": "A"}, upload_parent={"B": "A", "A": "G"},
                    edges=(e("broadcast", "G", "A", ("G", "A")), e("broadcast", "A", "B", ("A", "B")),
                           e("upload", "B", "A", ("B", "A")), e("upload", "A", "G", ("A", "G"))))


def relayed() -> Schedule:
    """Broadcast G -> A and G -> B through A (both copies cross G-A), upload B -> A -> G."""
    e = OverlayEdge
    return Schedule(task_id=3, scheduler="hand", global_site="G", local_sites=("A", "B"), demand_mbps=1.0,
                    broadcast_parent={"A": "G", "B": "G"}, upload_parent={"A": "G", "B": "A"},
                    edges=(e("broadcast", "G", "A", ("G", "A")), e("broadcast", "G", "B", ("G", "A", "B")),
                           e("upload", "B", "A", ("B", "A")), e("upload", "A", "G", ("A", "G"))))


def test_round_on_a_three_node_chain_equals_the_pipelined_figure() -> None:
    # Prepare: 1 MB in 10 chunks, no per-chunk work, 0.25 s of training at each local.
    model, schedule = line(), chain()
    size, chunk = 1_000_000, 100_000
    params = SimParams(alpha_s=0.0, chunk_bytes=chunk, seconds_per_example=1e-3, local_epochs=1, train_examples=500)
    spec = build_spec(model, [TaskRun("t", schedule, size, 2)], params, capacity_rate(model))

    out = simulate(spec)

    run = out["runs"][0]
    g = {(e["event"], e["round"]): e["t"] for e in run["events"]["G"]}
    latency = g[("aggregated", 1)] - g[("round_start", 1)]
    # Each procedure is a 2-stage pipeline of 10 chunks plus the chain's propagation (hand: 0.11 + 0.005 s).
    procedure = pipelined_time_s(size, chunk, 2, RATE_MBPS, alpha_s=0.0) + (D1_MS + D2_MS) / 1e3
    assert procedure == pytest.approx(0.115)
    assert latency == pytest.approx(2 * procedure + 0.25, rel=1e-9)
    assert g[("aggregated", 2)] - g[("round_start", 2)] == pytest.approx(latency, rel=1e-9)
    # ... which is the analytic pipelined bound plus one chunk's fill of the pipeline per procedure.
    bound = pipelined_bound_s(model, schedule, "broadcast", size)
    assert procedure - bound == pytest.approx(chunk * 8 / (RATE_MBPS * 1e6))


def test_a_locals_simulated_training_pays_the_rounds_fixed_cost() -> None:
    # Prepare: the chain above, 0.25 s of examples at each local, and a fixed 0.05 s a round.
    model, schedule = line(), chain()
    size, chunk = 1_000_000, 100_000
    base = SimParams(alpha_s=0.0, chunk_bytes=chunk, seconds_per_example=1e-3, local_epochs=1, train_examples=500)
    latency = {}
    for fixed in (0.0, 0.05):
        params = SimParams(**{**base.to_dict(), "seconds_per_round": fixed})
        assert train_seconds(schedule, params) == {"A": pytest.approx(fixed + 0.25), "B": pytest.approx(fixed + 0.25)}
        run = simulate(build_spec(model, [TaskRun("t", schedule, size, 1)], params, capacity_rate(model)))["runs"][0]
        g = {e["event"]: e["t"] for e in run["events"]["G"]}
        latency[fixed] = g["aggregated"] - g["round_start"]

    assert latency[0.05] - latency[0.0] == pytest.approx(0.05, rel=1e-9)
    # at a site of half a core, the fixed part takes twice as long too
    slow = NetworkModel.build("line", [{"name": "G"}, {"name": "A", "cpu": 0.5}, {"name": "B"}],
                              [{"a": "G", "b": "A", "capacity_mbps": RATE_MBPS}, {"a": "A", "b": "B", "capacity_mbps": RATE_MBPS}])
    at_speed = SimParams(**{**base.to_dict(), "seconds_per_round": 0.05, "site_speed": True})
    assert train_seconds(schedule, at_speed, slow)["A"] == pytest.approx((0.05 + 0.25) / 0.5)


def test_merged_segments_fill_the_pipeline_later_by_the_documented_bound() -> None:
    # Prepare: the chain's 10 chunks simulated as 10 segments (no merging) and as 5 of 2 chunks.
    model, schedule = line(), chain()
    size, chunk = 1_000_000, 100_000
    base = SimParams(alpha_s=0.0, chunk_bytes=chunk, seconds_per_example=1e-3, local_epochs=1, train_examples=500)
    latency = {}
    for limit in (0, 10, 5):
        params = SimParams(**{**base.to_dict(), "max_segments": limit})
        run = simulate(build_spec(model, [TaskRun("t", schedule, size, 1)], params, capacity_rate(model)))["runs"][0]
        g = {e["event"]: e["t"] for e in run["events"]["G"]}
        latency[limit] = g["aggregated"] - g["round_start"]

    # One segment per chunk is exact; 2 chunks per segment on 2 hops add (h - 1) x (q - 1) chunk
    # times per procedure, exactly (no per-chunk work).
    assert latency[10] == latency[0]
    chunk_s = chunk * 8 / (RATE_MBPS * 1e6)
    assert latency[5] - latency[0] == pytest.approx(2 * (2 - 1) * (2 - 1) * chunk_s, rel=1e-9)


def test_copies_sharing_a_link_go_one_after_another_as_the_emulations_lanes() -> None:
    # Prepare: G sends to A directly and to B through A, one chunk each: both cross G-A, so they
    # form a lane (the emulation's agents send such copies one after another, A first by name).
    model = line()
    schedule = relayed()
    size = 400_000
    params = SimParams(alpha_s=0.0, seconds_per_example=0.0, chunk_bytes=size)

    spec = build_spec(model, [TaskRun("t", schedule, size, 1)], params, capacity_rate(model))
    out = simulate(spec)

    assert spec["runs"][0]["lanes"] == {"G": [["A", "B"]]}
    events = out["runs"][0]["events"]
    got = {site: next(ev["t"] for ev in events[site] if ev["event"] == "global_received") for site in ("A", "B")}
    one = size * 8 / (RATE_MBPS * 1e6)  # each copy crosses G-A alone, at the full rate
    assert got["A"] == pytest.approx(one + D1_MS / 1e3, rel=1e-9)
    assert got["B"] == pytest.approx(2 * one + (D1_MS + D2_MS) / 1e3, rel=1e-9)


def test_a_single_chunk_per_hop_round_equals_the_pipelined_bound() -> None:
    # Prepare: G's locals are its direct neighbour A only; one chunk, so the bound is reached exactly.
    model = line()
    e = OverlayEdge
    schedule = Schedule(task_id=2, scheduler="hand", global_site="G", local_sites=("A",), demand_mbps=1.0,
                        broadcast_parent={"A": "G"}, upload_parent={"A": "G"},
                        edges=(e("broadcast", "G", "A", ("G", "A")), e("upload", "A", "G", ("A", "G"))))
    params = SimParams(alpha_s=0.0, seconds_per_example=0.0, per_hop_latency_ms=0.5)
    spec = build_spec(model, [TaskRun("t", schedule, 500_000, 1)], params, capacity_rate(model))

    out = simulate(spec)

    g = {e["event"]: e["t"] for e in out["runs"][0]["events"]["G"]}
    hop = 0.5e-3
    bound = sum(pipelined_bound_s(model, schedule, p, 500_000) + hop for p in ("broadcast", "upload"))
    assert g["aggregated"] - g["round_start"] == pytest.approx(bound, rel=1e-9)


def test_transfers_follow_the_schedules_trees_link_by_link() -> None:
    # Prepare: a triangle where spff sends to each local directly and a hand schedule relays via A.
    model = NetworkModel.build("tri", [{"name": "G"}, {"name": "A"}, {"name": "B"}], [
        {"a": "G", "b": "A", "capacity_mbps": 100.0, "wavelengths": 1, "length_km": 10},
        {"a": "A", "b": "B", "capacity_mbps": 100.0, "wavelengths": 1, "length_km": 10},
        {"a": "G", "b": "B", "capacity_mbps": 100.0, "wavelengths": 1, "length_km": 10}])
    task = Task(id=7, global_site="G", local_sites=("A", "B"), model="mlp", rounds=2, demand_mbps=10.0,
                model_bytes=300_000)
    spff = get_scheduler("spff").schedule(NetworkState(model), task)
    e = OverlayEdge
    relayed = Schedule(task_id=7, scheduler="hand", global_site="G", local_sites=("A", "B"), demand_mbps=10.0,
                       broadcast_parent={"A": "G", "B": "G"}, upload_parent={"A": "G", "B": "G"},
                       edges=(e("broadcast", "G", "A", ("G", "A")), e("broadcast", "G", "B", ("G", "A", "B")),
                              e("upload", "A", "G", ("A", "G")), e("upload", "B", "G", ("B", "A", "G"))))
    params = SimParams(chunk_bytes=50_000)
    runs = [TaskRun("spff", spff, 300_000, 2), TaskRun("relayed", relayed, 300_000, 2)]

    out = simulate(build_spec(model, runs, params, capacity_rate(model)))

    per_link = {r["key"]: {(u, v): n for u, v, n in r["link_bytes"]} for r in out["runs"]}
    expected_spff: dict[tuple[str, str], int] = {}
    for edge in spff.edges:
        for link in edge.links():
            expected_spff[link] = expected_spff.get(link, 0) + 2 * 300_000
    assert per_link["spff"] == expected_spff
    assert per_link["relayed"] == {("G", "A"): 1_200_000, ("A", "B"): 600_000, ("B", "A"): 600_000,
                                   ("A", "G"): 1_200_000}
    assert ("G", "B") not in per_link["relayed"]


def test_an_unknown_engine_or_a_stray_simulation_section_is_rejected() -> None:
    with pytest.raises(ConfigError, match="engine must be one of emulation, simulation"):
        parse_config({"name": "x", "engine": "ns3"})
    with pytest.raises(ConfigError, match="a simulation section needs engine: simulation"):
        parse_config({"name": "x", "simulation": {"tcp_efficiency": 0.9}})
    with pytest.raises(ConfigError, match=r"simulation\.tcp_efficiency"):
        parse_config({"name": "x", "engine": "simulation", "simulation": {"tcp_efficiency": 1.5}})
    with pytest.raises(ConfigError, match=r"unknown key simulation\.speed"):
        parse_config({"name": "x", "engine": "simulation", "simulation": {"speed": 1}})
    cfg = parse_config({"name": "x", "engine": "simulation", "simulation": {"per_hop_latency_ms": 0.1}})
    assert parse_config(cfg.to_dict()) == cfg
    assert parse_config({"name": "x"}).engine == "emulation"


def test_a_simulated_run_is_recorded_and_marked_simulated(tmp_path: Path) -> None:
    from orchestrator.experiment.simulated import run_simulated

    # Prepare: a small config on the built-in triangle, two schedulers, one task per point.
    cfg = parse_config({"name": "simtest", "engine": "simulation", "topology": "triangle",
                        "schedulers": ["spff", "mst"], "locals": [2], "tasks_per_point": 1,
                        "task": {"rounds": 2}, "simulation": {"rates": "emulated"}})

    outcome = run_simulated(cfg, out_root=tmp_path, model_bytes=200_000)

    assert outcome.status == "completed"
    with ResultsDB(outcome.run_dir / "results.db") as db:
        run = db.run(outcome.run_id)
        rounds = db.query("SELECT * FROM rounds WHERE run_id = ?", (outcome.run_id,))
        tasks = db.query("SELECT state, carried_bytes FROM tasks WHERE run_id = ?", (outcome.run_id,))
        parts = point_parts(db.conn, outcome.run_id)
    assert run["engine"] == "simulation"
    # where each point's round goes (netai validate's table): the critical path's parts add up to
    # the point's mean round latency, and every local's training has a span
    assert set(parts) == {("spff", 2), ("mst", 2)}
    for (sched, _), p in parts.items():
        mean = sum(r["latency_s"] for r in rounds if r["scheduler"] == sched) / 2
        assert p["broadcast_s"] + p["train_s"] + p["upload_s"] == pytest.approx(mean, rel=1e-9)
        assert p["broadcast_s"] > 0 and p["upload_s"] > 0 and p["training_span_s"] > 0
    assert len(rounds) == 4 and all(r["latency_s"] > 0 and r["accuracy"] is None for r in rounds)
    assert all(r["latency_s"] >= r["lower_bound_s"] * (1 - 1e-9) for r in rounds)
    assert [t["state"] for t in tasks] == ["done", "done"] and all(t["carried_bytes"] > 0 for t in tasks)
    report = (outcome.run_dir / "report.md").read_text()
    assert "**Simulated run**" in report and "## Simulation model" in report
    assert "- CPU: not modelled" in report and "TCP efficiency factor 1.0 (default" in report
    assert (outcome.run_dir / "latency_vs_locals.png").stat().st_size > 0


def test_the_report_says_how_a_calibrated_models_parameters_were_set(tmp_path: Path) -> None:
    from orchestrator.experiment.simulated import run_simulated

    cfg = parse_config({"name": "simcal", "engine": "simulation", "topology": "triangle", "schedulers": ["spff"],
                        "locals": [2], "tasks_per_point": 1, "task": {"rounds": 1},
                        "simulation": {"rates": "emulated", "tcp_efficiency": 0.9564, "cpu_cores": 2,
                                       "cpu_s_per_byte": 1.5e-9, "cpu_s_per_chunk": 0.003,
                                       "calibration": "fitted on the 2-locals point"}})

    outcome = run_simulated(cfg, out_root=tmp_path, model_bytes=200_000, figures=False)  # --no-figures

    report = (outcome.run_dir / "report.md").read_text()
    assert outcome.status == "completed"
    assert not list(outcome.run_dir.glob("*.png")) and not list(outcome.run_dir.glob("*.svg"))
    assert (outcome.run_dir / "report.html").stat().st_size > 0 and (outcome.run_dir / "rounds.csv").exists()
    assert "TCP efficiency factor 0.9564 (set in the config (see how below)" in report
    assert "- CPU: 2 cores shared by every site's processes" in report and "0.003 s per chunk" in report
    assert "- how the parameters were set: fitted on the 2-locals point" in report


def test_a_simulated_runs_training_and_bound_include_the_rounds_fixed_cost(tmp_path: Path) -> None:
    from orchestrator.experiment.simulated import run_simulated

    # Prepare: training of a negligible 1 us an example (2 epochs of ~718) and a fixed 0.3 s a round.
    cfg = parse_config({"name": "simfixed", "engine": "simulation", "topology": "triangle", "schedulers": ["spff"],
                        "locals": [2], "tasks_per_point": 1, "task": {"rounds": 1},
                        "simulation": {"seconds_per_example": 1e-6, "seconds_per_round": 0.3}})

    outcome = run_simulated(cfg, out_root=tmp_path, model_bytes=200_000, figures=False)

    assert outcome.status == "completed"
    with ResultsDB(outcome.run_dir / "results.db") as db:
        rounds = db.query("SELECT * FROM rounds WHERE run_id = ?", (outcome.run_id,))
    assert len(rounds) == 1
    # the critical path's local trains its share of the 1437 examples (718 or 719), 2 epochs
    assert 0.3 + 1e-6 * 2 * 718 - 1e-9 <= rounds[0]["train_s"] <= 0.3 + 1e-6 * 2 * 719 + 1e-9
    assert rounds[0]["lower_bound_s"] >= 0.3 and rounds[0]["latency_s"] >= rounds[0]["lower_bound_s"] * (1 - 1e-9)
    assert "0.3 s per round and 1e-06 s per example and epoch" in (outcome.run_dir / "report.md").read_text()


def test_a_modelled_simulation_with_cost_profile_takes_the_profiles_fixed_cost(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.experiment import simulated
    from orchestrator.runtime import profiles

    measured = profiles.MeasuredProfile(model="mlp", dataset="digits", batch_size=32, train_cpu_s_per_example=1e-5,
                                        train_cpu_s_per_round=2e-3, aggregate_cpu_s_per_mb=0.5, train_examples=1438,
                                        model_bytes=19240, torch_version="x")
    monkeypatch.setattr(profiles, "load_profile", lambda *_a, **_kw: measured)
    params = simulated.sim_params(parse_config({"name": "x", "engine": "simulation", "compute": {"cost": "profile"}}))
    assert (params.seconds_per_example, params.seconds_per_round, params.site_speed) == (1e-5, 2e-3, True)
    # a config's own training figures stand
    own = simulated.sim_params(parse_config({"name": "x", "engine": "simulation",
                                             "simulation": {"seconds_per_round": 0.5}}))
    assert own.seconds_per_round == 0.5 and own.seconds_per_example == SimParams().seconds_per_example


def test_runs_of_an_older_database_count_as_emulated(tmp_path: Path) -> None:
    import sqlite3

    # Prepare: a runs table without the engine column, as databases were written before it.
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, config_json TEXT "
                 "NOT NULL, environment_json TEXT NOT NULL DEFAULT '{}', status TEXT NOT NULL, started_at REAL "
                 "NOT NULL, finished_at REAL, note TEXT NOT NULL DEFAULT '')")
    conn.execute("INSERT INTO runs(name, config_json, status, started_at) VALUES ('old', '{}', 'completed', 0)")
    conn.commit()
    conn.close()

    with ResultsDB(path) as db:
        old = db.run(1)
        new = db.start_run("new", {}, engine="simulation")
        assert db.run(new)["engine"] == "simulation"
        with pytest.raises(ValueError, match="unknown engine"):
            db.start_run("bad", {}, engine="ns3")

    assert old["engine"] == "emulation"


def test_runs_split_among_engine_processes_are_laid_back_to_back_as_in_one() -> None:
    # Prepare: three runs of the chain (one of them contended: the relayed broadcast), one engine
    # process for all of them and one process each.
    model = line()
    runs = [TaskRun("a", chain(), 600_000, 2), TaskRun("b", relayed(), 300_000, 1), TaskRun("c", chain(), 200_000, 3)]
    # a fixed chunk size: the runs' weights (chunks x edges x rounds) make three groups of them
    spec = build_spec(model, runs, SimParams(chunk_bytes=64 * 1024), capacity_rate(model))

    one, three = simulate(spec, processes=1), simulate(spec, processes=3)

    assert three["processes"] == 3 and one["processes"] == 1
    assert [r["key"] for r in three["runs"]] == ["a", "b", "c"]
    assert three["runs"][0]["start_s"] == 0.0
    for a, b in zip(one["runs"], three["runs"], strict=True):
        assert b["start_s"] == pytest.approx(a["start_s"], rel=1e-9)
        assert b["end_s"] == pytest.approx(a["end_s"], rel=1e-9)
        assert b["link_bytes"] == a["link_bytes"]
        assert {s: [(ev["event"], ev["round"]) for ev in evs] for s, evs in b["events"].items()} == \
            {s: [(ev["event"], ev["round"]) for ev in evs] for s, evs in a["events"].items()}
    assert three["sim_end_s"] == pytest.approx(one["sim_end_s"], rel=1e-9)


def test_the_cpu_model_serializes_transfers_on_shared_cores() -> None:
    # Prepare: G sends 1 MB to A and to B on links of their own (0.01 s each); every byte costs
    # 1 us of the workers' CPU or of the switch's, so each transfer needs 1 s of one core.
    model = NetworkModel.build("star", [{"name": "G"}, {"name": "A"}, {"name": "B"}], [
        {"a": "G", "b": "A", "capacity_mbps": 800.0, "wavelengths": 1},
        {"a": "G", "b": "B", "capacity_mbps": 800.0, "wavelengths": 1}])
    e = OverlayEdge
    schedule = Schedule(task_id=4, scheduler="hand", global_site="G", local_sites=("A", "B"), demand_mbps=1.0,
                        broadcast_parent={"A": "G", "B": "G"}, upload_parent={"A": "G", "B": "G"},
                        edges=(e("broadcast", "G", "A", ("G", "A")), e("broadcast", "G", "B", ("G", "B")),
                               e("upload", "A", "G", ("A", "G")), e("upload", "B", "G", ("B", "G"))))
    size = 1_000_000
    latency = {}
    for cores, worker, hop in ((0, 1e-6, 0.0), (1, 1e-6, 0.0), (2, 1e-6, 0.0), (2, 0.0, 1e-6)):
        params = SimParams(alpha_s=0.0, seconds_per_example=0.0, propagation=False, chunk_bytes=size,
                           cpu_cores=cores, cpu_s_per_byte=worker, cpu_s_per_byte_hop=hop)
        out = simulate(build_spec(model, [TaskRun("t", schedule, size, 1)], params, capacity_rate(model)))
        g = {ev["event"]: ev["t"] for ev in out["runs"][0]["events"]["G"]}
        latency[(cores, hop > 0)] = g["aggregated"] - g["round_start"]

    # Off: two procedures of 0.01 s. The workers' work: G's process takes part in both transfers of
    # a procedure, on one core, whatever the machine's cores (2 s each). The switch's threads run
    # on the machine's cores: both transfers' switching (1 s each) on 2 cores, 1 s a procedure.
    assert latency[(0, False)] == pytest.approx(0.02, rel=1e-9)
    assert latency[(1, False)] == pytest.approx(4.0, rel=1e-9)
    assert latency[(2, False)] == pytest.approx(4.0, rel=1e-9)
    assert latency[(2, True)] == pytest.approx(2.0, rel=1e-9)


def test_the_cpu_model_shares_the_machines_cores_among_the_sites_processes() -> None:
    # Prepare: G - A - B - C, broadcast along the chain in 10 chunks; every chunk costs 0.1 s of
    # its sender's and receiver's processes, far more than its transmission.
    model = NetworkModel.build("chain4", [{"name": n} for n in "GABC"], [
        {"a": a, "b": b, "capacity_mbps": 8000.0, "wavelengths": 1} for a, b in ("GA", "AB", "BC")])
    e = OverlayEdge
    schedule = Schedule(task_id=5, scheduler="hand", global_site="G", local_sites=("A", "B", "C"), demand_mbps=1.0,
                        broadcast_parent={"A": "G", "B": "A", "C": "B"}, upload_parent={"A": "G", "B": "A", "C": "B"},
                        edges=(e("broadcast", "G", "A", ("G", "A")), e("broadcast", "A", "B", ("A", "B")),
                               e("broadcast", "B", "C", ("B", "C")), e("upload", "C", "B", ("C", "B")),
                               e("upload", "B", "A", ("B", "A")), e("upload", "A", "G", ("A", "G"))))
    got = {}
    for cores in (1, 2):
        params = SimParams(alpha_s=0.0, seconds_per_example=0.0, propagation=False, chunk_bytes=1000,
                           cpu_cores=cores, cpu_s_per_chunk=0.1)
        out = simulate(build_spec(model, [TaskRun("t", schedule, 10_000, 1)], params, capacity_rate(model)))
        events = out["runs"][0]["events"]
        got[cores] = next(ev["t"] for ev in events["C"] if ev["event"] == "global_received")

    # G->A and B->C share no process and run at once on two cores; one core takes them in turn.
    assert got[1] > got[2] * 1.2


def test_with_the_cpu_model_trainings_share_the_cores_and_end_no_earlier_than_modelled() -> None:
    # Prepare: G relays to A and B (spff: one edge each), both train 1 s of CPU; one core for all.
    model = line()
    e = OverlayEdge
    schedule = Schedule(task_id=4, scheduler="hand", global_site="G", local_sites=("A", "B"), demand_mbps=1.0,
                        broadcast_parent={"A": "G", "B": "G"}, upload_parent={"A": "G", "B": "G"},
                        edges=(e("broadcast", "G", "A", ("G", "A")), e("broadcast", "G", "B", ("G", "A", "B")),
                               e("upload", "A", "G", ("A", "G")), e("upload", "B", "G", ("B", "A", "G"))))
    size = 10_000
    base = SimParams(alpha_s=0.0, chunk_bytes=size, seconds_per_example=1e-3, local_epochs=1, train_examples=2000,
                     propagation=False)
    train = {}
    for cores in (1, 2):
        params = SimParams(**{**base.to_dict(), "cpu_cores": cores, "cpu_s_per_byte": 1e-12})
        run = simulate(build_spec(model, [TaskRun("t", schedule, size, 1)], params, capacity_rate(model)))["runs"][0]
        ev = {(site, x["event"]): x["t"] for site, evs in run["events"].items() for x in evs}
        train[cores] = {s: ev[(s, "train_end")] - ev[(s, "train_start")] for s in ("A", "B")}

    # Each local's 1 s of CPU: on two cores each has its own and takes its modelled 1 s; on one
    # core they share it max-min: B starts d later, A runs alone for d, then both at half speed, so
    # A ends at 2 - d after its start and B, alone again for its last d, at 2 - d after its own.
    assert train[2] == pytest.approx({"A": 1.0, "B": 1.0}, rel=1e-6)
    assert train[1]["A"] == pytest.approx(train[1]["B"], rel=1e-6)
    assert 1.9 < train[1]["A"] < 2.0


@pytest.mark.parametrize("efficiency", [1.0, 0.5])
def test_the_simulation_logs_what_the_shaped_link_rate_reads(efficiency: float) -> None:
    # Prepare: both copies of G's broadcast cross G -> A (one lane), 2 x 1 MB at 80 Mbit/s x efficiency.
    from orchestrator.lifecycle.fidelity import copy_rows, link_rate_rows
    from orchestrator.runtime.summaries import node_rounds

    model, schedule = line(), relayed()
    size = 1_000_000
    params = SimParams(alpha_s=0.0, chunk_bytes=100_000, seconds_per_example=0.0, tcp_efficiency=efficiency)
    events = simulate(build_spec(model, [TaskRun("t", schedule, size, 1)], params, capacity_rate(model)))["runs"][0][
        "events"]

    rows = link_rate_rows(model, schedule, node_rounds(schedule, events), model_bytes=size,
                          rate=capacity_rate(model), propagation=True, copies=copy_rows(events))

    # G logs each copy's start; the link is busy from the first to B holding the model (5 ms after its
    # last segment left G): the copies at the configured rate plus that delay over that time
    assert sorted(e["peer"] for e in events["G"] if e["event"] == "forward_first") == ["A", "B"]
    (row,) = rows
    assert (row["a"], row["b"], row["bytes"]) == ("G", "A", 2 * size)
    busy = 2 * size * 8 / (RATE_MBPS * 1e6 * efficiency) + (D1_MS + D2_MS) / 1e3
    assert row["measured_s"] == pytest.approx(busy, rel=1e-6)
    assert row["rate_share"] == pytest.approx((2 * size * 8 / (RATE_MBPS * 1e6) + 0.005) / busy, rel=1e-6)


def test_a_copys_frame_bytes_cross_every_link_and_take_their_time() -> None:
    # Prepare: the chain's 10 chunks, once without frames and once as 10 frames of a chunk and 100
    # bytes of headers each (as `model_sizes` would give for the model at that chunk size).
    model, schedule = line(), chain()
    size, chunk, frames = 1_000_000, 100_000, 1000
    params = SimParams(alpha_s=0.0, chunk_bytes=chunk, seconds_per_example=0.0)
    runs = {}
    for fb in (None, lambda c: (c + 100,) * 10):
        spec = build_spec(model, [TaskRun("t", schedule, size, 1)], params, capacity_rate(model), frames=fb)
        runs[fb is None] = (spec["runs"][0], simulate(spec)["runs"][0])

    assert runs[True][0]["frame_bytes"] == 0 and runs[False][0]["frame_bytes"] == frames
    assert runs[False][0]["frame_sizes"] == [chunk + 100] * 10
    plain, framed = ({(u, v): n for u, v, n in r["link_bytes"]} for _, r in (runs[True], runs[False]))
    # every link a copy crosses carries its frames too (one copy each way over each link of the chain)
    assert set(framed) == set(plain) and all(framed[k] - plain[k] == frames for k in plain)
    # and each procedure's pipeline of 10 chunks over 2 hops takes 11 chunk times of the larger chunk
    g = {r: {e["event"]: e["t"] for e in run["events"]["G"]} for r, (_, run) in runs.items()}
    extra = 2 * (10 + 1) * (frames / 10) * 8 / (RATE_MBPS * 1e6)
    assert (g[False]["aggregated"] - g[False]["round_start"]) - (g[True]["aggregated"] - g[True]["round_start"]) \
        == pytest.approx(extra, rel=1e-6)


def test_segmented_frames_cost_their_segments_headers_on_the_wire() -> None:
    # A frame of 1,500 bytes is two segments (1,448 and 52 bytes of payload), 1,632 bytes on the
    # wire; at the payload share of the rate it takes those bytes at the line rate.
    share = TCP_PAYLOAD_SHARE
    run = {"model_bytes": 3000, "chunk_bytes": 1500, "frame_sizes": [1500, 1448], "payload_share": share}
    assert chunk_sizes(run) == [1500, 1448]  # no segments: the frames as they are
    sized = chunk_sizes({**run, "segment_mss": TCP_MSS})
    assert sized == [round((1500 + 2 * SEGMENT_HEADER_BYTES) * share), 1448]  # a full segment: its payload
    assert engine_frames.SEGMENT_HEADER_BYTES == SEGMENT_HEADER_BYTES == 66

    # Through the engine: one frame G -> A -> B on a chain, the copy's time is its wire bytes at the
    # line rate per hop (no per-chunk work, no propagation, no training).
    model, schedule = line(), chain()
    params = SimParams(alpha_s=0.0, chunk_bytes=1500, seconds_per_example=0.0, propagation=False,
                       tcp_efficiency=share, segment_mss=TCP_MSS)
    spec = build_spec(model, [TaskRun("t", schedule, 1500, 1)], params, capacity_rate(model),
                      frames=lambda c: (1500,))
    events = simulate(spec)["runs"][0]["events"]
    got = {e["event"]: e["t"] for e in events["B"]}["global_received"]
    start = {e["event"]: e["t"] for e in events["G"]}["round_start"]
    line_rate = RATE_MBPS * 1e6 / 8
    assert got - start == pytest.approx(2 * 1632 / line_rate, rel=1e-3)


def two_way() -> Schedule:
    """Broadcast G -> A, then G -> B through A (a lane over G-A); A and B upload straight to G, A's
    upload going back over A-G while G's copy to B still crosses G-A."""
    e = OverlayEdge
    return Schedule(task_id=5, scheduler="hand", global_site="G", local_sites=("A", "B"), demand_mbps=1.0,
                    broadcast_parent={"A": "G", "B": "G"}, upload_parent={"A": "G", "B": "G"},
                    edges=(e("broadcast", "G", "A", ("G", "A")), e("broadcast", "G", "B", ("G", "A", "B")),
                           e("upload", "A", "G", ("A", "G")), e("upload", "B", "G", ("B", "A", "G"))))


@pytest.mark.parametrize("ack", [0.05, 0.0218])
def test_acks_slow_a_transfer_only_while_another_goes_the_other_way(ack: float) -> None:
    # Prepare: one chunk a copy, no propagation, training takes no time. A gets its copy at t1 and
    # uploads at once over A-G, while G's copy to B crosses G-A: each shares its link with the other's
    # ACKs (ack x its bytes), so both take (1 + ack) x a lone copy's time. The chain's broadcast and
    # upload never overlap: its round is the same with ACKs as without.
    size = 400_000
    one = size * 8 / (RATE_MBPS * 1e6)
    model = line()

    def run(schedule: Schedule, share: float) -> dict[str, list[dict[str, object]]]:
        params = SimParams(alpha_s=0.0, seconds_per_example=0.0, chunk_bytes=size, propagation=False,
                           ack_share=share)
        spec = build_spec(model, [TaskRun("t", schedule, size, 1)], params, capacity_rate(model))
        assert spec["runs"][0]["ack_share"] == share
        return simulate(spec)["runs"][0]["events"]  # type: ignore[no-any-return]

    def at(events: dict[str, list[dict[str, object]]], site: str, name: str) -> float:
        return next(float(ev["t"]) for ev in events[site] if ev["event"] == name)  # type: ignore[arg-type]

    with_acks, without = run(two_way(), ack), run(two_way(), 0.0)
    chain_acks, chain_plain = run(chain(), ack), run(chain(), 0.0)

    t1 = at(with_acks, "A", "global_received")
    assert t1 == pytest.approx(one, rel=1e-9) and at(without, "A", "global_received") == pytest.approx(one, rel=1e-9)
    assert at(with_acks, "B", "global_received") - t1 == pytest.approx((1 + ack) * one, rel=1e-6)
    assert at(without, "B", "global_received") - t1 == pytest.approx(one, rel=1e-9)
    assert at(with_acks, "A", "update_sent") - t1 == pytest.approx((1 + ack) * one, rel=1e-6)
    assert at(with_acks, "G", "aggregated") - at(with_acks, "B", "global_received") == pytest.approx(one, rel=1e-6)
    assert at(chain_acks, "G", "aggregated") == pytest.approx(at(chain_plain, "G", "aggregated"), rel=1e-9)


def test_the_ack_share_is_a_validated_simulation_key() -> None:
    ok = parse_config({"name": "x", "engine": "simulation", "simulation": {"ack_share": 0.0218}})

    assert ok.simulation.ack_share == 0.0218
    with pytest.raises(ConfigError, match="ack_share"):
        parse_config({"name": "x", "engine": "simulation", "simulation": {"ack_share": 1.5}})


def test_with_acks_an_edge_is_simulated_when_another_crosses_its_links_the_other_way_but_not_its_mirror() -> None:
    # An edge's mirror (the same pair the other way, the other procedure) never overlaps it: the
    # chain, whose every edge has its mirror on the same links, stays computed with ACKs (counting
    # the mirror would simulate all four). In `two_way`, A's upload and G's copy to B cross G-A
    # opposite ways.
    from orchestrator.simulation.engine import _edges

    model = line()
    params = SimParams(alpha_s=0.0, seconds_per_example=0.0, chunk_bytes=1000, ack_share=0.0218)

    def contended(schedule: Schedule, acks: bool) -> set[tuple[str, str, str]]:
        run = build_spec(model, [TaskRun("t", schedule, 1000, 1)], params, capacity_rate(model))["runs"][0]
        paths = {tuple(e["path"]) for e in run["edges"]}
        hosts = {p: (None, None) for p in paths}
        rates = {(u, v): 1.0 for p in paths for u, v in itertools.pairwise(p)}
        edges = _edges(run, hosts, dict.fromkeys(paths, 0.0), rates, None, {}, frozenset(),
                       {p: object() for p in paths} if acks else None)
        return {(e.procedure, e.src, e.dst) for e in edges if e.contended}

    assert contended(chain(), acks=True) == contended(chain(), acks=False) == set()
    assert contended(two_way(), acks=True) == {("broadcast", "G", "B"), ("upload", "A", "G"),
                                               ("upload", "B", "G"), ("broadcast", "G", "A")}


@pytest.mark.parametrize("alpha_s", [0.002, 0.02])
def test_per_chunk_work_overlaps_the_transmission_before_it(alpha_s: float) -> None:
    # Prepare: the chain's 10 chunks of 100 kB (10 ms each at 80 Mbit/s), per-chunk work of 2 ms
    # (below a chunk's transmission) and of 20 ms (above it), no propagation and no training.
    model, schedule = line(), chain()
    size, chunk = 1_000_000, 100_000
    params = SimParams(alpha_s=alpha_s, chunk_bytes=chunk, seconds_per_example=0.0, propagation=False)

    run = simulate(build_spec(model, [TaskRun("t", schedule, size, 1)], params, capacity_rate(model)))["runs"][0]

    at = {(ev["site"], ev["event"]): ev["t"] for evs in run["events"].values() for ev in evs}
    # G frames chunk after chunk while the one before is on the link, as an agent's sender thread
    # and socket buffer let it: A holds the model once the slower of the two stages went 10 times and
    # the other once (not 10 x (work + transmission)); B one chunk's work and transmission later.
    tx = chunk * 8 / (RATE_MBPS * 1e6)
    to_a = 10 * max(alpha_s, tx) + min(alpha_s, tx)
    assert at[("A", "global_received")] - at[("G", "round_start")] == pytest.approx(to_a, rel=1e-9)
    assert at[("B", "global_received")] - at[("G", "round_start")] == pytest.approx(to_a + alpha_s + tx, rel=1e-9)
