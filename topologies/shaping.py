"""What a shaped link passes ahead of its rate: the htb burst of the emulation's links.

The controller's shaping (`controller.htb`) gives every class this burst, and the flow-level
simulation's twin of an emulated run models it (`orchestrator.simulation.shaper`), so the one
formula lives here, below both.
"""

from __future__ import annotations

import math

#: The smallest burst (and cburst) of a class, bytes: one MTU frame and a little. htb sends a packet
#: whenever its tokens are >= 0, so after an idle gap one frame passes at the port's speed whatever
#: the burst; a smaller one buys no accuracy.
BURST_FLOOR_BYTES = 1600
#: What a class's burst covers at its own rate, wall seconds: the timer slack htb must absorb to hold
#: the rate on a loaded host (docs/fidelity.md, "Shaping"). On idle forwarding veths one frame
#: held 0.95 of 100 Mbit/s, but in the emulation it did not: with 1 ms, the pipelined broadcast at
#: 20 Mbit/s took 1.48 x S/B against 1.13 with 6 ms (`benchmarks/bench_dataplane.py`), and at K = 1 a
#: one-frame burst left saturated links at 0.11-0.41 of their rate. 6 ms is one frame up to 2.13
#: Mbit/s (a 100 Mbit/s link from K = 47, where small models are measured here); in emulated time it
#: is 6 ms / K. A fixed 15 KB passed 13 of a 19 KB model's 20 KB of frames unshaped after an idle gap,
#: at any time dilation.
BURST_WINDOW_S = 6e-3
#: The largest burst, bytes: under one copy of the default mlp (about 20 KB of frames), whatever the rate.
BURST_CAP_BYTES = 16_000


def burst_bytes(mbps: float) -> int:
    """The htb burst of a class shaped to `mbps` (the dilated rate the class runs at): `BURST_WINDOW_S`
    of it, at least `BURST_FLOOR_BYTES` and at most `BURST_CAP_BYTES`. A copy crossing an idle link
    thus passes at most this much ahead of the rate: one frame up to 2.13 Mbit/s."""
    return min(BURST_CAP_BYTES, max(BURST_FLOOR_BYTES, math.ceil(mbps * 1e6 / 8 * BURST_WINDOW_S)))
