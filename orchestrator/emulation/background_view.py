"""What a scheduler is told the background is: the background generators' own traffic per directed
link, measured once it has settled, and the same measurement for every scheduler of a task.

What is counted. The byte counters of the background routes' flow entries (their cookie,
`controller.flows.BACKGROUND_COOKIE`), read from the controller (``GET /flows?kind=background``).
Those entries match only the background host pairs' IPv4 traffic, below every task entry's
priority, so their bytes are the background's and nothing else's: not a running task's, and not
a task's that just ended. An entry on site a's switch whose output is the port towards b counts
what the background sends on the directed link a -> b (its ACKs on the reverse link); entries that
output to a host port are on no link. Two other sources were set aside:

- the switch ports' rates (``GET /stats/ports``): every class together, over a window that still
  holds the traffic of a task that has just ended;
- the links' htb background class (5:2, `controller.shaping`): it is the *default* class, so it
  also gets whatever no task filter claims (a task's traffic wherever its reservation is not
  enforced).

When it is counted. Open vSwitch copies the datapath's counters into the OpenFlow entries in
sweeps about every 0.5 s, so a read carries the bytes up to the last sweep, not up to the read.
The view polls every `ViewSettings.poll_s` and stamps a *boundary* when the total has changed: its
time is halfway between the read that saw the change and the one before it; its bytes are those
of the first later read that shows no further change (a sweep that reaches the switches a few
tens of ms apart counts whole). A rate is the change between two boundaries over their time
apart; its timing error is under one poll interval over the window.

Settled. A measurement covers `ViewSettings.window_s`, in pieces of at least `piece_s` between
boundaries. It is settled when the summed rate over the window is positive and its coefficient of
variation (CV) over the window's pieces *and the piece before it* is at most `max_cv` (so a ramp
that ended within the last piece before the window is not in it); None: no such criterion, as for
an on/off background whose pieces never agree (its settled figure is the mean over a window long
against its periods). Until then the window slides on, one piece at a time, up to `timeout_s`; then
the last window is used, marked unsettled, and a warning logged. With no background pairs on the controller
the background is nothing: zero, at once. If the background's entries are replaced (a load step
reinstalls them and their counters restart from zero) the window starts again.

`BackgroundView` hands measurements out: one per key (the task: every scheduler of that task gets
the very same), or, without a key, the latest one if younger than `max_age_s`. It only reads: it
must not start, stop or change any traffic, nor talk to anything but the controller's client.
"""

from __future__ import annotations

import itertools
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from controller.flows import BACKGROUND_COOKIE
from topologies.plan import EmulationPlan

LOG = logging.getLogger(__name__)

DirectedLink = tuple[str, str]


class BackgroundCounters(Protocol):
    """The part of `orchestrator.emulation.controller_client.ControllerClient` the view reads.

    ``background_flows()`` returns the background routes' entries (dicts with ``site``,
    ``cookie``, ``actions`` and ``bytes``); ``background()`` the controller's background pairs
    (``{"pairs": [[a, b], ...]}``). Either raises when the controller does not answer.
    """

    def background_flows(self) -> list[dict[str, Any]]: ...

    def background(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ViewSettings:
    """How the view measures (see the module docstring); seconds throughout."""

    window_s: float = 3.0
    piece_s: float = 0.9
    max_cv: float | None = 0.1
    timeout_s: float = 20.0
    poll_s: float = 0.05
    max_age_s: float = 10.0
    #: Counters exact whenever read (the tc datapath's, `controller.tc_flows`), not swept by Open
    #: vSwitch: every read is a boundary, and the window and its pieces can be far shorter.
    live: bool = False

    def __post_init__(self) -> None:
        if not 0 < self.poll_s < self.piece_s <= self.window_s <= self.timeout_s:
            raise ValueError(f"need 0 < poll_s < piece_s <= window_s <= timeout_s, got {self}")


#: How often live counters are read: a few times a piece is plenty when every read is exact.
LIVE_POLL_S = 0.05
#: A steady background's window and pieces on live counters. Open vSwitch's sweeps (about 0.5 s
#: apart) set the 3 s window of pieces of about 1 s; counters exact when read need no sweep to
#: pass, so pieces of at least 0.2 s (about 0.25 s at reads 0.05 s apart), three to a window with
#: the one before them, hold the same CV criterion in under a quarter of the wait; shorter pieces
#: (0.125 s) brought a steady background's CV to a median 0.085 of the 0.1 allowed
#: (docs/metrics.md, "The background a scheduler sees").
LIVE_WINDOW_S = 0.75
LIVE_PIECE_S = 0.2


def settings_for(pattern: str, *, mean_on_s: float = 0.0, mean_off_s: float = 0.0, live: bool = False) -> ViewSettings:
    """The view's settings for a background `pattern`: steady flows settle to a CV criterion; an
    on/off (``poisson``) background is averaged over four mean on+off cycles (at least 3 s) and
    never held to a CV, since its pieces differ by design. `live`: the counters are exact when read,
    so a steady background's window is `LIVE_WINDOW_S` in pieces of `LIVE_PIECE_S`."""
    poll_s = LIVE_POLL_S if live else ViewSettings.poll_s
    if pattern != "poisson":
        if live:
            return ViewSettings(window_s=LIVE_WINDOW_S, piece_s=LIVE_PIECE_S, poll_s=poll_s, live=True)
        return ViewSettings(poll_s=poll_s, live=live)
    window = max(3.0, 4.0 * (mean_on_s + mean_off_s))
    return ViewSettings(window_s=window, max_cv=None, timeout_s=window + 10.0, max_age_s=max(10.0, window),
                        poll_s=poll_s, live=live)


@dataclass(frozen=True)
class BackgroundMeasurement:
    """The background per directed link, in the model's Mbit/s, over one window.

    `cv` is the coefficient of variation of the summed rate over the window's pieces (0 when the
    background is off); `settled` whether the settling criterion held before the timeout;
    `waited_s` how long the measurement took; `key` what it was measured for (a task id, or None).
    """

    mbps: dict[DirectedLink, float]
    window_s: float
    pieces: int
    cv: float
    settled: bool
    waited_s: float
    key: int | None = None
    taken_at: float = 0.0

    @property
    def total_mbps(self) -> float:
        return sum(self.mbps.values())


def link_ports(plan: EmulationPlan) -> dict[tuple[str, int], DirectedLink]:
    """(site, output port) -> the directed link that port sends on."""
    out: dict[tuple[str, int], DirectedLink] = {}
    for ln in plan.links:
        out[(ln.a, ln.port_a)] = (ln.a, ln.b)
        out[(ln.b, ln.port_b)] = (ln.b, ln.a)
    return out


def _out_port(actions: Iterable[Mapping[str, Any]]) -> int | None:
    for a in actions:
        if a.get("type", "OUTPUT") == "OUTPUT" and "port" in a:
            return int(a["port"])
    return None


def link_bytes(flows: Iterable[Mapping[str, Any]], ports: Mapping[tuple[str, int], DirectedLink]
               ) -> dict[DirectedLink, int]:
    """Bytes the background's entries sent on each directed link (entries of any other cookie,
    and those towards a host port, are left out)."""
    sent = {link: 0 for link in ports.values()}
    for f in flows:
        if f.get("cookie") != BACKGROUND_COOKIE or f.get("site") is None:
            continue
        link = ports.get((str(f["site"]), _out_port(f.get("actions") or []) or -1))
        if link is not None:
            sent[link] += int(f.get("bytes", 0))
    return sent


@dataclass(frozen=True)
class Boundary:
    """Counters as of one of Open vSwitch's sweeps: when (estimated) and bytes per link."""

    t: float
    sent: dict[DirectedLink, int]

    @property
    def total(self) -> int:
        return sum(self.sent.values())


def window_figures(bounds: list[Boundary], bw_scale: float) -> tuple[dict[DirectedLink, float], float]:
    """Per-link rate (model Mbit/s) from the first to the last boundary, and the CV of the summed
    rate over the pieces between consecutive boundaries (0 if the rate is 0)."""
    first, last = bounds[0], bounds[-1]
    span = last.t - first.t
    if span <= 0:
        return {link: 0.0 for link in last.sent}, 0.0
    mbps = {link: (last.sent[link] - first.sent.get(link, 0)) * 8 / 1e6 / span / bw_scale for link in last.sent}
    rates = [(b.total - a.total) / (b.t - a.t) for a, b in itertools.pairwise(bounds)]
    mean = statistics.fmean(rates)
    cv = statistics.pstdev(rates) / mean if mean > 0 and len(rates) > 1 else 0.0
    return mbps, cv


def window_start(bounds: list[Boundary], s: ViewSettings) -> int | None:
    """The index of the latest boundary that begins a full window ending at the last one (at least
    `window_s` less half a piece before it, for the sweeps' jitter), or None if none does."""
    for i in range(len(bounds) - 2, -1, -1):
        if bounds[-1].t - bounds[i].t >= s.window_s - s.piece_s / 2:
            return i
    return None


@dataclass
class _Reader:
    """Turns polls of the counters into `Boundary` values (see the module docstring)."""

    client: BackgroundCounters
    ports: dict[tuple[str, int], DirectedLink]
    clock: Callable[[], float]
    last_t: float | None = None
    last: dict[DirectedLink, int] | None = None
    changed_t: float | None = None
    reset: bool = False
    live: bool = False

    def poll(self) -> Boundary | None:
        """Read once; a boundary when a sweep has just been seen whole. `reset` is set when the
        counters went back (the entries were reinstalled)."""
        before = self.clock()
        sent = link_bytes(self.client.background_flows(), self.ports)
        t = (before + self.clock()) / 2
        prev, prev_t = self.last, self.last_t
        self.last, self.last_t = sent, t
        if prev is None or prev_t is None:
            return None
        if any(sent[k] < prev.get(k, 0) for k in sent):
            self.reset, self.changed_t = True, None
            return None
        if self.live:  # exact as of the read
            return Boundary(t, sent)
        if sent != prev:
            if self.changed_t is None:
                self.changed_t = (prev_t + t) / 2
            return None
        if self.changed_t is not None:
            bound, self.changed_t = Boundary(self.changed_t, sent), None
            return bound
        return None


class BackgroundView:
    """Measurements of the background (see the module docstring) from `client`.

    Parameters
    ----------
    on_measured
        Called with every new measurement (to record it), not with those handed out again.
    clock, sleep
        Monotonic seconds and a sleep; a test passes a fake pair.
    """

    def __init__(self, client: BackgroundCounters, plan: EmulationPlan, settings: ViewSettings | None = None, *,
                 on_measured: Callable[[BackgroundMeasurement], None] | None = None,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        self.client = client
        self.plan = plan
        self.settings = settings or ViewSettings()
        self.on_measured = on_measured
        self.clock = clock
        self.sleep = sleep
        self.ports = link_ports(plan)
        self.by_key: dict[int, BackgroundMeasurement] = {}
        self.latest: BackgroundMeasurement | None = None

    def for_task(self, key: int | None) -> BackgroundMeasurement:
        """The measurement for `key` (measured the first time it is asked for); without a key the
        latest if younger than `max_age_s`, else a new one."""
        if key is not None and key in self.by_key:
            return self.by_key[key]
        if key is None and self.latest is not None and \
                self.clock() - self.latest.taken_at < self.settings.max_age_s:
            return self.latest
        m = self.measure(key)
        if key is not None:
            self.by_key[key] = m
        self.latest = m
        if self.on_measured is not None:
            self.on_measured(m)
        return m

    def measure(self, key: int | None = None) -> BackgroundMeasurement:
        """One settled measurement (see the module docstring); raises what the client raises."""
        start = self.clock()
        if not self.client.background().get("pairs"):
            return BackgroundMeasurement({link: 0.0 for link in self.ports.values()}, window_s=0.0, pieces=0,
                                         cv=0.0, settled=True, waited_s=0.0, key=key, taken_at=start)
        s = self.settings
        reader = _Reader(self.client, self.ports, self.clock, live=self.settings.live)
        bounds: list[Boundary] = []
        while True:
            bound = reader.poll()
            if reader.reset:
                reader.reset, bounds = False, []
            if bound is not None and (not bounds or bound.t - bounds[-1].t >= s.piece_s):
                bounds.append(bound)
                i = window_start(bounds, s)
                if i is not None and i >= 1:
                    bounds = bounds[i - 1:]  # the window and the piece before it
                    mbps, _ = window_figures(bounds[1:], self.plan.bw_scale)
                    _, cv = window_figures(bounds, self.plan.bw_scale)
                    if sum(mbps.values()) > 0 and (s.max_cv is None or cv <= s.max_cv):
                        return self._done(mbps, bounds[1:], cv, True, start, key)
            if self.clock() - start >= s.timeout_s:
                return self._timed_out(bounds, start, key)
            self.sleep(s.poll_s)

    def _timed_out(self, bounds: list[Boundary], start: float, key: int | None) -> BackgroundMeasurement:
        i = window_start(bounds, self.settings) or 0
        if len(bounds) - i >= 2:
            mbps, cv = window_figures(bounds[i:], self.plan.bw_scale)
        else:  # no sweep moved the counters: the background's flows carry nothing
            mbps, cv, i = {link: 0.0 for link in self.ports.values()}, math.nan, len(bounds)
        m = self._done(mbps, bounds[i:], cv, False, start, key)
        LOG.warning("the background did not settle within %.0f s (summed %.1f Mbit/s over %.1f s, CV %.3f); "
                    "the schedulers get this measurement", self.settings.timeout_s, m.total_mbps, m.window_s, cv)
        return m

    def _done(self, mbps: dict[DirectedLink, float], bounds: list[Boundary], cv: float, settled: bool,
              start: float, key: int | None) -> BackgroundMeasurement:
        now = self.clock()
        window = bounds[-1].t - bounds[0].t if len(bounds) >= 2 else 0.0
        return BackgroundMeasurement(mbps, window_s=window, pieces=max(0, len(bounds) - 1), cv=cv, settled=settled,
                                     waited_s=now - start, key=key, taken_at=now)

