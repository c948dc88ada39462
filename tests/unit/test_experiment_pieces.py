"""Experiment configs, the results database and the results it produces (no emulation)."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.config import load_config, parse_config
from orchestrator.results.csvs import write_csvs
from orchestrator.results.db import ResultsDB
from orchestrator.results.report import write_report
from orchestrator.results.summary import claims, run_summary
from orchestrator.results.summary_figures import plot
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.tasks import Task, generate_tasks
from topologies.loaders import load

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["quick.yaml", "paper.yaml", "plugin.yaml"])
def test_shipped_configs_are_valid(name: str) -> None:
    cfg = load_config(ROOT / "experiments" / name)

    assert cfg.topology == "sndlib/nobel-us"
    assert "spff" in cfg.schedulers and "mst" in cfg.schedulers


def test_experiments_run_in_strict_connectivity_unless_asked_otherwise() -> None:
    default = parse_config({"name": "x"})
    open_ = parse_config({"name": "x", "emulation": {"connectivity": "best-effort"}})

    assert (default.emulation.connectivity, open_.emulation.connectivity) == ("strict", "best-effort")
    assert open_.to_dict()["emulation"]["connectivity"] == "best-effort"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "x", "colour": 1}, "unknown key 'colour'"),
        ({"name": "x", "task": {"rounds": 0}}, "task.rounds must be an integer"),
        ({"name": "x", "task": {"epochs": 3}}, "unknown key task.epochs"),
        ({"name": "x", "schedulers": ["mst", "dijkstra"]}, "unknown scheduler 'dijkstra'"),
        ({"name": "x", "locals": [2, 14]}, "locals 14 is more than"),
        ({"name": "x", "topology": "sndlib/nope"}, "unknown topology"),
        ({"name": "x", "emulation": {"max_link_mbps": 5000}}, "emulation.max_link_mbps"),
        ({"name": "x", "emulation": {"backend": "vm"}}, "emulation.backend must be one of"),
        ({"name": "x", "emulation": {"connectivity": "open"}}, "emulation.connectivity must be one of"),
        ({"name": "x", "background": {"load": 1.5}}, "background.load"),
        ({"name": "x", "background": {"enabled": "yes"}}, "true or false"),
        (["not", "a", "mapping"], "expected a mapping"),
    ],
)
def test_bad_configs_fail_with_one_line(raw: object, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, where="cfg.yaml")

    assert message in str(info.value)
    assert str(info.value).startswith("cfg.yaml: ")
    assert "\n" not in str(info.value)


def test_malformed_and_missing_config_files(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [\n")
    with pytest.raises(ConfigError, match="malformed YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "missing.yaml")


def fill(db: ResultsDB, environment: dict[str, Any] | None = None) -> int:
    """A run with real schedules and made-up round timings (the runner is not under test)."""
    model = load("sndlib/nobel-us")
    run_id = db.start_run("t", {"k": 1}, {"delay_emulated": False, **(environment or {})})
    for scheduler in ("spff", "mst"):
        state = NetworkState(model)
        sched = get_scheduler(scheduler)
        for n in (2, 8):
            for task in generate_tasks(model, count=3, locals_per_task=n, seed=n, first_id=10 * n):
                db.record_task(run_id, scheduler, task)
                db.record_network_state(run_id, scheduler, task.id, state)
                s = sched.schedule(state, task)
                state.admit(s)
                db.record_schedule(run_id, s, lower_bound_s=0.01 * n)
                for r in range(1, 4):
                    lat = 0.02 * n + 0.001 * r + (0.005 if scheduler == "spff" else 0.0) + 0.0003 * task.id
                    db.record_round(run_id, scheduler, task.id, r, latency_s=lat, broadcast_s=lat / 3,
                                    train_s=lat / 3, upload_s=lat / 3, accuracy=0.5 + 0.1 * r,
                                    lower_bound_s=0.01 * n)
                db.set_carried_bytes(run_id, scheduler, task.id, 1_000_000 * n)
                db.set_task_state(run_id, scheduler, task.id, "done")
    db.finish_run(run_id, "completed")
    return run_id


def assert_plotted_means_match_rows(db: ResultsDB, run_id: int, drawn: dict[str, Any]) -> int:
    """Recompute every plotted point from the raw rows with SQL; returns how many were checked."""
    checked = 0
    for sched, points in drawn["latency_vs_locals"].items():
        for n, y, yerr in points:
            per_task = [
                statistics.fmean(r["latency_s"] for r in db.query(
                    "SELECT latency_s FROM rounds WHERE run_id=? AND scheduler=? AND task_id=?",
                    (run_id, sched, t["task_id"])))
                for t in db.query("SELECT task_id FROM tasks WHERE run_id=? AND scheduler=? AND n_locals=? "
                                  "AND task_id IN (SELECT task_id FROM rounds WHERE run_id=? AND scheduler=?)",
                                  (run_id, sched, n, run_id, sched))
            ]
            assert y == pytest.approx(statistics.fmean(per_task))
            assert yerr == pytest.approx(statistics.pstdev(per_task))
            checked += 1
    for sched, points in drawn["bandwidth_vs_locals"].items():
        for n, y, yerr in points:
            reserved = [r["reserved_mbps"] for r in db.query(
                "SELECT s.reserved_mbps FROM schedules s JOIN tasks t USING (run_id, scheduler, task_id) "
                "WHERE s.run_id=? AND s.scheduler=? AND t.n_locals=? AND t.task_id IN "
                "(SELECT task_id FROM rounds WHERE run_id=? AND scheduler=?)", (run_id, sched, n, run_id, sched))]
            assert y == pytest.approx(statistics.fmean(reserved))
            assert yerr == pytest.approx(statistics.pstdev(reserved))
            checked += 1
    return checked


def test_every_plotted_mean_is_recomputed_from_the_rows(tmp_path: Path) -> None:
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db)

    drawn = plot(run_summary(db, run_id).points, tmp_path)

    assert assert_plotted_means_match_rows(db, run_id, drawn) == 2 * 2 * 2
    for f in ("latency_vs_locals", "bandwidth_vs_locals"):
        assert (tmp_path / f"{f}.png").stat().st_size > 1000
        assert (tmp_path / f"{f}.svg").read_text().lstrip().startswith("<?xml")


def test_report_csvs_and_claims(tmp_path: Path) -> None:
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db)

    report = write_report(db, run_id, tmp_path).read_text()
    csvs = write_csvs(db, run_id, tmp_path)
    c = claims(run_summary(db, run_id).points, n_locals=8)

    assert "| delay_emulated | no |" in report
    assert "## The paper's two claims, at 8 local models" in report
    assert c["bandwidth_ratio"] is not None and c["bandwidth_ratio"] < 1  # real schedules: mst < spff
    assert c["latency_ratio"] is not None and c["latency_ratio"] < 1  # made-up timings favour mst
    assert f"mst / spff = {c['bandwidth_ratio']:.3f}" in report
    assert [p.name for p in csvs] == ["rounds.csv", "tasks.csv", "summary.csv"]
    assert len((tmp_path / "rounds.csv").read_text().splitlines()) == 1 + 2 * 2 * 3 * 3


def test_the_report_leads_with_the_claims_and_ends_with_the_environment(tmp_path: Path) -> None:
    # Prepare: a run whose environment holds a mapping, a list of mappings and a list
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db, {"background_view": {"max_cv": 0.1, "window_s": 3.0},
                       "trials": [{"k": 1, "faithful": False}, {"k": 2, "faithful": True}], "pinned": ["a", "b"]})

    # Execute
    report = write_report(db, run_id, tmp_path).read_text()
    page = (tmp_path / "report.html").read_text()

    # Assert: the claims (with their intervals) come first, then the main figure, the tables, and the
    # environment last, as a table of plain values; the same order in report.html.
    heads = [line for line in report.splitlines() if line.startswith("## ")]
    assert heads[0] == "## The paper's two claims, at 8 local models"
    assert heads[1] == "## Main figure: `latency_vs_locals`"
    assert heads[-1] == "## Environment" and heads.index("## Summary") > 1
    claims_at, env_at = report.index("## The paper's two claims"), report.index("## Environment")
    assert "| reserved bandwidth | " in report[claims_at:env_at] and "95 % CI" in report[claims_at:env_at]
    assert "delay_emulated" not in report[:claims_at] and "background_view" not in report[:env_at]
    environment = report[env_at:]
    assert "| background_view.max_cv | 0.1 |" in environment and "| delay_emulated | no |" in environment
    assert "| trials[1] | faithful: no; k: 1 |" in environment and "| pinned | a, b |" in environment
    assert "{" not in environment and "'" not in environment and "True" not in environment
    assert page.index("The paper&#x27;s two claims" if "&#x27;" in page else "The paper's two claims") \
        < page.index("Environment</h2>")


def test_the_report_gives_each_site_servers_peak_against_the_models_size(tmp_path: Path) -> None:
    # Prepare: a run that recorded its site servers' peaks (orchestrator.experiment.runs.site_peaks)
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db, {"site_peak_rss_mb": {"Gdansk": 640.0, "Warsaw": 453.7}, "site_peak_per_model": 16.0,
                       "site_peak_model_mb": 40.0})

    # Execute
    report = write_report(db, run_id, tmp_path).read_text()

    # Assert: a table of its own, before the environment, which does not repeat the peaks
    memory_at, env_at = report.index("## Site servers' memory"), report.index("## Environment")
    assert memory_at < env_at
    assert "| Gdansk | 640.0 | 16.0 |" in report[memory_at:env_at]
    assert "| Warsaw | 453.7 | 11.3 |" in report[memory_at:env_at]
    assert "site_peak_rss_mb" not in report[env_at:] and "| site_peak_per_model | 16.0 |" in report[env_at:]


def test_interrupted_run_keeps_finished_rounds(tmp_path: Path) -> None:
    path = tmp_path / "results.db"
    db = ResultsDB(path)
    run_id = db.start_run("t", {})
    db.record_round(run_id, "mst", 1, 1, latency_s=0.1, broadcast_s=0.03, train_s=0.04, upload_s=0.03,
                    accuracy=0.7, lower_bound_s=0.05)
    db.finish_run(run_id, "interrupted", note="Ctrl-C")
    db.close()

    again = ResultsDB(path)

    assert again.run(run_id)["status"] == "interrupted"
    assert again.query("SELECT latency_s FROM rounds WHERE run_id = ?", (run_id,)) == [{"latency_s": 0.1}]
    assert again.query("PRAGMA journal_mode")[0]["journal_mode"] == "wal"
    with pytest.raises(ValueError):
        again.finish_run(run_id, "running")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("name: x\nrounds: 3\n", "unknown key 'rounds'"),
        ("name: x\nlocals: [0]\n", "locals[] must be an integer >= 1"),
        ("name: x\nschedulers: [mst, magic]\n", "unknown scheduler 'magic'"),
    ],
)
def test_netai_experiment_rejects_a_bad_config_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    from orchestrator.cli import main

    config = tmp_path / "bad.yaml"
    config.write_text(text)
    out = tmp_path / "runs"

    code = main(["experiment", str(config), "--out", str(out)])

    err = capsys.readouterr().err
    assert code == 2
    assert message in err and err.count("\n") == 1
    assert not out.exists()  # no run folder: nothing was started


def test_round_progress_counts_completed_rounds_and_locals_trained(tmp_path: Path) -> None:
    import json as _json

    from orchestrator.experiment.runner import round_progress
    from orchestrator.runtime.compute_port import EventTail

    s = get_scheduler("mst").schedule(NetworkState(load("triangle")), Task(1, "A", ("B", "C")))
    lines = {  # written as the agents write them: compact JSON, one event per line
        "A": [{"event": "round_complete", "round": 1}],
        "B": [{"event": "train_end", "round": 1}, {"event": "train_end", "round": 2}],
        "C": [{"event": "train_end", "round": 1}],
    }
    for i, (site, evs) in enumerate(lines.items()):  # file names are safe stems; events name their site
        text = "\n".join(_json.dumps(e | {"site": site}, separators=(",", ":")) for e in evs)
        (tmp_path / f"n{i}.events.jsonl").write_text(text + '\n{"event":"train_st')  # a line being written

    events = {site: EventTail(tmp_path / f"n{i}.events.jsonl").read() for i, site in enumerate(lines)}
    done, trained = round_progress(events, s)

    assert (done, trained) == (1, 1)  # round 1 complete; in round 2 only B has trained


def test_an_event_tail_reads_each_line_once_and_waits_for_a_torn_one(tmp_path: Path) -> None:
    from orchestrator.runtime.compute_port import EventTail

    path = tmp_path / "G.events.jsonl"
    tail = EventTail(path)
    assert tail.read() == []  # no file yet
    path.write_text('{"event":"ready","t":1.0}\n{"event":"round_st')
    assert [e["event"] for e in tail.read()] == ["ready"]
    first = tail.read()[0]
    with path.open("a") as f:
        f.write('art","round":1,"t":2.0}\n')
    got = tail.read()
    assert [e["event"] for e in got] == ["ready", "round_start"]
    assert got[0] is first  # parsed once, kept: the file is not read again from its start
    path.unlink()
    path.write_text('{"event":"ready","t":9.0}\n')  # the role started again: a new file
    assert [e["t"] for e in tail.read()] == [9.0]


def test_a_simulated_run_writes_into_an_out_folder_given_relative_to_where_it_was_started(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import yaml

    from orchestrator.cli import main
    from orchestrator.experiment import simulated

    # Prepare: a simulated run started in tmp_path with `--out runs` (its engines run elsewhere)
    raw = {"name": "relative", "engine": "simulation", "topology": "triangle", "schedulers": ["spff", "mst"],
           "locals": [2], "tasks_per_point": 2, "task": {"rounds": 1},
           "simulation": {"rates": "emulated", "calibration": "a test's: the defaults"}}
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.setattr(simulated, "_model_sizes", lambda cfg, given: (200_000, None))
    monkeypatch.chdir(tmp_path)

    # Execute
    code = main(["experiment", "cfg.yaml", "--out", "runs", "--no-figures", "--no-progress"])

    # Assert: the run completed in tmp_path/runs (before, the engines looked for their spec relative to
    # the project's root and the run failed)
    assert code == 0
    (db_path,) = (tmp_path / "runs").glob("*/results.db")
    with ResultsDB(db_path) as db:
        assert db.run(1)["status"] == "completed"
