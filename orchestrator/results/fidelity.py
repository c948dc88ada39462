"""The fidelity verdict: per point (scheduler, number of locals), did the rounds measure the emulated
network and the emulated sites' compute, or the host? docs/architecture.md, "Fidelity".

A point is *faithful* when

- **hops**: the median of what the instrument adds to a broadcast hop (a child's receive time
  minus its parent's, less the floor the emulated network allows) is at most (``HOP_FACTOR`` - 1) x
  the median transmission time of one chunk over the edge + ``HOP_SLACK_S``: on a relay chain, whose
  floor is one chunk, a hop of at most 2 chunks + 0.5 ms; on G's edges, whose floor is the whole
  model over a shared link, the same allowance on top of that floor;
- **compute**: its locals' training was modelled (``compute_timing: modeled``) and no node-round's
  real training ran past the modelled time of its site (no overrun);
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
from orchestrator.results.db import ResultsDB

HOP_FACTOR = 2.0
HOP_SLACK_S = 0.5e-3
SATURATED = 0.95
RATE_LOW = 0.8
RATE_HIGH = 1.2


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

    @property
    def faithful(self) -> bool:
        return not self.reasons

    @property
    def word(self) -> str:
        return "faithful" if self.faithful else "NOT faithful"


def _median(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def verdict(scheduler: str, n_locals: int, hops: Sequence[dict[str, Any]], overruns: Sequence[dict[str, Any]],
            trained: int, *, compute_modelled: bool, link_rates: Sequence[dict[str, Any]] = (),
            training_use_max: float | None = None) -> Verdict:
    """The verdict of one point from its hop rows, its overrun rows, its trained node-rounds and its
    saturated links' ``rate_share`` rows."""
    share = _median([r["rate_share"] for r in link_rates])
    hop = _median([h["hop_s"] for h in hops])
    chunk = _median([h["chunk_s"] for h in hops])
    over = _median([h["overhead_s"] for h in hops])
    late = _median([o["real_s"] - o["modelled_s"] for o in overruns])
    reasons = []
    if hop is not None and chunk is not None and over is not None and over > (HOP_FACTOR - 1) * chunk + HOP_SLACK_S:
        reasons.append(f"per-hop time: the instrument adds {over * 1e3:.2f} ms a hop (median) to what the emulated "
                       f"network allows, against {chunk * 1e3:.2f} ms of one chunk on the link (median hop "
                       f"{hop * 1e3:.2f} ms)")
    if share is not None and not RATE_LOW <= share <= RATE_HIGH:
        reasons.append(f"shaped-link rate: saturated links delivered {share:.2f} of their configured rate (median of "
                       f"{len(link_rates)} link-rounds; allowed {RATE_LOW:g} to {RATE_HIGH:g})")
    if not compute_modelled:
        reasons.append("training: measured on this host (compute_timing: measured), not the emulated sites'")
    elif overruns:
        reasons.append(f"training: {len(overruns)} of {trained} node-rounds overran their site's modelled time "
                       f"(median +{(late or 0.0) * 1e3:.1f} ms): the host is too small for what it emulates")
    return Verdict(scheduler=scheduler, n_locals=n_locals, hops=len(hops), hop_median_s=hop, chunk_median_s=chunk,
                   overhead_median_s=over, trained=trained, overruns=len(overruns), overrun_median_s=late,
                   compute_modelled=compute_modelled, reasons=tuple(reasons), link_rounds=len(link_rates),
                   rate_share_median=share, training_use_max=training_use_max)


def run_verdicts(db: ResultsDB, run_id: int, points: Sequence[tuple[str, int]], *,
                 compute_modelled: bool) -> tuple[Verdict, ...]:
    """The verdict of every point of the run (`points`: its (scheduler, locals) pairs)."""
    hops = queries.point_hops(db.conn, run_id)
    overruns = queries.point_overruns(db.conn, run_id)
    rates = queries.point_link_rates(db.conn, run_id)
    trained = {(r["scheduler"], r["n_locals"]): int(r["trained"]) for r in queries.point_trainings(db.conn, run_id)}
    use = {(r["scheduler"], r["n_locals"]): float(r["use"]) for r in queries.point_training_use(db.conn, run_id)}
    return tuple(
        verdict(s, n, [h for h in hops if (h["scheduler"], h["n_locals"]) == (s, n)],
                [o for o in overruns if (o["scheduler"], o["n_locals"]) == (s, n)], trained.get((s, n), 0),
                compute_modelled=compute_modelled,
                link_rates=[r for r in rates if (r["scheduler"], r["n_locals"]) == (s, n)],
                training_use_max=use.get((s, n)))
        for s, n in points)


def saturated_share(busy: Sequence[float]) -> float | None:
    """The share of the host's CPU samples with its cores over `SATURATED` busy (None without samples)."""
    return sum(b >= SATURATED for b in busy) / len(busy) if busy else None
