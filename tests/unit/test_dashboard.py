"""The dashboard without an emulation: its frames from a run's database, its HTTP server on loopback,
its Prometheus page, the link-load sampler's arithmetic, and the replay page in headless Chromium."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.dashboard.server import Dashboard
from orchestrator.dashboard.view import RunView, layout
from orchestrator.emulation.link_load import LinkLoadSampler
from orchestrator.errors import ConfigError
from orchestrator.results.db import ResultsDB
from orchestrator.runtime.summaries import node_rounds
from orchestrator.scheduling import NetworkState, get_scheduler
from orchestrator.scheduling.tasks import generate_tasks
from topologies.loaders import load
from topologies.plan import EmulationPlan


def make_run(path: Path) -> dict[str, Any]:
    """A finished run on NSFNET: one mst task with a real schedule, 3 rounds between t=2 and t=5,
    one blocked task, and link samples at t=0..6 where one link carries AI load from t=2 to t=5."""
    model = load("sndlib/nobel-us")
    plan = EmulationPlan.from_model(model, max_link_mbps=100)
    (task, other) = generate_tasks(model, count=2, locals_per_task=4, seed=3, first_id=1)
    sched = get_scheduler("mst").schedule(NetworkState(model), task)
    hop = sched.edges[0].path[:2]
    with ResultsDB(path) as db:
        run_id = db.start_run("dash", {}, {"mode": "sequential", "backend": "loopback", "delay_emulated": False})
        db.record_topology(run_id, model.name, model.to_dict(), plan.to_dict())
        for t in range(7):
            links = []
            for ln in plan.links:
                for a, b in ((ln.a, ln.b), (ln.b, ln.a)):
                    ai = 40.0 if (a, b) == tuple(hop) and 2 <= t <= 5 else 0.0
                    links.append({"a": a, "b": b, "tx_bytes": t * 1000, "rate_mbps": ai + 5.0, "ai_mbps": ai,
                                  "background_mbps": 5.0, "capacity_mbps": ln.emulated_mbps, "up": True})
            db.record_link_stats(run_id, float(t), links)
        db.record_task(run_id, "mst", task)
        db.set_task_state(run_id, "mst", task.id, "pending", at_s=1.0)
        db.record_schedule(run_id, sched, 0.1)
        db.set_task_state(run_id, "mst", task.id, "scheduled", at_s=1.5)
        db.set_task_state(run_id, "mst", task.id, "running", at_s=1.6)
        events = {sched.global_site: [{"event": "round_start", "round": r, "t": 1.0 + r} for r in (1, 2, 3)]
                  + [{"event": "aggregated", "round": r, "t": 1.9 + r} for r in (1, 2, 3)]}
        for r in (1, 2, 3):
            db.record_round(run_id, "mst", task.id, r, latency_s=0.9, broadcast_s=0.3, train_s=0.2, upload_s=0.4,
                            accuracy=0.5 + 0.1 * r, lower_bound_s=0.1)
        db.record_node_rounds(run_id, "mst", task.id, node_rounds(sched, events))
        db.set_task_state(run_id, "mst", task.id, "done", at_s=5.5)
        db.record_task(run_id, "spff", other)
        db.set_task_state(run_id, "spff", other.id, "pending", at_s=3.0)
        db.set_task_state(run_id, "spff", other.id, "blocked", "no wavelength on A-B", at_s=3.0)
        db.finish_run(run_id, "completed")
    return {"task": task, "schedule": sched, "hop": tuple(hop), "model": model}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = tmp_path_factory.mktemp("run") / "results.db"
    return {"path": path, **make_run(path)}


def get(url: str) -> tuple[int, bytes, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status, r.read(), r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("Content-Type", "")


# -- frames ------------------------------------------------------------------------------------------
def test_frames_follow_the_run_clock(run: dict[str, Any]) -> None:
    view = RunView(run["path"])
    a, b = run["hop"]

    def ai(frame: dict[str, Any]) -> float:
        return next(ln["ai_mbps"] for ln in frame["links"] if (ln["a"], ln["b"]) == (a, b))

    before, during, after = view.frame(1.2), view.frame(3.5), view.frame(6.0)

    assert view.time_range() == (0.0, 6.0)
    assert (ai(before), ai(during), ai(after)) == (0.0, 40.0, 0.0)
    assert before["tasks"] == [] and before["counts"] == {"pending": 1}
    (task,) = during["tasks"]
    assert task["key"] == f"mst/{run['task'].id}" and task["state"] == "running"
    assert task["rounds_done"] == 1  # G aggregated round 1 at t=2.9, round 2 at 3.9
    assert task["last_round"]["round"] == 1 and task["last_round"]["broadcast_s"] == 0.3
    assert view.frame(4.0)["tasks"][0]["rounds_done"] == 2
    assert [a, b] in [list(h) for h in task["schedule"]["hops"]["broadcast"] + task["schedule"]["hops"]["upload"]]
    assert during["ended"][0]["reason"] == "no wavelength on A-B" and during["ended"][0]["state"] == "blocked"
    assert after["tasks"] == [] and after["counts"] == {"done": 1, "blocked": 1}


def test_layout_uses_coordinates_when_every_site_has_them() -> None:
    sites = [{"name": "W", "lon": -120.0, "lat": 40.0}, {"name": "E", "lon": -75.0, "lat": 40.0},
             {"name": "S", "lon": -97.0, "lat": 30.0}]
    pos, how = layout(sites, [("W", "E"), ("E", "S")])

    assert how == "coordinates"
    assert pos["W"][0] < pos["S"][0] < pos["E"][0]  # west to east
    assert pos["S"][1] > pos["W"][1]  # south is drawn lower (y grows downwards)
    again, how2 = layout([{"name": n} for n in "abcd"], [("a", "b"), ("b", "c"), ("c", "d")])
    assert how2.startswith("spring") and again == layout([{"name": n} for n in "abcd"],
                                                         [("a", "b"), ("b", "c"), ("c", "d")])[0]


# -- the server ----------------------------------------------------------------------------------------
def test_server_on_loopback_serves_page_data_and_metrics(run: dict[str, Any]) -> None:
    with Dashboard(run["path"], port=0, live=False) as dash:
        host, _port = dash.httpd.server_address[:2]
        status, page, ctype = get(dash.url)
        meta = json.loads(get(dash.url + "api/meta")[1])
        frame = json.loads(get(dash.url + "api/frame?t=3.5")[1])
        bad = get(dash.url + "api/frame?t=soon")
        stream = get(dash.url + "api/stream")
        traversal = get(dash.url + "static/../server.py")
        metrics = get(dash.url + "metrics")[1].decode()
        script = get(dash.url + "static/cytoscape.min.js")
        for t in range(20):
            get(dash.url + f"api/frame?t={t / 4}")
        views = len(dash._idle)

    assert host == "127.0.0.1"
    assert views == 1  # one request at a time: one pooled database view, not one per request
    assert status == 200 and "text/html" in ctype and b"/static/app.js" in page
    assert b"http://" not in page and b"https://" not in page  # nothing loaded from elsewhere
    assert script[0] == 200 and b"cytoscape" in script[1][:2000]
    assert {s["id"] for s in meta["topology"]["sites"]} == set(run["model"].sites)
    assert meta["topology"]["layout"] == "coordinates" and meta["live"] is False
    assert frame["t"] == 3.5 and len(frame["tasks"]) == 1
    assert bad[0] == 400 and b"t must be a number" in bad[1]
    assert stream[0] == 404 and traversal[0] == 404
    a, b = run["hop"]
    assert f'netai_link_ai_mbps{{dst="{b}",src="{a}"}} 0.0' in metrics  # the latest frame (t=6): no AI load
    assert 'netai_tasks{state="blocked"} 1.0' in metrics


def test_a_taken_port_is_a_clear_error_and_nothing_is_left_listening(run: dict[str, Any]) -> None:
    with Dashboard(run["path"], port=0, live=False) as first:
        port = first.httpd.server_address[1]
        with pytest.raises(ConfigError, match=f"port {port} on 127.0.0.1 is in use"):
            Dashboard(run["path"], port=port, live=False)
        assert get(first.url + "api/meta")[0] == 200  # the first one is unharmed
    with socket.socket() as s:  # closed: nothing listens on the port any more (TIME_WAIT aside)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen()


def test_live_stream_pushes_frames(run: dict[str, Any]) -> None:
    with Dashboard(run["path"], port=0, live=True, push_s=0.2) as dash, \
            urllib.request.urlopen(dash.url + "api/stream", timeout=10) as r:
        lines: list[dict[str, Any]] = []
        while len(lines) < 2:
            line = r.readline()
            if line.startswith(b"data: "):
                lines.append(json.loads(line[len(b"data: "):]))

    assert r.headers["Content-Type"] == "text/event-stream"
    assert [f["t"] for f in lines] == [6.0, 6.0]  # the latest recorded time, pushed again and again
    assert dash.pushes >= 2


# -- the sampler ------------------------------------------------------------------------------------
class FakeController:
    def __init__(self, plan: EmulationPlan) -> None:
        self.plan = plan
        self.task_bytes = 0
        self.bg_bytes = 0
        #: When the controller read the counters (its ``read_s``); None: the reply says nothing of it.
        self.read_s: float | None = None

    def link_stats(self, *, read_now: bool = False) -> list[dict[str, Any]]:
        out = []
        for ln in self.plan.links:
            for a, b in ((ln.a, ln.b), (ln.b, ln.a)):
                sent = self.task_bytes + self.bg_bytes if (a, b) == (ln.a, ln.b) else 0
                out.append({"link": [a, b], "tx_bytes": sent, "rate_mbps": 1.0, "emulated_mbps": ln.emulated_mbps,
                            "up": True, "read_s": self.read_s if read_now else None})
        return out

    def flows(self) -> list[dict[str, Any]]:
        ln = self.plan.links[0]
        read = {} if self.read_s is None else {"read_s": self.read_s}
        return [read | f for f in self._flows(ln)]

    def _flows(self, ln: Any) -> list[dict[str, Any]]:
        return [
            {"switch": "s1", "site": ln.a, "task": 7, "cookie": 7, "priority": 200, "kind": "task",
             "match": {"tcp_dst": 1}, "actions": [{"type": "OUTPUT", "port": ln.port_a}], "bytes": self.task_bytes},
            {"switch": "s1", "site": ln.a, "task": None, "cookie": 1 << 63, "priority": 100, "kind": "background",
             "match": {"ipv4_dst": "x"}, "actions": [{"type": "OUTPUT", "port": ln.port_a}], "bytes": self.bg_bytes},
            {"switch": "s1", "site": ln.a, "task": None, "cookie": (1 << 63) + 1, "priority": 10,
             "kind": "best-effort", "match": {"ipv4_dst": "y"},
             "actions": [{"type": "SET_FIELD", "field": "ip_dscp", "value": 1}, {"type": "OUTPUT", "port": ln.port_a}],
             "bytes": 10 * self.bg_bytes},  # in the port's total only
        ]


def test_sampler_splits_ai_and_background_by_counter_growth() -> None:
    plan = EmulationPlan.from_model(load("triangle"), max_link_mbps=100)
    ctl = FakeController(plan)
    now = [0.0]
    sampler = LinkLoadSampler(ctl, plan, clock=lambda: now[0])
    first = sampler.sample()
    ctl.task_bytes, ctl.bg_bytes, now[0] = 2_500_000, 500_000, 2.0  # 20 and 4 Mbit in 2 s
    second = sampler.sample()

    ln = plan.links[0]
    pick = next(r for r in second if (r["a"], r["b"]) == (ln.a, ln.b))
    assert all(r["ai_mbps"] == 0 for r in first)  # nothing to difference against yet
    assert pick["ai_mbps"] == 10.0 and pick["background_mbps"] == 2.0
    assert sum(r["ai_mbps"] for r in second) == 10.0  # only the link the entries output on


def test_sampler_rates_divide_by_the_time_between_the_counters_reads() -> None:
    # Prepare: a background flow holding 100 Mbit/s, read by the controller every second exactly,
    # whose answers reach the sampler 10 ms, 150 ms, then 20 ms after each read (a busy host)
    plan = EmulationPlan.from_model(load("triangle"), max_link_mbps=100)
    ctl = FakeController(plan)
    now = [0.0]
    sampler = LinkLoadSampler(ctl, plan, clock=lambda: now[0])
    ln = plan.links[0]

    # Execute
    rates = []
    for i, late in enumerate((0.010, 0.150, 0.020)):
        ctl.read_s, ctl.bg_bytes, now[0] = 50.0 + i, i * 12_500_000, 1000.0 + i + late
        rows = sampler.sample()
        rates.append(next(r["background_mbps"] for r in rows if (r["a"], r["b"]) == (ln.a, ln.b)))

    # Assert: 100 Mbit/s each time (over the answers' arrivals, 1.14 s then 0.87 s apart, it would
    # read 87.7 then 114.9), and so for what the port sent, read with them
    assert rates == [0.0, 100.0, 100.0]
    assert next(r["rate_mbps"] for r in rows if (r["a"], r["b"]) == (ln.a, ln.b)) == 100.0


def test_sampler_falls_back_to_its_own_clock_where_no_read_time_is_given() -> None:
    plan = EmulationPlan.from_model(load("triangle"), max_link_mbps=100)
    ctl = FakeController(plan)
    now = [0.0]
    sampler = LinkLoadSampler(ctl, plan, clock=lambda: now[0])
    ctl.read_s = 7.0
    sampler.sample()
    ctl.read_s, ctl.bg_bytes, now[0] = None, 2_500_000, 2.0  # 20 Mbit in the sampler's 2 s
    ln = plan.links[0]
    assert next(r["background_mbps"] for r in sampler.sample() if (r["a"], r["b"]) == (ln.a, ln.b)) == 10.0


# -- the replay page in a real browser ---------------------------------------------------------------------
@contextlib.contextmanager
def chromium_driver() -> Iterator[Any]:
    """A headless chromium under chromedriver, quit on exit. Chromium keeps its singleton socket in a
    folder it makes under ``TMPDIR`` and leaves behind: here that is a short folder of the browser's own
    (a UNIX socket's path has at most 108 characters, more than a test's ``tmp_path`` leaves), removed
    once the browser has quit."""
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("Debian's chromium and chromium-driver are not installed (make setup installs them)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--window-size=1400,900",
                "--disable-dev-shm-usage", "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=127.0.0.1"):
        opts.add_argument(arg)
    folder = tempfile.mkdtemp(prefix="netai-chromium-")
    try:
        browser = webdriver.Chrome(options=opts, service=Service(driver, env={**os.environ, "TMPDIR": folder}))
        try:
            yield browser
        finally:
            browser.quit()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def drawn_width(browser: Any, a: str, b: str) -> float:
    return float(browser.execute_script(
        "const e = netai.cy.getElementById('L\\u0000' + arguments[0] + '\\u0000' + arguments[1]);"
        "return parseFloat(e.renderedStyle('width'));", a, b))


@pytest.mark.slow
def test_replay_in_chromium_the_slider_changes_the_drawn_load(run: dict[str, Any], tmp_path: Path) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    a, b = run["hop"]
    temp = Path(tempfile.gettempdir())
    folders_before = set(temp.glob("netai-chromium-*"))
    with chromium_driver() as browser:
        (own,) = set(temp.glob("netai-chromium-*")) - folders_before
        singletons = list(own.glob("org.chromium.Chromium.*"))  # chromium's, under the browser's own folder
        with Dashboard(run["path"], port=0, live=False) as dash:
            browser.get(dash.url)
            WebDriverWait(browser, 20).until(lambda d: d.execute_script("return netai.frames > 0"))
            sites = browser.execute_script("return netai.cy.nodes().map(n => n.id())")
            assert browser.find_element("id", "slider").is_displayed()
            at_end = drawn_width(browser, a, b)

            def slide(t: float) -> None:
                browser.execute_script(
                    "const s = document.getElementById('slider'); s.value = arguments[0];"
                    "s.dispatchEvent(new Event('input'));", t)
                WebDriverWait(browser, 20).until(lambda d: d.execute_script("return netai.frame.t") == t)

            slide(3.5)
            during = drawn_width(browser, a, b)
            trees = browser.execute_script("return netai.cy.edges('.tree').length")
            rows = browser.execute_script("return document.querySelectorAll('#tasks tbody tr').length")
            browser.save_screenshot(str(tmp_path / "replay.png"))
            slide(1.0)
            before = drawn_width(browser, a, b)

    assert singletons and not own.exists()  # removed with the browser: no folder of chromium's is left
    assert set(sites) == set(run["model"].sites)
    assert during > at_end and during > before  # 45 of 100 Mbit/s drawn wider than 5
    assert at_end == pytest.approx(before)
    assert trees >= len(run["task"].local_sites) and rows == 1
    assert (tmp_path / "replay.png").stat().st_size > 10_000


class InstalledController:
    """Two tasks installed at the controller: one the run records (its paths outlive its end), one not."""

    def __init__(self, recorded: int) -> None:
        self.ids = [recorded, 99]

    def tasks(self) -> list[dict[str, Any]]:
        return [{"task_id": i, "label": "by hand", "reserved_mbps": 1.0} for i in self.ids]

    def task(self, task_id: int) -> dict[str, Any]:
        return {"paths": [{"sites": ["Seattle", "Palo-Alto", "San-Diego"], "kind": "broadcast"},
                          {"sites": ["San-Diego", "Palo-Alto"], "kind": "upload"}]}


def test_live_frames_add_tasks_installed_elsewhere_once(run: dict[str, Any]) -> None:
    with Dashboard(run["path"], port=0, live=True, controller=InstalledController(run["task"].id),
                   show_installed=True) as dash:
        frame = json.loads(get(dash.url + "api/frame")[1])
        replayed = json.loads(get(dash.url + "api/frame?t=3.5")[1])

    (installed,) = [t for t in frame["tasks"] if t["state"] == "installed"]
    assert installed["key"] == "installed/99"  # the recorded task is not shown a second time
    assert installed["schedule"]["hops"] == {"broadcast": [["Palo-Alto", "San-Diego"], ["Seattle", "Palo-Alto"]],
                                             "upload": [["San-Diego", "Palo-Alto"]]}
    assert all(t["state"] != "installed" for t in replayed["tasks"])  # the past is the database's only


def test_a_database_of_the_first_schema_replays_without_link_load(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "old.db"
    make_run(path)
    with sqlite3.connect(path) as conn:  # as a run of schema 1 left it: link_stats with `ts`, no events
        conn.executescript("DROP TABLE link_stats; DROP TABLE task_events; DROP TABLE node_rounds;"
                           "CREATE TABLE link_stats (run_id INTEGER, ts REAL, a TEXT, b TEXT, tx_bytes INTEGER,"
                           " rate_mbps REAL);")
    view = RunView(path)

    frame = view.frame(3.0)

    assert view.meta()["topology"]["sites"] and view.time_range() == (0.0, 0.0)
    assert frame["links"] == [] and frame["tasks"] == [] and frame["counts"] == {}
