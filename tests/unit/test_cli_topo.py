"""The `netai` CLI for topologies, schedules and the analytic comparison, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.scheduling import SCHEDULERS


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args], capture_output=True, text=True, timeout=120
    )


def test_schedule_json_has_the_documented_keys() -> None:
    out = run("schedule", "--topology", "sndlib/nobel-us", "--scheduler", "mst", "--locals", "5",
              "--seed", "3", "--json")

    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    for key in ("scheduler", "blocked", "global", "locals", "broadcast_tree", "upload_tree", "paths",
                "aggregation_sites", "reservations", "reserved_mbps_total"):
        assert key in d
    assert d["scheduler"] == "mst" and d["blocked"] is False and len(d["locals"]) == 5
    assert all(len(pair) == 2 for pair in d["broadcast_tree"])
    assert d["reserved_mbps_total"] == sum(r["mbps"] for r in d["reservations"])
    assert d["lower_bound"]["total_s"] > 0


def test_schedule_with_explicit_sites(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["schedule", "--scheduler", "spff", "--global", "Boulder", "--local-sites",
                 "Houston,Seattle", "--json"])

    d = json.loads(capsys.readouterr().out)
    assert code == 0
    assert d["global"] == "Boulder" and d["locals"] == ["Houston", "Seattle"]
    assert d["aggregation_sites"] == ["Boulder"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["schedule", "--topology", "nope", "--locals", "3"], "unknown topology"),
        (["schedule", "--scheduler", "nope", "--locals", "3"], "unknown scheduler"),
        (["schedule", "--locals", "14"], "at most 13 locals"),
        (["schedule", "--global", "Boulder", "--local-sites", "Boulder,Houston"], "also a local site"),
        (["schedule", "--global", "Boulder", "--local-sites", "Atlantis"], "unknown site"),
        (["compare", "--locals", "x..y"], "bad range"),
        (["schedule", "--locals", "three"], "invalid int value"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args: list[str], message: str) -> None:
    out = run(*args)

    assert out.returncode == 2
    assert message in out.stderr
    assert out.stderr.count("\n") == 1
    assert "Traceback" not in out.stderr


def test_bad_files_are_one_line_and_exit_2(tmp_path: Path) -> None:
    malformed = tmp_path / "m.yaml"
    malformed.write_text("sites: [\n")
    disconnected = tmp_path / "d.yaml"
    disconnected.write_text("sites: [{name: A}, {name: B}]\nlinks: []\n")
    no_compute = tmp_path / "c.yaml"
    no_compute.write_text("sites: [{name: A}, {name: B, has_compute: false}]\nlinks: [{a: A, b: B}]\n")

    outs = [
        run("schedule", "--topology", str(malformed), "--locals", "1"),
        run("schedule", "--topology", str(disconnected), "--locals", "1"),
        run("schedule", "--topology", str(no_compute), "--global", "A", "--local-sites", "B"),
    ]

    for out, message in zip(outs, ["malformed file", "disconnected", "no compute"], strict=False):
        assert out.returncode == 2 and message in out.stderr and out.stderr.count("\n") == 1


def test_topo_show_and_compare(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["topo", "show", "sndlib/nobel-us"]) == 0
    text = capsys.readouterr().out
    assert "14 sites" in text and "Palo-Alto" in text

    assert main(["compare", "--locals", "2,8", "--tasks", "5", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {(r["scheduler"], r["locals"]) for r in rows} == {
        (s, n) for s in SCHEDULERS for n in (2, 8)
    }
    by = {(r["scheduler"], r["locals"]): r for r in rows}
    # The paper's Figure 3(b) shape: unicast reserves far more than a tree at 8 locals.
    assert by[("mst", 8)]["reserved_mbps_mean"] < by[("spff", 8)]["reserved_mbps_mean"]


def test_scheduling_benchmark_quick_mode_runs() -> None:
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, str(root / "benchmarks" / "bench_scheduling.py"), "--quick"],
                         capture_output=True, text=True, timeout=300)

    assert out.returncode == 0, out.stderr
    assert "30 tasks on NSFNET" in out.stdout
    assert all(name in out.stdout for name in ("spff", "mst", "steiner", "spt"))


def test_compare_against_the_optimum(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--locals", "3", "--tasks", "2", "--optimum", "--time-limit", "30", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["scheduler"] for r in rows} == set(SCHEDULERS)
    for r in rows:
        admitted = r["tasks"] - r["blocked"]
        assert r["optimum_proven"] == admitted
        # the optimum is never above a scheduler, and the front at the scheduler's own latency
        # lies between the optimum and the scheduler
        assert 1.0 - 1e-9 <= r["front_ratio_mean"] <= r["optimum_ratio_mean"] + 1e-9
        assert r["chain_latency_ms_mean"] > 0

    assert main(["compare", "--locals", "3", "--tasks", "1", "--schedulers", "spff", "--optimum"]) == 0
    text = capsys.readouterr().out
    assert "against the exact optimum" in text and "spff x front" in text
