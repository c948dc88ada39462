"""Time dilation chosen by a calibration before the run (``emulation.time_dilation: auto``).

The host decides how much dilation a run needs: how much of a hop its software adds, how far its
cores fall behind the sites' modelled training. So the run measures it on itself, before it starts:
a *trial* at a dilation K is a short run of the config's own workload (`calibration_config`: one task
of its largest number of locals, where the most locals train at once and the trees are deepest, for
`CALIBRATION_ROUNDS` rounds, under every scheduler of the run, on the run's topology, plan, backend
and background), judged by the same verdict rules as the report (`orchestrator.results.fidelity`),
plus a margin: no node-round's real training may use more than `TRIAL_TRAINING_USE` of its modelled
time, since a short trial's few rounds vary less than the run's.

`search` tries K = 1, 2, 4, ... up to the cap (`ladder`) and takes the first faithful one; where a
trial's compute bound rules out the next K, it tries that bound rounded up to a quarter octave
(`step_up`: ..., 32, 40, 48, 56, 64, ...) instead of the next power of two above it, and where a
trial failed only on its relay chains (and training), the K at which their share would meet the
margin, rounded up the same way, if that is below the next power of two. Doubling
is cheap because a trial's wall time grows with K: the whole calibration costs about twice the
chosen K's trial plus one emulation bring-up per K tried (and at most one trial more, the chains'
guess: one per search). When no K up to the cap is faithful the
run goes on at the cap, the most faithful K allowed (the instrument's share of a hop and the
overruns shrink as K grows), and its verdict says what is still violated: a researcher gets figures
with their limits named rather than nothing after paying for the calibration.

This module chooses K and says so; it does not run the emulation (the runner's trial does) and
records nothing itself (the runner puts `Calibration.to_dict` in the run's environment).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from orchestrator.experiment.config import ExperimentConfig
from orchestrator.experiment.faults import RescheduleConfig

#: Rounds of a trial's task: enough for medians of hops and overruns, few enough to be cheap.
CALIBRATION_ROUNDS = 3
#: The most of its modelled time a trial's training may use. A trial is short, and the run's own
#: rounds vary more than its few: measured, a trial with no overrun at K = 16 was followed by runs
#: with 1-13 overruns of 48. So a trial passes only with this margin below its sites' modelled time.
TRIAL_TRAINING_USE = 0.8
#: The same margin on the relay chains and the shaped links' rate: a trial's deepest chains may
#: carry at most this share of `fidelity.CHAIN_SHARE`, and its saturated links must deliver at least
#: `TRIAL_RATE_LOW` of their rate. Measured on paper.yaml's sweep (docs/fidelity.md, "Choosing K"):
#: the 13-locals trial at K = 40 carried 3.6-4.4 % and its run of 30 tasks 6.1-7.6 %; the 1-local
#: trial at K = 3 passed, and its run's links delivered 0.79.
TRIAL_CHAIN_USE = 0.8
TRIAL_RATE_LOW = 0.85
#: How the verdict's reasons that fall as K grows begin (`orchestrator.results.fidelity.verdict`):
#: a training's overrun and the relay chains' share. A trial that failed on these alone has a K to
#: aim for (`Trial.compute_bound`, `Trial.chain_bound`); any other reason (a slow hop, a link's rate,
#: a failed task) has none, and the ladder goes on.
SCALING_REASONS = ("training:", "relay chains:")


@dataclass(frozen=True)
class Trial:
    """One K tried: whether every point of the trial was faithful, and if not, why."""

    k: float
    faithful: bool
    #: What was violated, each prefixed by its point ("mst at 8 locals: ...").
    reasons: tuple[str, ...]
    #: The trial's wall time, bring-up included, seconds.
    wall_s: float
    #: The trial's emulated time after bring-up (its run clock's end), seconds; None when not recorded.
    emulated_s: float | None = None
    #: The share of the host's CPU samples with both cores saturated during the trial.
    host_saturated: float | None = None
    #: The most of its modelled time any training of the trial used (None: none recorded).
    training_use: float | None = None
    #: The largest share of a round its relay chains carried, over its points (None: none recorded).
    chain_share: float | None = None
    #: Whether everything the trial failed on falls as K grows in a known way (`SCALING_REASONS`:
    #: training and relay chains, each about as 1 / K); False if anything else failed too.
    scaling: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "faithful": self.faithful, "reasons": list(self.reasons), "wall_s": round(self.wall_s, 3),
                "emulated_s": self.emulated_s, "host_saturated": self.host_saturated,
                "training_use": self.training_use, "chain_share": self.chain_share, "scaling": self.scaling}

    def compute_bound(self) -> float:
        """The smallest K at which the trial's trainings could stay within their modelled time: a
        training's wall time does not grow with K (it shrinks, as the relays' work spreads over more
        wall time) while its modelled time grows as K, so its use falls at least as 1 / K and is
        above 1 at every K below ``K x use`` (K itself when nothing overran). The margin
        (`TRIAL_TRAINING_USE`) is the trial's at the K tried, not the skip's: measured on small.yaml,
        the trainings used 6.6 times their modelled time at K = 1 and 0.53-0.61 of it at K = 8, not
        the 0.82 that 1 / K gives (docs/fidelity.md, "Choosing K")."""
        use = self.training_use or 0.0
        return self.k * use if use > 1.0 else self.k

    def chain_bound(self) -> float:
        """The K at which the trial's relay chains would carry the trial's margin (`TRIAL_CHAIN_USE`
        of `fidelity.CHAIN_SHARE`): what the host adds at a hop stays about what it is in wall time
        while a round's emulated latency is fixed, so the share falls about as 1 / K (K itself when the
        chains were within the margin). An estimate, not a bound: a trial's three rounds are noisy
        (mst's at paper.yaml's 8 locals: 4.2 % at K = 32, 2.8 % at K = 64), so it only chooses the next K to try."""
        from orchestrator.results.fidelity import CHAIN_SHARE

        share, limit = self.chain_share or 0.0, TRIAL_CHAIN_USE * CHAIN_SHARE
        return self.k * share / limit if share > limit else self.k


@dataclass(frozen=True)
class Calibration:
    """The K chosen and the trials that chose it."""

    k: float
    #: Whether the calibration found K faithful (False: no K up to `cap` was, the run uses the cap).
    faithful: bool
    cap: float
    trials: tuple[Trial, ...]
    #: When this host chose K for the same workload, if K was reused without trials (`k_store`).
    reused_from: str = ""
    #: The K the trials started from (`search`'s `floor`: the K of a point of the run with fewer
    #: locals), and that point's number of locals (0: they started at K = 1).
    floor: float = 1.0
    floor_locals: int = 0

    @property
    def wall_s(self) -> float:
        """What the calibration cost in wall time (every trial, bring-ups included), seconds."""
        return sum(t.wall_s for t in self.trials)

    def to_dict(self) -> dict[str, Any]:
        return {"k": self.k, "faithful": self.faithful, "cap": self.cap, "wall_s": round(self.wall_s, 3),
                "trials": [t.to_dict() for t in self.trials]} | ({"reused_from": self.reused_from} if self.reused_from else {}) \
            | ({"floor": self.floor, "floor_locals": self.floor_locals} if self.floor_locals else {})


def ladder(cap: float) -> tuple[float, ...]:
    """The dilations a calibration tries: 1, 2, 4, ... below `cap`, then `cap`.

    Raises
    ------
    ValueError
        `cap` below 1.
    """
    if cap < 1:
        raise ValueError(f"the calibration's cap must be >= 1, got {cap}")
    ks, k = [], 1.0
    while k < cap:
        ks.append(k)
        k *= 2
    return (*ks, float(cap))


def step_up(k: float) -> float:
    """`k` rounded up to a quarter octave (1, 2, ..., 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, ...):
    at most a quarter above `k`."""
    if k <= 1:
        return 1.0
    octave = 2.0 ** math.floor(math.log2(k))
    step = max(1.0, octave / 4)
    return math.ceil(k / step - 1e-9) * step


def search(try_k: Callable[[float], Trial], cap: float, *, say: Callable[[str], None],
           floor: float = 1.0, floor_locals: int = 0) -> Calibration:
    """The smallest faithful K that the trials (`try_k`) find, else the cap. They climb `ladder(cap)`;
    a K below the compute bound of a trial before it (`Trial.compute_bound`) is skipped, not tried,
    and the next K tried is then the bound rounded up to a quarter octave (`step_up`), so a K the
    compute bound sets is within a quarter of it rather than up to twice. A trial that failed only
    on what falls as K grows, and whose relay chains would meet the margin below the next rung, has
    its chains' estimate tried first (`_next_k`): paper.yaml's 8 locals failed at K = 32 on chains of
    4.6 % alone, and the rung after 32 is 64.

    With `floor` above 1 (the K chosen for the run's point at `floor_locals` locals, fewer than this
    one's) the trials start there, not at 1: a point with more locals trains more at once over deeper
    trees, so it does not need less (`orchestrator.experiment.point_runs`).

    `say` gets one line per K tried (K, faithful or what was violated, the trial's wall time), one per
    K skipped, and one for the choice, for the console and the log."""
    trials: list[Trial] = []
    start = min(max(1.0, floor), float(cap)) if floor_locals else 1.0
    bound, k, guessed = 1.0, start, False
    if start > 1:
        whose = f"the K of this run's point at {floor_locals} locals" if start == floor else \
            f"the cap, below the K={floor:g} of this run's point at {floor_locals} locals"
        say(f"time dilation auto: trials start at K={start:g}, {whose} (a point with more locals needs no less)")
    floor_locals = floor_locals if 1 < start == floor else 0  # recorded: where the trials started, and why
    floor = start

    def made(k: float, faithful: bool) -> Calibration:
        return Calibration(k=k, faithful=faithful, cap=cap, trials=tuple(trials), floor=floor,
                           floor_locals=floor_locals)

    while True:
        trial = try_k(k)
        trials.append(trial)
        word = "faithful" if trial.faithful else "NOT faithful: " + "; ".join(trial.reasons)
        say(f"time dilation auto: K={k:g} {word} (trial {trial.wall_s:.0f} s)")
        if trial.faithful:
            cal = made(k, True)
            say(f"time dilation auto: K={k:g} chosen (the calibration took {cal.wall_s:.0f} s)")
            return cal
        if k >= cap:
            break
        bound = max(bound, trial.compute_bound())
        k, aimed = _next_k(trial, bound, cap, say, guess=not guessed)
        guessed = guessed or aimed  # one chains' guess per search: a second could creep up a quarter at a time
    cal = made(float(cap), False)
    say(f"warning: time dilation auto: no K up to {cap:g} was faithful; the run goes on at K={cap:g} and its "
        f"verdict says what is violated (the calibration took {cal.wall_s:.0f} s)")
    return cal


def _above(bound: float, k: float) -> str:
    """`bound` with as many decimals (one to four) as show it above `k` (16.004 over 16: 16.004, not 16.0)."""
    for digits in range(1, 4):
        if float(text := f"{bound:.{digits}f}") > k:
            return text
    return f"{bound:.4f}"


def _next_k(trial: Trial, bound: float, cap: float, say: Callable[[str], None], *,
            guess: bool = True) -> tuple[float, bool]:
    """The K to try after `trial` failed, and whether it is the chains' guess: the ladder's next rung,
    or, where the trial failed only on what falls as K grows (`Trial.scaling`), `guess` is allowed
    and its relay chains aim lower, the chains' estimate (`Trial.chain_bound`) rounded up to a quarter
    octave, at least the next one above the trial's K; never below the compute `bound` (the Ks below
    it are skipped, one line each)."""
    k = trial.k
    higher = [x for x in ladder(cap) if x > k]
    rung = aimed = higher[0]
    aim = trial.chain_bound()
    if guess and trial.scaling and aim > k:
        aimed = min(rung, max(step_up(aim), step_up(k * (1 + 1e-6))))
    for skipped in (x for x in higher if x < bound and x < cap):
        say(f"time dilation auto: K={skipped:g} skipped: training needs K >= {_above(bound, skipped)} (the compute "
            f"bound from K={k:g}'s trial)")
    out = aimed if aimed >= bound else min(float(cap), max(aimed, step_up(bound)))
    if out == aimed < rung:
        say(f"time dilation auto: K={aimed:g} next, not K={rung:g}: the relay chains' {trial.chain_share:.1%} of a "
            f"round at K={k:g} falls about as 1 / K to a trial's margin at K = {aim:.1f}")
        return out, True
    return out, False


def calibration_config(cfg: ExperimentConfig, k: float) -> ExperimentConfig:
    """The trial of `cfg` at dilation `k`: one task of its largest number of locals, at most
    `CALIBRATION_ROUNDS` rounds, every scheduler, run one task at a time (no faults)."""
    return replace(cfg, name=f"k{k:g}", locals=(max(cfg.locals),), tasks_per_point=1, mode="sequential", events=(),
                   reschedule=RescheduleConfig(), task=replace(cfg.task, rounds=min(cfg.task.rounds, CALIBRATION_ROUNDS)),
                   emulation=replace(cfg.emulation, time_dilation=k, time_dilation_auto=False))


def judge(k: float, wall_s: float, summary: Any) -> Trial:
    """A trial from its run's summary (`orchestrator.results.summary.RunSummary`, None when its results
    could not be written): faithful when some task ran, none failed and every point that ran is."""
    if summary is None:
        return Trial(k=k, faithful=False, reasons=("the trial's results could not be read",), wall_s=wall_s)
    verdicts: Sequence[Any] = summary.verdicts
    #: (what was violated, whether it falls as K grows: `SCALING_REASONS`)
    found: list[tuple[str, bool]] = [(f"{t.scheduler} task {t.task_id} failed: {t.reason or 'no reason recorded'}",
                                      False) for t in summary.tasks if t.state == "failed"]
    if not verdicts:
        found.append(("no calibration task ran a round", False))
    found += [(f"{v.scheduler} at {v.n_locals} locals: {r}", v.compute_modelled and r.startswith(SCALING_REASONS))
              for v in verdicts for r in v.reasons]  # measured training fails at every K
    found += [(f"{v.scheduler} at {v.n_locals} locals: training used up to {v.training_use_max:.2f} of its modelled "
               f"time (a trial needs at most {TRIAL_TRAINING_USE:g}: its margin for the run's longer variation)", True)
              for v in verdicts if v.faithful and v.training_use_max is not None
              and v.training_use_max > TRIAL_TRAINING_USE]
    found += _margins(verdicts)
    uses = [v.training_use_max for v in verdicts if v.training_use_max is not None]
    chains = [v.chain_share for v in verdicts if v.chain_share is not None]
    return Trial(k=k, faithful=not found, reasons=tuple(r for r, _ in found), wall_s=wall_s,
                 emulated_s=summary.environment.get("clock_end_s"), host_saturated=summary.host_saturated,
                 training_use=max(uses) if uses else None, chain_share=max(chains) if chains else None,
                 scaling=bool(found) and all(scales for _, scales in found))


def _margins(verdicts: Sequence[Any]) -> list[tuple[str, bool]]:
    """What a faithful point of a trial lacks of the margins the run needs (`TRIAL_CHAIN_USE`,
    `TRIAL_RATE_LOW`), each with whether it falls as K grows (the chains' share does)."""
    from orchestrator.results.fidelity import CHAIN_SHARE

    out = []
    for v in verdicts:
        if not v.faithful:
            continue
        if v.chain_share is not None and v.chain_share > TRIAL_CHAIN_USE * CHAIN_SHARE:
            out.append((f"{v.scheduler} at {v.n_locals} locals: relay chains carried {v.chain_share:.1%} of a round "
                        f"(a trial needs at most {TRIAL_CHAIN_USE * CHAIN_SHARE:.0%}: its margin for the run's longer "
                        "variation)", True))
        if v.rate_share_median is not None and v.rate_share_median < TRIAL_RATE_LOW:
            out.append((f"{v.scheduler} at {v.n_locals} locals: saturated links delivered {v.rate_share_median:.2f} of "
                        f"their rate (a trial needs at least {TRIAL_RATE_LOW:g}: its margin for the run's longer "
                        "variation)", False))
    return out
