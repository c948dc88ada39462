"""The background a scheduler is told (`orchestrator.emulation.background_view`), against a fake
controller whose counters behave like Open vSwitch's: per entry, copied from the datapath in sweeps
every 0.5 s, on a virtual clock that the view's reads and sleeps advance."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controller.flows import BACKGROUND_COOKIE
from orchestrator.emulation.background_view import (
    BackgroundMeasurement,
    BackgroundView,
    ViewSettings,
    link_bytes,
    link_ports,
    settings_for,
)
from orchestrator.emulation.network_port import measured_background
from orchestrator.results.db import ResultsDB
from topologies.loaders import load
from topologies.plan import HOST_PORT, EmulationPlan

Rate = Callable[[float], float]  # emulated Mbit/s at a time


class FakeController:
    """Background and task entries on the links of `plan`, each sending at a rate that may change
    with time; counters swept every `sweep_s`; each read takes `read_s` of virtual time."""

    def __init__(self, plan: EmulationPlan, *, sweep_s: float = 0.5, read_s: float = 0.01) -> None:
        self.plan = plan
        self.t = 0.0
        self.sweep_s = sweep_s
        self.read_s = read_s
        self.pairs: list[list[str]] = [["x", "y"]]
        #: (cookie, site, out port) -> rate of the entry
        self.entries: dict[tuple[int, str, int], Rate] = {}
        self.reads = 0
        self.epoch = 0.0  # the background's entries were (re)installed at this time
        self._swept: dict[tuple[int, float, float], int] = {}

    def send(self, cookie: int, a: str, b: str, rate: Rate) -> None:
        self.entries[(cookie, a, self.plan.port_towards(a, b))] = rate

    def _bytes(self, rate: Rate, until: float) -> int:
        """The entry's bytes at the last sweep before `until` (integrated in 1 ms steps)."""
        swept = math.floor(until / self.sweep_s) * self.sweep_s
        key = (id(rate), self.epoch, swept)
        if key not in self._swept:
            steps = round((swept - self.epoch) / 0.001)
            self._swept[key] = int(sum(rate(self.epoch + (i + 0.5) * 0.001) for i in range(max(0, steps)))
                                   * 0.001 * 1e6 / 8)
        return self._swept[key]

    def _flows(self) -> list[dict[str, Any]]:
        self.t += self.read_s / 2
        rows = [{"site": site, "cookie": cookie, "actions": [{"type": "OUTPUT", "port": port}],
                 "bytes": self._bytes(rate, self.t)} for (cookie, site, port), rate in self.entries.items()]
        self.t += self.read_s / 2
        return rows

    # -- what the view may call ---------------------------------------------------------------------
    def background_flows(self) -> list[dict[str, Any]]:
        self.reads += 1
        return [f for f in self._flows() if f["cookie"] == BACKGROUND_COOKIE]  # the switch selects by cookie

    def background(self) -> dict[str, Any]:
        return {"pairs": self.pairs}

    # -- the clock -------------------------------------------------------------------------------------
    def clock(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


@pytest.fixture
def plan() -> EmulationPlan:
    return EmulationPlan.from_model(load("ring:4"), max_link_mbps=100)


def view_of(fake: FakeController, settings: ViewSettings | None = None, **kw: Any) -> BackgroundView:
    return BackgroundView(fake, fake.plan, settings, clock=fake.clock, sleep=fake.sleep, **kw)


def ring_links(plan: EmulationPlan) -> list[tuple[str, str]]:
    return [(ln.a, ln.b) for ln in plan.links]


def test_a_task_that_just_ended_is_not_counted(plan: EmulationPlan) -> None:
    # Prepare: 30 Mbit/s of background on one link; a task sent 80 Mbit/s on it and on its reverse
    # until t = 1 s (what the port-rate window of the old measurement still held).
    fake = FakeController(plan)
    (a, b), (c, d) = ring_links(plan)[:2]
    fake.send(BACKGROUND_COOKIE, a, b, lambda t: 30.0)
    fake.entries[(BACKGROUND_COOKIE, b, HOST_PORT)] = lambda t: 30.0  # the last hop: to the host
    fake.send(7, a, b, lambda t: 80.0 if t < 1.0 else 0.0)
    fake.send(7, b, a, lambda t: 80.0 if t < 1.0 else 0.0)
    fake.t = 1.0

    # Execute
    m = view_of(fake).for_task(101)

    # Assert: only the background, on its link; nothing on the task's reverse link or elsewhere.
    assert m.settled
    assert m.mbps[(a, b)] * plan.bw_scale == pytest.approx(30.0, rel=0.03)
    assert m.mbps[(b, a)] == 0.0
    assert sum(v for k, v in m.mbps.items() if k != (a, b)) == 0.0
    assert (c, d) in m.mbps and m.mbps[(c, d)] == 0.0


def test_the_first_task_waits_until_the_background_has_settled(plan: EmulationPlan) -> None:
    # Prepare: the generators start at t = 2 s and their TCP ramps up to 60 Mbit/s by t = 3 s.
    fake = FakeController(plan)
    a, b = ring_links(plan)[0]
    fake.send(BACKGROUND_COOKIE, a, b, lambda t: 0.0 if t < 2.0 else min(60.0, 60.0 * (t - 2.0)))

    # Execute
    first = view_of(fake).for_task(101)

    # Assert: the first task sees the steady background, not the ramp nor nothing.
    assert first.settled and first.pieces == 3
    assert first.mbps[(a, b)] * plan.bw_scale == pytest.approx(60.0, rel=0.03)
    assert first.cv <= 0.1
    assert fake.t > 3.0 + first.window_s - 0.5  # its window began once the ramp was over


def test_live_counters_settle_on_a_short_window_after_the_ramp(plan: EmulationPlan) -> None:
    # Prepare: counters exact whenever read (the tc datapath's: a 10 ms "sweep", far below a poll), the background
    # ramping up to 60 Mbit/s between t = 2 and 3 s.
    fake = FakeController(plan, sweep_s=0.01)
    a, b = ring_links(plan)[0]
    fake.send(BACKGROUND_COOKIE, a, b, lambda t: 0.0 if t < 2.0 else min(60.0, 60.0 * (t - 2.0)))
    settings = settings_for("demand-matrix", live=True)

    # Execute
    m = view_of(fake, settings).measure(101)

    # Assert: the short window's pieces, the steady rate and not the ramp, and a window begun once
    # the ramp was over.
    assert (settings.window_s, settings.piece_s) == (0.75, 0.2) and settings.poll_s < settings.piece_s
    assert m.settled and m.pieces >= 3 and m.cv <= 0.1
    assert m.mbps[(a, b)] * plan.bw_scale == pytest.approx(60.0, rel=0.03)
    assert fake.t - m.window_s >= 3.0 - settings.piece_s


def test_every_scheduler_of_a_task_gets_the_same_measurement(plan: EmulationPlan) -> None:
    # Prepare
    fake = FakeController(plan)
    a, b = ring_links(plan)[0]
    level = {"mbps": 40.0}
    fake.send(BACKGROUND_COOKIE, a, b, lambda t: level["mbps"])
    recorded: list[BackgroundMeasurement] = []
    view = view_of(fake, on_measured=recorded.append)

    # Execute: spff, then mst, asks for task 101 (the background changes in between); then task 102.
    spff = measured_background(view, 101)
    reads = fake.reads
    level["mbps"] = 20.0
    fake.t += 5.0
    mst = measured_background(view, 101)
    reads_for_mst = fake.reads - reads
    next_task = measured_background(view, 102)

    # Assert: the same figures for both schedulers of 101, without reading again; 102 measured anew.
    assert mst == spff and reads_for_mst == 0
    assert spff[(a, b)] * plan.bw_scale == pytest.approx(40.0, rel=0.03)
    assert next_task[(a, b)] * plan.bw_scale == pytest.approx(20.0, rel=0.03)
    assert [m.key for m in recorded] == [101, 102]


def test_without_a_key_a_recent_measurement_is_reused(plan: EmulationPlan) -> None:
    fake = FakeController(plan)
    a, b = ring_links(plan)[0]
    fake.send(BACKGROUND_COOKIE, a, b, lambda t: 10.0)
    view = view_of(fake, ViewSettings(max_age_s=10.0))

    first = view.for_task(None)
    fake.t += 5.0
    again = view.for_task(None)
    fake.t += 10.0
    later = view.for_task(None)

    assert again is first and later is not first
    assert later.mbps[(a, b)] * plan.bw_scale == pytest.approx(10.0, rel=0.03)


def test_no_background_pairs_means_nothing_at_once(plan: EmulationPlan) -> None:
    fake = FakeController(plan)
    fake.pairs = []

    m = view_of(fake).for_task(101)

    assert m.settled and m.total_mbps == 0.0 and m.waited_s == 0.0
    assert set(m.mbps) == {(ln.a, ln.b) for ln in plan.links} | {(ln.b, ln.a) for ln in plan.links}
    assert fake.reads == 0


def test_a_background_that_never_settles_times_out_marked_unsettled(plan: EmulationPlan,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    # Prepare: a flow that alternates 2 s on at 100 Mbit/s, 2 s off: no 3-piece window has a CV under 0.1.
    fake = FakeController(plan)
    a, b = ring_links(plan)[0]
    fake.send(BACKGROUND_COOKIE, a, b, lambda t: 100.0 if int(t // 2) % 2 == 0 else 0.0)

    # Execute
    with caplog.at_level(logging.WARNING):
        held = view_of(fake, ViewSettings(timeout_s=12.0)).measure()
    averaged = view_of(fake, settings_for("poisson", mean_on_s=2.0, mean_off_s=2.0)).measure()

    # Assert: held to a CV it never meets (warned); an on/off background averaged over its window.
    assert not held.settled and held.cv > 0.1 and "did not settle" in caplog.text
    assert held.waited_s == pytest.approx(12.0, abs=0.1)
    assert averaged.settled and averaged.window_s >= 16.0
    assert averaged.mbps[(a, b)] * plan.bw_scale == pytest.approx(50.0, rel=0.1)


def test_reinstalled_entries_restart_the_window(plan: EmulationPlan) -> None:
    # Prepare: the background's entries are replaced at t = 1.2 s (a load step): counters restart at 0.
    fake = FakeController(plan)
    a, b = ring_links(plan)[0]
    fake.send(BACKGROUND_COOKIE, a, b, lambda t: 30.0)
    view = view_of(fake)
    real_flows = fake.background_flows

    def flows() -> list[dict[str, Any]]:
        if fake.t >= 1.2 and fake.epoch == 0.0:
            fake.epoch = math.floor(fake.t / fake.sweep_s) * fake.sweep_s
        return real_flows()

    fake.background_flows = flows  # type: ignore[method-assign]

    # Execute
    m = view.measure()

    # Assert: a positive, steady rate: the drop of the counters never reads as a negative rate.
    assert m.settled
    assert m.mbps[(a, b)] * plan.bw_scale == pytest.approx(30.0, rel=0.03)


def test_link_bytes_keeps_the_background_on_links_only(plan: EmulationPlan) -> None:
    a, b = ring_links(plan)[0]
    port = plan.port_towards(a, b)
    flows = [{"site": a, "cookie": BACKGROUND_COOKIE, "actions": [{"type": "OUTPUT", "port": port}], "bytes": 500},
             {"site": a, "cookie": BACKGROUND_COOKIE, "actions": [{"type": "OUTPUT", "port": HOST_PORT}], "bytes": 70},
             {"site": a, "cookie": 9, "actions": [{"type": "OUTPUT", "port": port}], "bytes": 9000}]

    sent = link_bytes(flows, link_ports(plan))

    assert sent[(a, b)] == 500 and sum(sent.values()) == 500


def test_a_measurement_is_recorded_with_its_variation(tmp_path: Path) -> None:
    with ResultsDB(tmp_path / "r.db") as db:
        run = db.start_run("t", {})
        db.record_background_view(run, 101, 3.5, BackgroundMeasurement({("a", "b"): 2.0}, window_s=3.0, pieces=3,
                                                                       cv=0.04, settled=True, waited_s=6.1))
        mark = db.background_view_mark()  # a session starting here counts only what comes after
        db.record_background_view(run, None, 9.0, BackgroundMeasurement({}, window_s=0.0, pieces=0, cv=math.nan,
                                                                        settled=False, waited_s=20.0))
        rows = db.query("SELECT task_id, total_mbps, cv, settled FROM background_views ORDER BY t_s")
        waited = (db.background_view_wait_s(run), db.background_view_wait_s(run, mark), db.background_view_wait_s(run + 1))

    assert rows == [{"task_id": 101, "total_mbps": 2.0, "cv": 0.04, "settled": 1},
                    {"task_id": None, "total_mbps": 0.0, "cv": None, "settled": 0}]
    assert waited == (26.1, 20.0, 0.0)  # all of them, those after the mark, another run's


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="poll_s < piece_s"):
        ViewSettings(window_s=0.5, piece_s=1.0)
