"""The fidelity verdict per point (`orchestrator.results.fidelity`), from a run's records: faithful
when hops stay near one chunk's time on the link and no training overran its site; it flips when a
hop is slowed, when training overruns, or when training was measured on the host."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.results.db import ResultsDB
from orchestrator.results.fidelity import verdict
from orchestrator.results.report import summary_lines, write_report
from orchestrator.results.summary import run_summary
from orchestrator.scheduling.tasks import Task

CHUNK_S = 0.4e-3


def _hop(hop_s: float, rnd: int = 1, child: str = "B") -> dict[str, object]:
    return {"round": rnd, "parent": "A", "child": child, "hop_s": hop_s, "chunk_s": CHUNK_S,
            "floor_s": CHUNK_S, "overhead_s": hop_s - CHUNK_S}


def test_hops_near_the_link_and_no_overrun_are_faithful() -> None:
    v = verdict("mst", 8, [_hop(0.9e-3), _hop(1.0e-3, 2), _hop(1.2e-3, 3)], [], 24, compute_modelled=True)
    assert v.faithful and v.word == "faithful"
    assert v.hop_median_s == pytest.approx(1.0e-3)
    assert v.overhead_median_s == pytest.approx(0.6e-3)


def test_a_slowed_hop_flips_the_verdict() -> None:
    slow = [_hop(9.5e-3), _hop(10.5e-3, 2), _hop(1.0e-3, 3)]  # median 9.5 ms against 2 x 0.4 + 0.5 = 1.3 ms
    v = verdict("mst", 8, slow, [], 24, compute_modelled=True)
    assert not v.faithful
    assert v.reasons and v.reasons[0].startswith("per-hop time: the instrument adds 9.10 ms a hop")


def test_a_hop_whose_floor_is_the_whole_model_is_judged_by_what_the_instrument_adds() -> None:
    # G's edge under spff: 8 copies share the link, so the floor is the whole model (790 ms), not a chunk
    def g_hop(hop_s: float) -> dict[str, object]:
        return {"round": 1, "parent": "A", "child": "B", "hop_s": hop_s, "chunk_s": 0.033, "floor_s": 0.790,
                "overhead_s": hop_s - 0.790}

    assert verdict("spff", 8, [g_hop(0.810)], [], 8, compute_modelled=True).faithful  # 20 ms over: < 33.5
    late = verdict("spff", 8, [g_hop(0.893)], [], 8, compute_modelled=True)
    assert not late.faithful and "adds 103.00 ms a hop" in late.reasons[0]


def test_an_overrun_or_measured_training_flips_the_verdict() -> None:
    over = verdict("spff", 8, [_hop(1e-3)], [{"real_s": 0.088, "modelled_s": 0.003}], 24, compute_modelled=True)
    assert not over.faithful and "1 of 24 node-rounds overran" in over.reasons[0] and "+85.0 ms" in over.reasons[0]
    measured = verdict("spff", 8, [_hop(1e-3)], [], 24, compute_modelled=False)
    assert not measured.faithful and "measured on this host" in measured.reasons[0]


@pytest.mark.parametrize("shares, faithful", [((0.95, 0.9, 0.97), True), ((0.6, 0.7, 0.97), False),
                                              ((1.5, 2.5, 0.9), False), ((), True)])
def test_a_shaped_link_off_its_configured_rate_flips_the_verdict(shares: tuple[float, ...], faithful: bool) -> None:
    v = verdict("spff", 8, [_hop(1e-3)], [], 24, compute_modelled=True,
                link_rates=[{"rate_share": s} for s in shares])
    assert v.faithful is faithful and v.link_rounds == len(shares)
    assert v.rate_share_median == (sorted(shares)[1] if shares else None)
    if not faithful:
        assert v.reasons[0].startswith(f"shaped-link rate: saturated links delivered {sorted(shares)[1]:.2f} of their "
                                       "configured rate (median of 3 link-rounds")
        above = sorted(shares)[1] > 1  # the reason says which way, and what can cause it
        assert ("bytes passed ahead of its rate (a shaper's burst)" in v.reasons[0]) is above
        assert ("cannot carry or drain the copies" in v.reasons[0]) is not above


def _run(tmp_path: Path, hop_s: float) -> tuple[ResultsDB, int]:
    db = ResultsDB(tmp_path / "results.db")
    run_id = db.start_run("t", {}, {"mode": "sequential", "compute_timing": "modeled"})
    task = Task(5, "A", ("B", "C"), rounds=1)
    db.record_task(run_id, "mst", task)
    db.record_round(run_id, "mst", 5, 1, latency_s=0.01, broadcast_s=0.003, train_s=0.004, upload_s=0.003,
                    accuracy=0.5, lower_bound_s=0.008)
    db.record_node_rounds(run_id, "mst", 5, [{"round": 1, "site": s, "role": "local", "train_start_s": 0.0,
                                               "train_end_s": 0.004} for s in ("B", "C")])
    db.record_fidelity(run_id, "mst", 5, hops=[_hop(hop_s), _hop(hop_s, child="C")], overruns=[], link_rates=[
        {"round": 1, "a": "A", "b": "B", "bytes": 300_000, "expected_s": 0.0024, "measured_s": 0.0025}],
        trainings=[{"round": 1, "site": "B", "real_s": 0.003, "modelled_s": 0.004},
                   {"round": 1, "site": "C", "real_s": 0.001, "modelled_s": 0.004}])
    db.set_task_state(run_id, "mst", 5, "done")
    db.finish_run(run_id, "completed")
    return db, run_id


@pytest.mark.parametrize("hop_s, faithful", [(0.8e-3, True), (8.0e-3, False)])
def test_the_report_and_the_printed_summary_carry_the_verdict(tmp_path: Path, hop_s: float, faithful: bool) -> None:
    db, run_id = _run(tmp_path, hop_s)
    summary = run_summary(db, run_id)
    assert [(v.scheduler, v.n_locals, v.faithful, v.trained) for v in summary.verdicts] == [("mst", 2, faithful, 2)]
    assert summary.verdicts[0].training_use_max == pytest.approx(0.75)  # the larger of B's 0.75 and C's 0.25
    report = write_report(db, run_id, tmp_path, summary=summary, figures=[]).read_text()
    printed = "\n".join(summary_lines(summary, tmp_path))
    assert "## Fidelity" in report
    assert f"| {summary.verdicts[0].word} |" in report and "| 0.960 (1) |" in report  # the link's rate, recorded
    assert "| 0 / 2 | 0.75 | 0.960 (1) |" in report  # the most of its modelled time a training used
    assert ("**Not faithful:**" in report.splitlines()[2]) is not faithful  # the report's first line says so
    assert (f"fidelity mst at 2 locals: {'faithful' if faithful else 'NOT faithful'}") in printed
    assert ("netai: warning:" in printed) is not faithful


def test_rounds_that_beat_their_lower_bound_flip_the_verdict_and_say_by_how_much() -> None:
    fast = verdict("mst", 8, [_hop(1e-3)], [], 24, compute_modelled=True, bound_ratios=[0.93, 0.95, 0.96, 0.94])
    assert not fast.faithful
    assert fast.reasons[0].startswith("lower bound: the rounds beat it, latency / bound 0.945 [")
    assert fast.bound_ratio_ci is not None and fast.bound_ratio_ci[1] < 1
    assert fast.bound_text.startswith("0.94 [") or fast.bound_text.startswith("0.95 [")


@pytest.mark.parametrize("ratios", [[1.34, 1.30, 1.38], [0.99, 1.02, 1.01, 0.98], [0.97]])
def test_rounds_at_or_above_the_bound_within_noise_stay_faithful(ratios: list[float]) -> None:
    """Above the bound, around it (the interval reaches 1), or one round only (no interval): not judged."""
    v = verdict("mst", 8, [_hop(1e-3)], [], 24, compute_modelled=True, bound_ratios=ratios)
    assert v.faithful
    assert v.bounded_rounds == len(ratios) and v.bound_ratio_mean == pytest.approx(sum(ratios) / len(ratios))


def test_a_median_hop_below_its_floor_beyond_a_tenth_of_a_chunk_flips_the_verdict() -> None:
    # floor 0.4 ms (one chunk): hops of 0.30 ms are 0.1 ms below it, a quarter of a chunk
    below = verdict("mst", 8, [_hop(0.30e-3), _hop(0.30e-3, 2), _hop(0.5e-3, 3)], [], 24, compute_modelled=True)
    assert not below.faithful
    assert below.reasons[0].startswith("per-hop time: hops are 0.10 ms (median) shorter than the emulated network")
    near = verdict("mst", 8, [_hop(0.37e-3), _hop(0.37e-3, 2), _hop(0.5e-3, 3)], [], 24, compute_modelled=True)
    assert near.faithful  # 0.03 ms below: within a tenth of a chunk (0.04 ms)


def test_latency_over_bound_is_given_with_its_interval() -> None:
    v = verdict("mst", 8, [_hop(1e-3)], [], 24, compute_modelled=True, bound_ratios=[1.2, 1.3])
    assert v.bound_text.startswith("1.25 [1.20, 1.30]")


def _overrun_run(tmp_path: Path, late_s: tuple[float, float]) -> tuple[ResultsDB, int]:
    """Two rounds of 100 ms each; in round 1 site B overran by `late_s[0]` and site C by `late_s[1]`."""
    db = ResultsDB(tmp_path / "results.db")
    run_id = db.start_run("t", {}, {"mode": "sequential", "compute_timing": "modeled"})
    db.record_task(run_id, "mst", Task(5, "A", ("B", "C"), rounds=2))
    for rnd in (1, 2):
        db.record_round(run_id, "mst", 5, rnd, latency_s=0.1, broadcast_s=0.01, train_s=0.08, upload_s=0.01,
                        accuracy=0.5, lower_bound_s=0.09)
    db.record_node_rounds(run_id, "mst", 5, [{"round": r, "site": s, "role": "local", "train_start_s": 0.0,
                                               "train_end_s": 0.08} for r in (1, 2) for s in ("B", "C")])
    overruns = [{"round": 1, "site": s, "real_s": 0.08 + late, "modelled_s": 0.08} for s, late in zip("BC", late_s, strict=True)]
    db.record_fidelity(run_id, "mst", 5, hops=[_hop(1e-3), _hop(1e-3, child="C")], overruns=overruns)
    db.set_task_state(run_id, "mst", 5, "done")
    db.finish_run(run_id, "completed")
    return db, run_id


def test_overruns_within_their_share_of_the_latency_are_faithful_and_said(tmp_path: Path) -> None:
    # Prepare: B and C overran in the same round by 1 and 0.5 ms: the round waits for one of them, so
    # at most 1 ms of the rounds' 200 ms (0.5 %, within the 1 % allowed).
    db, run_id = _overrun_run(tmp_path, (1e-3, 0.5e-3))

    # Execute
    summary = run_summary(db, run_id)
    (v,) = summary.verdicts
    printed = "\n".join(summary_lines(summary, tmp_path))
    report = write_report(db, run_id, tmp_path, summary=summary, figures=[]).read_text()

    # Assert: faithful, the share the per-round largest overrun gives, and both outputs say so.
    assert v.faithful and v.overruns == 2 and v.overrun_share == pytest.approx(0.005)
    assert "2 of 4 node-rounds overran, adding at most 0.50% to the rounds' latency (allowed 1%)" in printed
    assert "| 2 / 4 (+0.50%) |" in report


def test_overruns_beyond_their_share_flip_the_verdict_and_an_unknown_share_fails(tmp_path: Path) -> None:
    # Prepare: B overran by 3 ms (1.5 % of 200 ms).
    db, run_id = _overrun_run(tmp_path, (3e-3, 0.5e-3))

    # Execute
    (v,) = run_summary(db, run_id).verdicts
    unknown = verdict("mst", 2, [_hop(1e-3)], [{"real_s": 0.0801, "modelled_s": 0.08}], 4, compute_modelled=True)

    # Assert
    assert not v.faithful and v.overrun_share == pytest.approx(0.015)
    assert "adding up to 1.5% to the rounds' latency (allowed 1%)" in v.reasons[0]
    assert not unknown.faithful and unknown.overrun_share is None


@pytest.mark.parametrize("ratios, faithful", [([0.997, 0.998, 0.997, 0.998], True), ([0.985, 0.986, 0.984], False)])
def test_rounds_a_frame_below_their_bound_stay_faithful_and_a_percent_below_do_not(ratios: list[float],
                                                                                   faithful: bool) -> None:
    """A shaper passes a frame per link ahead of its rate (0.2-0.5 % of a round of one local, measured at
    K = 16-64): tolerated up to `BOUND_SHARE`; beyond it the rounds beat what the network allows."""
    v = verdict("spff", 1, [_hop(1e-3)], [], 4, compute_modelled=True, bound_ratios=ratios)
    assert v.bound_ratio_ci is not None and v.bound_ratio_ci[1] < 1.0  # below the bound in both cases
    assert v.faithful is faithful
    assert any("(allowed 0.99)" in r for r in v.reasons) is not faithful
