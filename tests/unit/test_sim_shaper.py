"""The emulation's shaper burst in the simulated twin (`orchestrator.simulation.shaper`): what htb
passes ahead of a link's rate after an idle gap, and what a run's spec does with it."""

from __future__ import annotations

import pytest

from orchestrator.scheduling.cost import TCP_MSS, TCP_PAYLOAD_SHARE
from orchestrator.simulation.shaper import Bucket
from orchestrator.simulation.spec import twin_simulation
from topologies.shaping import burst_bytes

RATE = 100e6 / 8  # a 100 Mbit/s link, bytes per second of emulated time


@pytest.mark.parametrize("k, frames", [(1, 16_000), (16, 4_688), (64, 1_600)])
def test_the_burst_is_htbs_at_the_dilated_rate_in_payload_bytes(k: float, frames: int) -> None:
    bucket = Bucket.for_link(RATE, k)
    assert burst_bytes(100 / k) == frames
    assert bucket.burst == pytest.approx(frames * TCP_PAYLOAD_SHARE) and bucket.tokens == bucket.burst


def test_an_idle_link_passes_its_burst_then_paces_and_fills_again_at_the_rate() -> None:
    # Prepare: K = 64, a burst of one frame's bytes (1,530 of payload), 3,000-byte chunks.
    bucket = Bucket.for_link(RATE, 64)
    burst = bucket.burst

    # Execute / Assert: the first chunk passes its burst at once, the rest at the rate.
    first = bucket.ahead(0.0, 3_000)
    end = (3_000 - first) / RATE
    bucket.left(end)
    assert first == pytest.approx(burst) and bucket.tokens == pytest.approx(0.0, abs=1e-6)

    # A chunk right behind it finds the bucket empty: nothing passes ahead.
    assert bucket.ahead(end, 3_000) == 0.0
    bucket.left(end + 3_000 / RATE)

    # After an idle gap of half a burst's time, half a burst passes; after a long gap, the burst, no more.
    t = end + 3_000 / RATE
    assert bucket.ahead(t + burst / 2 / RATE, 3_000) == pytest.approx(burst / 2)
    bucket.left(t + burst / 2 / RATE + (3_000 - burst / 2) / RATE)
    assert bucket.ahead(1e3, 3_000) == pytest.approx(burst)


def test_a_segment_slowed_by_a_shared_link_leaves_the_bucket_fuller() -> None:
    bucket = Bucket.for_link(RATE, 64)
    passed = bucket.ahead(0.0, 10_000)
    bucket.left(2 * (10_000 - passed) / RATE)  # twice as long as the rate alone: it refilled meanwhile
    assert bucket.tokens == pytest.approx(min(bucket.burst, 10_000 - passed))


def test_a_twin_models_the_emulations_burst_at_its_k_and_tcps_payload_share() -> None:
    twin = twin_simulation(propagation=False, time_dilation=32)
    assert twin["shaper_burst_k"] == 32 and twin["tcp_efficiency"] == round(TCP_PAYLOAD_SHARE, 4)
    assert twin_simulation(propagation=True)["shaper_burst_k"] == 1.0
    assert "segment_mss" not in twin


def test_a_twin_of_paced_copies_has_no_burst_and_sends_each_frame_as_segments() -> None:
    twin = twin_simulation(propagation=False, time_dilation=32, paced=True)
    assert twin["shaper_burst_k"] == 0.0 and twin["segment_mss"] == TCP_MSS == 1448


@pytest.mark.parametrize("k", [16, 32])  # where the 6 ms window, not a cap, sets the burst
def test_the_bucket_of_a_payload_rate_is_the_ports_burst_of_the_line_rate(k: float) -> None:
    # The engine's rates are the payload's (line rate x tcp_efficiency); htb shapes the line rate.
    share = round(TCP_PAYLOAD_SHARE, 4)
    bucket = Bucket.for_link(RATE * share, k, payload_share=share)
    assert bucket.burst == pytest.approx(burst_bytes(100 / k) * TCP_PAYLOAD_SHARE)
    # Without the share the burst is that of a slower link: smaller where the 6 ms window rules it.
    assert Bucket.for_link(RATE * share, k).burst < bucket.burst
