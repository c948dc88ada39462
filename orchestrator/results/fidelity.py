"""The fidelity verdict: per point (scheduler, number of locals), did the rounds measure the emulated
network and the emulated sites' compute, or the host? docs/fidelity.md, "Fidelity".

A point is *faithful* when

- **hops**: the median of what the instrument adds to a broadcast hop (a child's receive time
  minus its parent's, less the floor the emulated network allows) is at most (``HOP_FACTOR`` - 1) x
  the median transmission time of one chunk over the edge + ``HOP_SLACK_S``: on a relay chain, whose
  floor is one chunk, a hop of at most 2 chunks + 0.5 ms; on G's edges, whose floor is the whole
  model over a shared link, the same allowance on top of that floor;
- **relay chains**: what the instrument adds along each round's deepest broadcast chain, summed, is
  on average at most ``CHAIN_SHARE`` of the round's latency (`orchestrator.results.hop_chains`): a
  deep tree pays each relay's software time at every hop, so hops within their allowance can still
  add a host share to a deep tree's rounds that a shallow tree's do not carry;
- **compute**: its locals' training was modelled (``compute_timing: modeled``) and its node-rounds'
  real training did not run past the modelled time of their sites by more than the figure's noise:
  the most the overruns can have added to the point's rounds (per round its largest overrun, since
  a round waits for one training on its critical path, summed over the rounds) is at most
  ``OVERRUN_SHARE`` of their summed latency. Where that share is not known, any overrun fails;
- **no faster than allowed**: the rounds do not beat their lower bound beyond noise (the upper end of
  the 95 % bootstrap interval of the mean of latency / lower bound stays at or above 1 -
  ``BOUND_SHARE``: a shaper passes at least one frame per link ahead of its rate, which on a round of
  one local at K = 16-32 is 0.2-0.5 % of its latency, and rounds whose training is modelled exactly vary
  too little for their interval to hold it), and the median
  hop is not below its floor by more than ``NEGATIVE_HOP_SHARE`` of one chunk's time: a round or a
  hop faster than the emulated network allows is the instrument distorting time (a shaper's burst
  passing copies unshaped), not a fast system;
- **link rate**: where the task's broadcast saturated a shaped link (`orchestrator.lifecycle.fidelity`,
  ``link_rate_rows``), the median share of the configured rate it delivered while busy with the
  task's copies is within [``RATE_LOW``, ``RATE_HIGH``]: TCP/IP's headers alone cost about 5 %, a
  link or host that cannot carry or drain the copies costs more, and a burst that passes at the
  veth's speed shows as more than 1.
  A point without a saturated link (small models with one copy per link) has no such figure.

The host's CPU (the share of samples with both cores over ``SATURATED`` busy) is reported beside
the verdict: a saturated host is where overruns and slow hops come from, but it is not itself a
distortion when the network path runs before training.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from orchestrator.results import queries
from orchestrator.results.bootstrap import bootstrap_ci
from orchestrator.results.db import ResultsDB
from orchestrator.results.hop_chains import run_chain_shares

HOP_FACTOR = 2.0
HOP_SLACK_S = 0.5e-3
SATURATED = 0.95
RATE_LOW = 0.8
RATE_HIGH = 1.2
#: A median hop this share of one chunk's time below its floor is beyond noise (the emulation's burst
#: passes one frame ahead of the rate: a tenth of a 19 KB copy).
NEGATIVE_HOP_SHARE = 0.1
#: The most the overruns may have added to a point's summed round latency: a quarter of the 4 %
#: half-width of a typical mst / spff interval over 15-30 tasks, so that they cannot move a figure
#: beyond its noise (one overrun of 0.6 ms over 45 rounds of 9.4 ms is 0.15 %; a training slowed past its
#: model in every round is tens of percent).
OVERRUN_SHARE = 0.01
#: The most the instrument may add along a round's deepest broadcast chain, as a share of its
#: latency. Measured on paper.yaml's claim point (docs/fidelity.md, "The verdict"): with paced
#: copies, mst's chains carried 5.4 % at K = 32, where mst / spff was 0.803 against its simulated
#: twin's 0.778 (the configured network's), about the half-width of its interval, and 3.3 % at
#: K = 64, where it was 0.784 against 0.775; unpaced, 20.7 % at K = 16. The upload's chains are
#: not recorded; they carry about as much again.
CHAIN_SHARE = 0.05
#: How far below their lower bound the rounds may be (the upper end of the interval of latency /
#: bound), the other way round from the overruns and by the same share of the figure.
BOUND_SHARE = 0.01


@dataclass(frozen=True)
class Verdict:
    """One point's fidelity figures and verdict (`faithful`, else what `reasons` say)."""

    scheduler: str
    n_locals: int
    hops: int
    hop_median_s: float | None
    chunk_median_s: float | None
    overhead_median_s: float | None
    trained: int
    overruns: int
    overrun_median_s: float | None
    compute_modelled: bool
    reasons: tuple[str, ...]
    #: Saturated link-rounds and the median share of the configured rate they got (None: none).
    link_rounds: int = 0
    rate_share_median: float | None = None
    #: The largest share of its modelled time a node-round's real training used (None: not modelled).
    #: Not part of the verdict (an overrun is), but the margin `time_dilation: auto` asks of a trial.
    training_use_max: float | None = None
    #: The point's rounds: their mean latency over their lower bound, its 95 % interval, how many.
    bound_ratio_mean: float | None = None
    bound_ratio_ci: tuple[float, float] | None = None
    bounded_rounds: int = 0
    #: The most the overruns can have added to the point's summed round latency, as a share of it
    #: (None: not known, and then any overrun fails the point).
    overrun_share: float | None = None
    #: The mean over its rounds of the instrument's time along the deepest broadcast chain, as a share
    #: of the round's latency (None: no hops recorded).
    chain_share: float | None = None

    @property
    def bound_text(self) -> str:
        """``1.23 [1.20, 1.26]`` (latency / lower bound, 95 % interval), or ``-`` without rounds."""
        if self.bound_ratio_mean is None:
            return "-"
        ci = "" if self.bound_ratio_ci is None else f" [{self.bound_ratio_ci[0]:.2f}, {self.bound_ratio_ci[1]:.2f}]"
        return f"{self.bound_ratio_mean:.2f}{ci}"

    @property
    def overrun_text(self) -> str:
        """``1 / 360 (+0.15%)``: overruns over trained node-rounds, and the most they can have added
        to the rounds' latency where known."""
        share = "" if not self.overruns or self.overrun_share is None else f" (+{self.overrun_share:.2%})"
        return f"{self.overruns} / {self.trained}{share}"

    @property
    def tolerated(self) -> str:
        """What a faithful point's verdict allowed: its overruns within `OVERRUN_SHARE` ("" if none)."""
        if not self.faithful or not self.overruns or self.overrun_share is None:
            return ""
        return (f"{self.overruns} of {self.trained} node-rounds overran, adding at most {self.overrun_share:.2%} "
                f"to the rounds' latency (allowed {OVERRUN_SHARE:.0%})")

    @property
    def faithful(self) -> bool:
        return not self.reasons

    @property
    def notes(self) -> list[str]:
        """What the verdict says beside its word: why the point is not faithful, else what it allowed
        (`tolerated`; none when nothing was)."""
        return list(self.reasons) or ([self.tolerated] if self.tolerated else [])

    @property
    def word(self) -> str:
        return "faithful" if self.faithful else "NOT faithful"


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _bound_figures(bound_ratios: Sequence[float]) -> tuple[float | None, tuple[float, float] | None]:
    if not bound_ratios:
        return None, None
    mean = statistics.fmean(bound_ratios)
    return mean, (bootstrap_ci(list(bound_ratios)) if len(bound_ratios) > 1 else None)


def _time_reasons(hop: float | None, chunk: float | None, over: float | None, ratio: float | None,
                  ci: tuple[float, float] | None, rounds: int) -> list[str]:
    """What the per-hop figures and the rounds' latency / bound say against the point."""
    reasons = []
    if hop is not None and chunk is not None and over is not None and over > (HOP_FACTOR - 1) * chunk + HOP_SLACK_S:
        reasons.append(f"per-hop time: the instrument adds {over * 1e3:.2f} ms a hop (median) to what the emulated "
                       f"network allows, against {chunk * 1e3:.2f} ms of one chunk on the link (median hop "
                       f"{hop * 1e3:.2f} ms)")
    if hop is not None and chunk is not None and over is not None and over < -NEGATIVE_HOP_SHARE * chunk:
        reasons.append(f"per-hop time: hops are {-over * 1e3:.2f} ms (median) shorter than the emulated network "
                       f"allows, more than {NEGATIVE_HOP_SHARE:g} of one chunk ({chunk * 1e3:.2f} ms): copies pass "
                       "faster than their links' rate")
    if ratio is not None and ci is not None and ci[1] < 1.0 - BOUND_SHARE:
        reasons.append(f"lower bound: the rounds beat it, latency / bound {ratio:.3f} [{ci[0]:.3f}, {ci[1]:.3f}] "
                       f"over {rounds} rounds (allowed {1 - BOUND_SHARE:g}): the emulated network cannot run them "
                       "that fast")
    return reasons


def verdict(scheduler: str, n_locals: int, hops: Sequence[dict[str, Any]], overruns: Sequence[dict[str, Any]],
            trained: int, *, compute_modelled: bool, link_rates: Sequence[dict[str, Any]] = (),
            training_use_max: float | None = None, bound_ratios: Sequence[float] = (),
            overrun_share: float | None = None, chain_share: float | None = None) -> Verdict:
    """The verdict of one point from its hop rows, its overrun rows, its trained node-rounds, its
    saturated links' ``rate_share`` rows, its rounds' latency over their lower bound, the share of
    their latency the overruns can have added (`overrun_share`; None: any overrun fails) and the
    share the instrument added along their deepest broadcast chains (`chain_share`; None: unknown)."""
    share = _median([r["rate_share"] for r in link_rates])
    hop = _median([h["hop_s"] for h in hops])
    chunk = _median([h["chunk_s"] for h in hops])
    over = _median([h["overhead_s"] for h in hops])
    late = _median([o["real_s"] - o["modelled_s"] for o in overruns])
    ratio, ci = _bound_figures(bound_ratios)
    reasons = _time_reasons(hop, chunk, over, ratio, ci, len(bound_ratios))
    if chain_share is not None and chain_share > CHAIN_SHARE:
        reasons.append(f"relay chains: the instrument adds {chain_share:.1%} of a round's latency (mean) along its "
                       f"deepest broadcast chain (allowed {CHAIN_SHARE:.0%}): what the host adds at each overlay "
                       "hop (the sites' software time; beside background, the gaps between a copy's segments that "
                       "the background takes), paid at every hop of a deep tree")
    if share is not None and not RATE_LOW <= share <= RATE_HIGH:
        why = "more than a link carries: bytes passed ahead of its rate (a shaper's burst)" if share > RATE_HIGH \
            else "a link or host that cannot carry or drain the copies"
        reasons.append(f"shaped-link rate: saturated links delivered {share:.2f} of their configured rate (median of "
                       f"{len(link_rates)} link-rounds; allowed {RATE_LOW:g} to {RATE_HIGH:g}): {why}")
    if not compute_modelled:
        reasons.append("training: measured on this host (compute_timing: measured), not the emulated sites'")
    elif overruns and (overrun_share is None or overrun_share > OVERRUN_SHARE):
        added = "" if overrun_share is None else \
            f", adding up to {overrun_share:.1%} to the rounds' latency (allowed {OVERRUN_SHARE:.0%})"
        reasons.append(f"training: {len(overruns)} of {trained} node-rounds overran their site's modelled time "
                       f"(median +{(late or 0.0) * 1e3:.1f} ms){added}: the host is too small for what it emulates")
    return Verdict(scheduler=scheduler, n_locals=n_locals, hops=len(hops), hop_median_s=hop, chunk_median_s=chunk,
                   overhead_median_s=over, trained=trained, overruns=len(overruns), overrun_median_s=late,
                   compute_modelled=compute_modelled, reasons=tuple(reasons), link_rounds=len(link_rates),
                   rate_share_median=share, training_use_max=training_use_max, bound_ratio_mean=ratio,
                   bound_ratio_ci=ci, bounded_rounds=len(bound_ratios), overrun_share=overrun_share,
                   chain_share=chain_share)


def run_verdicts(db: ResultsDB, run_id: int, points: Sequence[tuple[str, int]], *,
                 compute_modelled: bool) -> tuple[Verdict, ...]:
    """The verdict of every point of the run (`points`: its (scheduler, locals) pairs)."""
    hops = queries.point_hops(db.conn, run_id)
    overruns = queries.point_overruns(db.conn, run_id)
    rates = queries.point_link_rates(db.conn, run_id)
    trained = {(r["scheduler"], r["n_locals"]): int(r["trained"]) for r in queries.point_trainings(db.conn, run_id)}
    use = {(r["scheduler"], r["n_locals"]): float(r["use"]) for r in queries.point_training_use(db.conn, run_id)}
    bounds: dict[tuple[str, int], list[float]] = {}
    for r in queries.point_bound_ratios(db.conn, run_id):
        bounds.setdefault((r["scheduler"], r["n_locals"]), []).append(float(r["ratio"]))
    added = {(r["scheduler"], r["n_locals"]): float(r["delay_s"]) / float(r["latency_s"])
             for r in queries.point_overrun_delays(db.conn, run_id) if r["latency_s"]}
    chains = run_chain_shares(db, run_id)
    return tuple(
        verdict(s, n, [h for h in hops if (h["scheduler"], h["n_locals"]) == (s, n)],
                [o for o in overruns if (o["scheduler"], o["n_locals"]) == (s, n)], trained.get((s, n), 0),
                compute_modelled=compute_modelled,
                link_rates=[r for r in rates if (r["scheduler"], r["n_locals"]) == (s, n)],
                training_use_max=use.get((s, n)), bound_ratios=bounds.get((s, n), ()),
                overrun_share=added.get((s, n)), chain_share=chains.get((s, n)))
        for s, n in points)


def saturated_share(busy: Sequence[float]) -> float | None:
    """The share of the host's CPU samples with its cores over `SATURATED` busy (None without samples)."""
    return sum(b >= SATURATED for b in busy) / len(busy) if busy else None
