"""The run folder's figures and the self-contained report.html, from a made-up database (no emulation)."""

from __future__ import annotations

import base64
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from orchestrator.results import figures as figures_module
from orchestrator.results.db import ResultsDB
from orchestrator.results.figures import blocking_over_time, busiest_links, down_intervals
from orchestrator.results.report import write_report
from orchestrator.results.report_html import markdown_to_html
from orchestrator.results.summary_figures import draw_figures
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.tasks import generate_tasks
from topologies.loaders import load

ROUNDS = 2
#: Directed links and their made-up utilisation (rate / capacity); the six busiest are drawn.
LINK_UTILISATION = {("A", "B"): 0.9, ("B", "A"): 0.1, ("B", "C"): 0.7, ("C", "B"): 0.65, ("C", "D"): 0.5,
                    ("D", "C"): 0.05, ("D", "E"): 0.4, ("E", "D"): 0.3}
SEQUENTIAL_FIGURES = ("latency_vs_locals", "bandwidth_vs_locals", "latency_cdf", "bandwidth_latency",
                      "round_timeline", "link_utilisation")


def node_rows(global_site: str, local_sites: list[str], relay: str, base_s: float) -> list[dict[str, Any]]:
    """Per round: G starts at `start` and aggregates at +4 s; each local receives at +0.5, trains
    from +0.6 to +2 and sends at +3; the relay receives at +0.3 and sends at +3.5."""
    rows = []
    for r in range(1, ROUNDS + 1):
        start = base_s + 5.0 * r
        rows.append({"round": r, "site": global_site, "role": "global", "received_s": start, "sent_s": start + 4})
        rows += [{"round": r, "site": s, "role": "local", "received_s": start + 0.5, "train_start_s": start + 0.6,
                  "train_end_s": start + 2.0, "sent_s": start + 3.0} for s in local_sites]
        rows.append({"round": r, "site": relay, "role": "relay", "received_s": start + 0.3, "sent_s": start + 3.5})
    return rows


def fill(db: ResultsDB, *, mode: str = "sequential", detail: bool = True) -> int:
    """A run with real schedules, made-up rounds, and (with `detail`) per-node round times of every
    task and link samples; in the online mode, every third task blocked and a sample at each arrival."""
    model = load("sndlib/nobel-us")
    run_id = db.start_run("t", {}, {"mode": mode, "delay_emulated": False})
    clock = 0.0
    for scheduler in ("spff", "mst"):
        state = NetworkState(model)
        sched = get_scheduler(scheduler)
        for n in (2, 8):
            for k, task in enumerate(generate_tasks(model, count=3, locals_per_task=n, seed=n, first_id=10 * n)):
                clock += 20.0
                db.record_task(run_id, scheduler, task)
                db.set_task_times(run_id, scheduler, task.id, arrival_s=clock)
                db.set_task_state(run_id, scheduler, task.id, "pending", at_s=clock)
                if mode == "online":
                    db.record_sample(run_id, scheduler, clock + 1, running=k, reserved_mbps=1000.0 * k,
                                     carried_mbps=500.0 * k, memory_used_bytes=10**9, sites={})
                if mode == "online" and k == 2:
                    db.set_task_state(run_id, scheduler, task.id, "blocked", "no wavelength", at_s=clock + 0.1)
                    continue
                s = sched.schedule(state, task)
                state.admit(s)
                db.record_schedule(run_id, s, lower_bound_s=0.01 * n)
                db.set_task_state(run_id, scheduler, task.id, "running", at_s=clock + 0.2)
                for r in range(1, ROUNDS + 1):
                    lat = 0.02 * n + 0.001 * r + (0.005 if scheduler == "spff" else 0.0) + 0.0003 * task.id
                    db.record_round(run_id, scheduler, task.id, r, latency_s=lat, broadcast_s=lat / 3,
                                    train_s=lat / 3, upload_s=lat / 3, accuracy=0.5, lower_bound_s=0.01 * n)
                if detail:
                    relay = next(x for x in model.sites if x != task.global_site and x not in task.local_sites)
                    db.record_node_rounds(run_id, scheduler, task.id,
                                          node_rows(task.global_site, list(task.local_sites), relay, clock))
                db.set_task_state(run_id, scheduler, task.id, "done", at_s=clock + 15)
    if detail:
        for i in range(5):
            db.record_link_stats(run_id, float(i), [
                {"a": a, "b": b, "tx_bytes": 1000 * i, "rate_mbps": u * 100.0, "ai_mbps": u * 60.0,
                 "background_mbps": u * 40.0, "capacity_mbps": 100.0, "up": not (a == "A" and i == 3)}
                for (a, b), u in LINK_UTILISATION.items()])
    db.finish_run(run_id, "completed")
    return run_id


class PageParser(HTMLParser):
    """Collects every src and href, the tags seen, and whether every element that was opened was closed."""

    VOID = frozenset({"meta", "img", "br", "hr", "link", "input"})

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []  # (tag, attribute, value)
        self.tags: list[str] = []
        self.stack: list[str] = []
        self.errors: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.refs += [(tag, k, v or "") for k, v in attrs if k in ("src", "href")]
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:] or 'nothing'}")
        else:
            self.stack.pop()


def parse(page: str) -> PageParser:
    p = PageParser()
    p.feed(page)
    p.close()
    return p


def test_every_figure_is_drawn_as_png_and_svg_and_listed(tmp_path: Path) -> None:
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db)

    figs = {f.name: f for f in draw_figures(db, run_id, tmp_path)}

    assert [n for n, f in figs.items() if f.ok] == list(SEQUENTIAL_FIGURES)
    for name in SEQUENTIAL_FIGURES:
        assert figs[name].files == (tmp_path / f"{name}.png", tmp_path / f"{name}.svg")
        assert (tmp_path / f"{name}.png").read_bytes().startswith(b"\x89PNG")
        assert (tmp_path / f"{name}.svg").read_text().lstrip().startswith("<?xml")
    assert figs["online_load"].skipped == "not an online run (tasks did not arrive over time)"
    assert "online_bandwidth" not in figs  # drawn in the online mode only
    assert not (tmp_path / "online_load.png").exists()


def test_timeline_shows_the_first_done_mst_task_with_the_most_locals(tmp_path: Path) -> None:
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db)
    first_mst_8 = db.query("SELECT task_id FROM tasks WHERE run_id = ? AND scheduler = 'mst' AND n_locals = 8 "
                           "ORDER BY arrival_s LIMIT 1", (run_id,))[0]["task_id"]

    fig = figures_module.round_timeline(db, run_id, tmp_path)

    assert fig.drawn["task"]["scheduler"] == "mst"
    assert fig.drawn["task"]["task_id"] == first_mst_8
    assert fig.drawn["task"]["n_locals"] == 8
    # per round: 8 locals + 1 relay receive and send, the 8 locals train, G spans the round
    assert fig.drawn["bars"] == {"broadcast": ROUNDS * 9, "training": ROUNDS * 8, "upload": ROUNDS * 9,
                                 "round": ROUNDS}
    assert len(fig.drawn["sites"]) == 1 + 8 + 1
    assert f"task {first_mst_8}" in fig.caption


def test_timeline_leaves_out_bars_with_a_missing_or_reversed_end(tmp_path: Path) -> None:
    rows = node_rows("G", ["L1", "L2"], "R", 0.0)
    rows[1]["train_end_s"] = None  # L1, round 1: no training end, so no training and no upload bar
    rows[2]["received_s"] = rows[0]["received_s"] - 1  # L2, round 1: arrived before the round began

    sites, bars = figures_module.timeline_bars(rows)

    assert sites == ["G", "L1", "L2", "R"]
    assert {p: len(v) for p, v in bars.items()} == {"broadcast": 2 * 3 - 1, "training": 2 * 2 - 1,
                                                     "upload": 2 * 3 - 1, "round": 2}


def test_busiest_links_and_latency_points_come_from_the_rows(tmp_path: Path) -> None:
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db)

    links = figures_module.link_utilisation(db, run_id, tmp_path)
    cdf = figures_module.latency_cdf(db, run_id, tmp_path)
    trade = figures_module.bandwidth_latency(db, run_id, tmp_path)

    expected = sorted(LINK_UTILISATION.items(), key=lambda kv: -kv[1])[:6]
    assert [(a, b) for a, b, _ in links.drawn["links"]] == [ab for ab, _ in expected]
    assert [u for _, _, u in links.drawn["links"]] == pytest.approx([u for _, u in expected])
    assert set(links.drawn["samples"].values()) == {5}
    for sched in ("mst", "spff"):
        rows = db.query("SELECT latency_s FROM rounds WHERE run_id = ? AND scheduler = ?", (run_id, sched))
        assert cdf.drawn[sched] == sorted(r["latency_s"] for r in rows)
        reserved = {r["task_id"]: r["reserved_mbps"] for r in db.query(
            "SELECT task_id, reserved_mbps FROM schedules WHERE run_id = ? AND scheduler = ?", (run_id, sched))}
        assert {p[0]: p[2] for p in trade.drawn[sched]} == reserved
        for task_id, _, _, latency_s in trade.drawn[sched]:
            lat = [r["latency_s"] for r in db.query("SELECT latency_s FROM rounds WHERE run_id = ? AND "
                                                    "scheduler = ? AND task_id = ?", (run_id, sched, task_id))]
            assert latency_s == pytest.approx(sum(lat) / len(lat))
    assert busiest_links([{"a": "x", "b": "y", "rate_mbps": 5.0, "capacity_mbps": 0.0}], 6) == []


def test_down_intervals_run_from_the_first_down_sample_to_the_next_up_one() -> None:
    ups = [(0.0, 1), (1.0, 0), (2.0, 0), (3.0, 1), (4.0, 0), (5.0, 0)]

    assert down_intervals([{"t_s": t, "up": u} for t, u in ups]) == [(1.0, 3.0), (4.0, 5.0)]


def test_absent_data_skips_figures_with_a_reason_in_the_report(tmp_path: Path) -> None:
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db, detail=False)

    report = write_report(db, run_id, tmp_path).read_text()
    page = (tmp_path / "report.html").read_text()

    assert "- `round_timeline`: no per-node round times (node_rounds is empty)" in report
    assert "- `link_utilisation`: no link samples (link_stats is empty)" in report
    assert "- `online_load`: not an online run (tasks did not arrive over time)" in report
    for name in ("round_timeline", "link_utilisation", "online_load"):
        assert not (tmp_path / f"{name}.png").exists() and not (tmp_path / f"{name}.svg").exists()
        assert f"<code>{name}</code>: " in page
    assert "latency_cdf.svg" in report


def test_a_figure_that_fails_is_reported_not_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db, detail=False)

    def broken(db: ResultsDB, run_id: int, out_dir: Path) -> figures_module.Figure:
        raise ValueError("bad data")

    monkeypatch.setattr(figures_module, "FIGURES", (broken, figures_module.latency_cdf))
    figs = figures_module.draw_all(db, run_id, tmp_path)

    assert [(f.name, f.ok, f.skipped) for f in figs] == [("broken", False, "drawing failed: ValueError: bad data"),
                                                         ("latency_cdf", True, "")]


def test_online_figures_blocking_ratio_and_load(tmp_path: Path) -> None:
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db, mode="online")

    figs = {f.name: f for f in draw_figures(db, run_id, tmp_path)}

    assert figs["online_load"].ok and figs["online_bandwidth"].ok
    for name in ("online_load", "online_bandwidth"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000
        assert (tmp_path / f"{name}.svg").read_text().lstrip().startswith("<?xml")
    names = list(figs)
    assert names.index("online_bandwidth") == names.index("online_load") - 1
    mst = figs["online_load"].drawn["mst"]
    # per number of locals: two tasks arrive and run, the third arrives and is blocked
    assert [round(r, 3) for _, r in mst["blocking"]] == [0, 0, 0, 0.333, 0.25, 0.2, 0.167, 0.333]
    assert [n for _, n in mst["running"]] == [0, 1, 2, 0, 1, 2]
    assert mst["blocking"][0][0] == 0.0  # seconds since the scheduler's first event
    assert mst["running"][0][0] == pytest.approx(1.0)


def test_blocking_over_time_counts_each_task_once() -> None:
    events = [{"task_id": 1, "t_s": 0.0, "state": "pending"}, {"task_id": 1, "t_s": 0.1, "state": "running"},
              {"task_id": 2, "t_s": 1.0, "state": "pending"}, {"task_id": 2, "t_s": 1.1, "state": "blocked"}]

    assert blocking_over_time(events) == [(0.0, 0.0), (1.0, 0.0), (1.1, 0.5)]


def test_report_html_embeds_every_figure_and_references_nothing_outside(tmp_path: Path) -> None:
    db = ResultsDB(tmp_path / "results.db")
    run_id = fill(db, mode="online")
    db.update_environment(run_id, note='<script>alert(1)</script> see https://example.org & "more"')

    md = write_report(db, run_id, tmp_path).read_text()
    page = (tmp_path / "report.html").read_text()
    parsed = parse(page)

    drawn = re.findall(r"^!\[[^\]]*\]\(([^)]+)\)$", md, flags=re.M)
    assert {Path(d).stem for d in drawn} == set(SEQUENTIAL_FIGURES) | {"online_load", "online_bandwidth"}
    images = [v for tag, k, v in parsed.refs if tag == "img" and k == "src"]
    assert len(images) == len(drawn)
    for src, name in zip(images, drawn, strict=True):
        assert src.startswith("data:image/svg+xml;base64,")
        assert base64.b64decode(src.split(",", 1)[1]) == (tmp_path / name).read_bytes()
    for _, _, value in parsed.refs:
        assert not value.lstrip().lower().startswith(("http://", "https://", "//"))
    assert "script" not in parsed.tags and "link" not in parsed.tags
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert parsed.errors == [] and parsed.stack == []
    assert parsed.tags.count("table") == len(re.findall(r"^\| --- ", md, flags=re.M))
    assert "<h1>Run 1: t</h1>" in page and "<title>Run 1: t</title>" in page
    assert "<style>" in page


def test_large_svg_is_embedded_as_its_png(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "f.svg").write_text("<?xml version='1.0'?><svg xmlns='http://www.w3.org/2000/svg'/>")
    (tmp_path / "f.png").write_bytes(b"\x89PNG fake")
    monkeypatch.setattr("orchestrator.results.report_html.SVG_EMBED_MAX_BYTES", 10)

    page = markdown_to_html("# R\n\n![f](f.svg)\n\n![g](https://example.org/g.png)\n\n[x](//evil/x)",
                            base_dir=tmp_path)
    parsed = parse(page)

    assert [v for _, _, v in parsed.refs] == ["data:image/png;base64," + base64.b64encode(b"\x89PNG fake").decode()]
    assert "figure not found" in page and "x (//evil/x)" in page
