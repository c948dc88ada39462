"""``emulation.time_dilation: auto``: the config accepts it and rejects bad values before anything
starts; the search takes the smallest faithful K of 1, 2, 4, ... up to the cap (else the cap, and
says so); a trial is judged by the report's verdict rules; the report gives K, how it was chosen and
the wall-time cost (`orchestrator.experiment.calibration`, fakes for the trials)."""

from __future__ import annotations

import re
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from orchestrator.errors import ConfigError
from orchestrator.experiment.calibration import (
    CALIBRATION_ROUNDS,
    TRIAL_CHAIN_USE,
    TRIAL_TRAINING_USE,
    Calibration,
    Trial,
    calibration_config,
    judge,
    ladder,
    search,
    step_up,
)
from orchestrator.experiment.config import parse_config
from orchestrator.results.fidelity import verdict
from orchestrator.results.report import dilation_lines, dilation_section


def _cfg(**emulation: Any) -> Any:
    return parse_config({"name": "x", "locals": [2, 8], "schedulers": ["spff", "mst"], "task": {"rounds": 5},
                         "emulation": emulation})


def test_auto_is_parsed_kept_in_the_saved_config_and_parsed_again() -> None:
    cfg = _cfg(time_dilation="auto", max_time_dilation=16)
    assert cfg.emulation.time_dilation_auto and cfg.emulation.max_time_dilation == 16.0
    saved = cfg.to_dict()
    assert saved["emulation"]["time_dilation"] == "auto" and "time_dilation_auto" not in saved["emulation"]
    assert parse_config(saved).emulation == cfg.emulation
    fixed = _cfg(time_dilation=4)
    assert not fixed.emulation.time_dilation_auto and fixed.emulation.time_dilation == 4.0
    assert "max_time_dilation" not in fixed.to_dict()["emulation"]
    assert parse_config(fixed.to_dict()).emulation == fixed.emulation


@pytest.mark.parametrize(("emulation", "message"), [
    ({"time_dilation": "fast"}, "emulation.time_dilation must be a number >= 1 and <= 1000, auto, host or a mapping of locals to K"),
    ({"time_dilation": 0.5}, "emulation.time_dilation must be a number >= 1"),
    ({"time_dilation": True}, "emulation.time_dilation must be a number"),
    ({"time_dilation": "auto", "max_time_dilation": 1}, "emulation.max_time_dilation must be a number >= 2"),
    ({"time_dilation": "auto", "max_time_dilation": 5000}, "emulation.max_time_dilation must be a number"),
    ({"time_dilation": 4, "max_time_dilation": 8}, "max_time_dilation is the calibration's cap: it needs"),
    ({"max_time_dilation": 8}, "max_time_dilation is the calibration's cap: it needs"),
])
def test_bad_dilation_settings_are_rejected_naming_the_key(emulation: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _cfg(**emulation)


def test_auto_needs_the_emulation() -> None:
    with pytest.raises(ConfigError, match="time_dilation: auto calibrates the emulation"):
        parse_config({"name": "x", "engine": "simulation", "emulation": {"time_dilation": "auto"}})


def test_the_ladder_doubles_up_to_the_cap() -> None:
    assert ladder(64) == (1, 2, 4, 8, 16, 32, 64)
    assert ladder(10) == (1, 2, 4, 8, 10)
    assert ladder(2) == (1, 2)
    with pytest.raises(ValueError):
        ladder(0.5)


def _trials_faithful_from(k_min: float, tried: list[float]) -> Any:
    def try_k(k: float) -> Trial:
        tried.append(k)
        ok = k >= k_min
        return Trial(k=k, faithful=ok, reasons=() if ok else (f"mst at 8 locals: overran at {k:g}",), wall_s=10 * k)
    return try_k


def test_search_takes_the_smallest_faithful_k_and_says_what_each_k_violated() -> None:
    tried: list[float] = []
    said: list[str] = []
    cal = search(_trials_faithful_from(5, tried), 64, say=said.append)
    assert tried == [1, 2, 4, 8]  # stops at the first faithful K
    assert cal.k == 8 and cal.faithful and cal.cap == 64
    assert cal.wall_s == pytest.approx(10 + 20 + 40 + 80)
    assert said[0] == "time dilation auto: K=1 NOT faithful: mst at 8 locals: overran at 1 (trial 10 s)"
    assert said[3] == "time dilation auto: K=8 faithful (trial 80 s)"
    assert said[-1] == "time dilation auto: K=8 chosen (the calibration took 150 s)"
    record = cal.to_dict()
    assert [t["k"] for t in record["trials"]] == [1, 2, 4, 8] and record["k"] == 8 and record["wall_s"] == 150


def test_search_skips_what_the_compute_bound_rules_out() -> None:
    """A trial whose training used 5x its modelled time at K = 1 rules out K = 2 and 4 (the use falls at
    least as 1 / K, and is still above 1 there): the next K tried is the bound itself, 5, not 8. The
    trial's margin (0.8) is not part of the skip: K = 5 is tried, and judged by its own trial."""
    tried: list[float] = []
    said: list[str] = []

    def try_k(k: float) -> Trial:
        tried.append(k)
        return Trial(k=k, faithful=k >= 5, reasons=() if k >= 5 else ("overran",), wall_s=1.0, training_use=5.0 / k)

    cal = search(try_k, 64, say=said.append)
    assert tried == [1, 5] and cal.k == 5 and cal.faithful
    assert Trial(k=1, faithful=False, reasons=(), wall_s=1, training_use=5.0).compute_bound() == pytest.approx(5.0)
    assert any(line.startswith("time dilation auto: K=4 skipped: training needs K >= 5.0") for line in said)
    assert Trial(k=2, faithful=True, reasons=(), wall_s=1, training_use=0.5).compute_bound() == 2
    # A use within the trial's margin's reach (0.9 at K = 8) skips nothing: that K's trial judges it.
    assert Trial(k=8, faithful=False, reasons=(), wall_s=1, training_use=0.9).compute_bound() == 8
    # A bound just above a rung says so: 16.004 over 16, not "K=16 skipped: training needs K >= 16.0".
    close: list[str] = []
    search(lambda k: Trial(k=k, faithful=k > 16, reasons=() if k > 16 else ("overran",), wall_s=1.0,
                           training_use=16.004 / k), 64, say=close.append)
    assert any(line.startswith("time dilation auto: K=16 skipped: training needs K >= 16.004") for line in close)


def test_a_points_trials_start_at_the_k_of_a_point_with_fewer_locals_and_the_report_says_so() -> None:
    tried: list[float] = []
    said: list[str] = []

    cal = search(_trials_faithful_from(20, tried), 64, say=said.append, floor=16, floor_locals=4)
    above_cap = search(_trials_faithful_from(1, []), 8, say=[].append, floor=16, floor_locals=4)

    assert tried == [16, 32]  # from the floor, then up the ladder
    assert cal.k == 32 and cal.floor == 16 and cal.floor_locals == 4
    assert said[0] == ("time dilation auto: trials start at K=16, the K of this run's point at 4 locals "
                       "(a point with more locals needs no less)")
    assert above_cap.k == 8 and [t.k for t in above_cap.trials] == [8]  # never beyond the cap
    capped: list[str] = []
    search(_trials_faithful_from(100, []), 8, say=capped.append, floor=16, floor_locals=4)
    assert capped[0].startswith("time dilation auto: trials start at K=8, the cap, below the K=16 of this run's point")
    unfaithful = {"time_dilation": 32.0, "time_dilation_calibration": cal.to_dict() | {"faithful": False}}
    assert "NO K from K=16 (the K of the run's point at 4 locals) up to the calibration's cap 64" in \
        dilation_lines(unfaithful)[0]
    assert "floor" not in above_cap.to_dict()  # it started at the cap, not at the point's K
    env = {"time_dilation": 32.0, "time_dilation_calibration": cal.to_dict()}
    assert dilation_lines(env)[0].startswith("time dilation K=32 (chosen by calibration, the smallest faithful K of "
                                             "those tried from K=16 (the K of the run's point at 4 locals) up to 64)")
    assert "floor" not in search(_trials_faithful_from(1, []), 8, say=[].append).to_dict()


def test_search_with_no_faithful_k_runs_at_the_cap_and_warns() -> None:
    tried: list[float] = []
    said: list[str] = []
    cal = search(_trials_faithful_from(1000, tried), 6, say=said.append)
    assert tried == [1, 2, 4, 6]
    assert cal.k == 6 and not cal.faithful
    assert said[-1].startswith("warning: time dilation auto: no K up to 6 was faithful; the run goes on at K=6")


def test_the_trial_is_the_runs_largest_point_for_a_few_rounds_at_k() -> None:
    cfg = _cfg(time_dilation="auto")
    trial = calibration_config(cfg, 4)
    assert trial.locals == (8,) and trial.tasks_per_point == 1 and trial.schedulers == cfg.schedulers
    assert trial.task.rounds == min(5, CALIBRATION_ROUNDS) and trial.task.model == cfg.task.model
    assert trial.emulation.time_dilation == 4 and not trial.emulation.time_dilation_auto
    assert trial.mode == "sequential" and trial.events == () and trial.topology == cfg.topology


def _summary(verdicts: list[Any], states: tuple[str, ...] = ("done", "done")) -> Any:
    tasks = [SimpleNamespace(scheduler="mst", task_id=801, state=s, reason="round 1 timed out") for s in states]
    return SimpleNamespace(tasks=tasks, verdicts=verdicts, environment={"clock_end_s": 1.5}, host_saturated=0.25)


def _hop(hop_s: float) -> dict[str, Any]:
    return {"round": 1, "parent": "A", "child": "B", "hop_s": hop_s, "chunk_s": 1e-3, "floor_s": 1e-3,
            "overhead_s": hop_s - 1e-3}


def test_a_trial_is_judged_by_the_reports_verdicts() -> None:
    good = verdict("mst", 8, [_hop(1.2e-3)], [], 16, compute_modelled=True)
    slow = verdict("spff", 8, [_hop(9e-3)], [], 16, compute_modelled=True)
    over = verdict("mst", 8, [_hop(1.2e-3)], [{"real_s": 0.02, "modelled_s": 0.01}], 16, compute_modelled=True)

    ok = judge(2, 30.0, _summary([good]))
    assert ok.faithful and ok.reasons == () and ok.emulated_s == 1.5 and ok.host_saturated == 0.25
    bad = judge(2, 30.0, _summary([good, slow]))
    assert not bad.faithful and bad.reasons[0].startswith("spff at 8 locals: per-hop time: the instrument adds")
    assert judge(2, 30.0, _summary([over])).reasons[0].startswith("mst at 8 locals: training: 1 of 16 node-rounds")
    failed = judge(2, 30.0, _summary([good], ("done", "failed")))
    assert failed.reasons == ("mst task 801 failed: round 1 timed out",)
    assert judge(2, 30.0, _summary([])).reasons == ("no calibration task ran a round",)
    assert not judge(2, 30.0, None).faithful


def test_a_trial_without_overruns_still_needs_a_margin_below_the_modelled_time() -> None:
    def point(use: float | None) -> Any:
        return verdict("spff", 8, [_hop(1.2e-3)], [], 24, compute_modelled=True, training_use_max=use)

    assert point(0.93).faithful, "the report's verdict: no overrun is faithful"
    thin = judge(16, 30.0, _summary([point(0.93)]))
    assert not thin.faithful
    assert thin.reasons == ("spff at 8 locals: training used up to 0.93 of its modelled time (a trial needs at most "
                            f"{TRIAL_TRAINING_USE:g}: its margin for the run's longer variation)",)
    assert judge(16, 30.0, _summary([point(TRIAL_TRAINING_USE)])).faithful
    assert judge(16, 30.0, _summary([point(None)])).faithful, "measured compute has no margin to ask"


def test_the_report_gives_k_how_it_was_chosen_and_the_wall_time() -> None:
    cal = Calibration(k=4, faithful=True, cap=64, trials=(
        Trial(k=1, faithful=False, reasons=("mst at 8 locals: overran",), wall_s=20, emulated_s=1.0, host_saturated=0.5),
        Trial(k=2, faithful=False, reasons=("spff at 8 locals: slow hop",), wall_s=25, emulated_s=1.0),
        Trial(k=4, faithful=True, reasons=(), wall_s=35, emulated_s=0.9, host_saturated=0.1)))
    env = {"time_dilation": 4.0, "time_dilation_calibration": cal.to_dict(), "run_wall_s": 200.0, "clock_end_s": 5.0}
    lines = dilation_lines(env)
    assert lines[0] == ("time dilation K=4 (chosen by calibration, the smallest faithful K of those tried up to 64); "
                        "wall time 200.0 s (calibration 80.0 s) for 5.00 s emulated: 40 x")
    assert lines[1] == ("calibration K=1: NOT faithful: mst at 8 locals: overran (trial 20.0 s wall, 1.00 s emulated, "
                        "host saturated in 50 % of samples)")
    assert len(lines) == 4 and lines[3].startswith("calibration K=4: faithful")
    assert dilation_section(env)[1] == "## Time dilation"
    capped = env | {"time_dilation_calibration": Calibration(k=4, faithful=False, cap=4, trials=()).to_dict()}
    assert "NO K up to the calibration's cap 4 was faithful" in dilation_lines(capped)[0]
    assert dilation_lines({"time_dilation": 20.0, "run_wall_s": 50.0, "clock_end_s": 2.0})[0] == (
        "time dilation K=20 (set in the config); wall time 50.0 s for 2.00 s emulated: 25 x")
    assert dilation_lines({"time_dilation": 1.0}) == [] and dilation_section({}) == []


def test_after_a_skip_the_bound_rounded_up_to_a_quarter_octave_is_tried_then_the_ladder_goes_on() -> None:
    """A bound of 37.9 (K = 1's trainings used 37.9 x their modelled time): the next K is 40 (not
    64); if 40 is not faithful for another reason, the ladder goes on at 64."""
    tried: list[float] = []
    said: list[str] = []

    def try_k(k: float) -> Trial:
        tried.append(k)
        return Trial(k=k, faithful=k >= 64, reasons=() if k >= 64 else ("hops",), wall_s=1.0,
                     training_use=37.9 / k)

    cal = search(try_k, 128, say=said.append)
    assert tried == [1, 40, 64] and cal.k == 64
    assert re.findall(r"K=(\d+) skipped", "\n".join(said)) == ["2", "4", "8", "16", "32"]
    assert [step_up(x) for x in (1, 2.5, 5, 9, 28.7, 37.9, 40.1, 100)] == [1, 3, 5, 10, 32, 40, 48, 112]
    assert search(try_k, 36, say=said.append).k == 36  # a bound above the cap: the cap, tried once


def test_a_trial_needs_a_margin_on_the_relay_chains_and_the_links_rate_too() -> None:
    from orchestrator.results.fidelity import CHAIN_SHARE

    def point(chain: float | None, rates: tuple[float, ...] = ()) -> Any:
        return verdict("mst", 13, [_hop(1.2e-3)], [], 24, compute_modelled=True, chain_share=chain,
                       link_rates=[{"rate_share": r} for r in rates])

    # 4.4 % is faithful in the report (allowed 5 %), but a trial must stay under 4 %: the 13-locals
    # trial at K = 40 carried 4.4 % and its run 7.6 %.
    assert point(0.044).faithful
    thin = judge(40, 30.0, _summary([point(0.044)]))
    assert not thin.faithful
    assert thin.reasons == (f"mst at 13 locals: relay chains carried 4.4% of a round (a trial needs at most "
                            f"{TRIAL_CHAIN_USE * CHAIN_SHARE:.0%}: its margin for the run's longer variation)",)
    assert judge(40, 30.0, _summary([point(0.03)])).faithful
    # Links at 0.82 of their rate pass the report (0.8) but not a trial (0.85).
    slow = judge(3, 30.0, _summary([point(0.01, (0.82, 0.81, 0.83))]))
    assert not slow.faithful and slow.reasons[0].startswith("mst at 13 locals: saturated links delivered 0.82")
    assert judge(3, 30.0, _summary([point(0.01, (0.9, 0.95))])).faithful


def _chains_trial(k: float, share_at_32: float, *, faithful_from: float, scaling: bool = True,
                  tried: list[float] | None = None) -> Trial:
    """A trial whose relay chains carry `share_at_32` at K = 32, falling as 1 / K."""
    if tried is not None:
        tried.append(k)
    ok = k >= faithful_from
    return Trial(k=k, faithful=ok, reasons=() if ok else ("mst at 8 locals: relay chains carried ...",), wall_s=1.0,
                 chain_share=share_at_32 * 32 / k, scaling=scaling)


def test_a_trial_that_failed_on_its_relay_chains_alone_tries_where_they_would_meet_the_margin() -> None:
    """paper.yaml's 8 locals: chains of 4.6 % at K = 32 (a trial may carry 4 %) aim at K = 36.8, so
    40 is tried before the ladder's 64; if 40 fails too (4.6 x 32 / 40 = 3.7 %, but noisy), its own
    estimate is within the margin and the ladder goes on at 64."""
    tried: list[float] = []
    said: list[str] = []
    cal = search(lambda k: _chains_trial(k, 0.046, faithful_from=40, tried=tried), 256, say=said.append,
                 floor=32, floor_locals=7)
    assert tried == [32, 40] and cal.k == 40 and cal.faithful
    assert ("time dilation auto: K=40 next, not K=64: the relay chains' 4.6% of a round at K=32 falls about as "
            "1 / K to a trial's margin at K = 36.8") in said
    assert Trial(k=32, faithful=False, reasons=(), wall_s=1, chain_share=0.046).chain_bound() == pytest.approx(36.8)
    assert Trial(k=32, faithful=True, reasons=(), wall_s=1, chain_share=0.03).chain_bound() == 32

    tried = []
    search(lambda k: _chains_trial(k, 0.046, faithful_from=64, tried=tried), 256, say=[].append,
           floor=32, floor_locals=7)
    assert tried == [32, 40, 64]
    # A trial that also failed on something that does not fall with K (a slow hop, a link's rate, a
    # failed task) has no K to aim for: the ladder.
    tried = []
    search(lambda k: _chains_trial(k, 0.046, faithful_from=40, scaling=False, tried=tried), 256, say=[].append,
           floor=32, floor_locals=7)
    assert tried == [32, 64]
    # Chains whose estimate is beyond the next rung leave the rung (the ladder never jumps further).
    tried = []
    search(lambda k: _chains_trial(k, 0.30, faithful_from=1000, tried=tried), 256, say=[].append,
           floor=32, floor_locals=7)
    assert tried == [32, 64, 128, 256]
    # The compute bound still rules, and then no chains' line is said: chains aiming at 40 below a
    # compute bound of 60 go to 64, below one of 44 to 48.
    for use, expected in ((1.875, [32, 64]), (1.375, [32, 48])):
        both_tried: list[float] = []
        said = []

        def both(k: float, use: float = use, log: list[float] = both_tried) -> Trial:
            log.append(k)
            return replace(_chains_trial(k, 0.046, faithful_from=48), training_use=use * 32 / k)

        search(both, 256, say=said.append, floor=32, floor_locals=7)
        assert both_tried == expected
        assert not any(" next, not " in line for line in said)
    # One chains' guess per search: chains that do not fall (4.1 % at every K) would otherwise creep
    # up a quarter octave at a time (40, 48, 56) where the ladder costs one trial.
    tried = []

    def stuck(k: float) -> Trial:
        tried.append(k)
        return Trial(k=k, faithful=k >= 64, reasons=() if k >= 64 else ("chains",), wall_s=1.0, chain_share=0.041,
                     scaling=True)

    search(stuck, 256, say=[].append, floor=32, floor_locals=7)
    assert tried == [32, 40, 64]


def test_a_trial_records_its_chains_and_whether_all_it_failed_on_falls_with_k() -> None:
    def point(chain: float, rates: tuple[float, ...] = (), hop: float = 1.2e-3, use: float | None = None) -> Any:
        return verdict("mst", 8, [_hop(hop)], [], 24, compute_modelled=True, chain_share=chain,
                       link_rates=[{"rate_share": r} for r in rates], training_use_max=use)

    thin = judge(32, 30.0, _summary([point(0.046), point(0.02)]))
    assert not thin.faithful and thin.scaling and thin.chain_share == pytest.approx(0.046)
    over = judge(32, 30.0, _summary([point(0.07)]))  # beyond the report's 5 %: the verdict's own reason
    assert over.reasons[0].startswith("mst at 8 locals: relay chains: the instrument adds") and over.scaling
    assert judge(32, 30.0, _summary([point(0.046, use=0.95)])).scaling  # training falls with K too
    assert not judge(32, 30.0, _summary([point(0.046, rates=(0.82, 0.83))])).scaling  # a link's rate does not
    assert not judge(32, 30.0, _summary([point(0.046, hop=9e-3)])).scaling  # nor a slow hop
    assert not judge(32, 30.0, _summary([point(0.046)], ("done", "failed"))).scaling  # nor a failed task
    ok = judge(32, 30.0, _summary([point(0.02)]))
    assert ok.faithful and not ok.scaling and ok.to_dict()["chain_share"] == pytest.approx(0.02)
    overran = verdict("mst", 8, [_hop(1.2e-3)], [{"real_s": 0.02, "modelled_s": 0.01}], 16, compute_modelled=True)
    assert judge(2, 30.0, _summary([overran])).scaling, "the verdict's training reason falls with K"
    measured = verdict("mst", 8, [_hop(1.2e-3)], [], 16, compute_modelled=False, chain_share=0.046)
    assert measured.reasons[0].startswith("training: measured on this host")
    assert not judge(32, 30.0, _summary([measured])).scaling, "training measured on the host fails at every K"
