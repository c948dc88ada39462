"""A task's chunk size and timeouts, derived from its schedule and model (no fixed 60 s).

Chunk size. A model of S bytes cut into n = ceil(S/c) chunks of at most c bytes crosses a pipeline
of h stages (the overlay hops of the deepest chain, plus the last node's checking) in about::

    T(c) = (ceil(S/c) + h - 1) * (alpha + c/B)

where B is the bottleneck rate and alpha the fixed cost of one chunk at one stage (a frame header,
a digest, a parse, a queue hand-off). dT/dc = 0 (with S/c for n) gives
``c* = sqrt(S * alpha * B / (h - 1))``: small enough that a deep chain pipelines, large enough
that the per-chunk cost stays small. `optimal_chunk_bytes` takes the chunk count next to S/c*
that gives the least T, and the smallest chunk size giving that count, within
[`MIN_CHUNK_BYTES`, `MAX_CHUNK_BYTES`]. No floor makes a small model one chunk: a 19 KB model on
three 100 Mbit/s hops goes as four chunks of 4.8 KB (T = 4.8 ms against 7.4 ms store-and-forward),
since every hop of a chain would otherwise wait for the whole model before it forwards a byte.
The chunk size is part of the protocol the emulated sites run, so it is chosen at the emulated
rates with `ALPHA_S` as the emulated sites' per-chunk cost, whatever the time dilation K: at the
dilated rates (rate / K) a 19 KB model went as 20 chunks of 1 KB at K = 8 and 6 of 3.4 KB at K = 1,
so the same config crossed its trees as different protocols on different hosts.

Timeouts. A node waits for its upload children's chunks for `margin` times the task's
store-and-forward round (broadcast + upload, at the emulated rates; `orchestrator.scheduling.cost`)
plus a training allowance, multiplied by the height of its subtree, so that a parent never gives
up on a child that is itself still waiting for a straggler.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.scheduling.cost import RateFn, store_and_forward_s
from orchestrator.scheduling.schedule import PROCEDURES, Schedule
from topologies.model import NetworkModel
from workers.spec import DEFAULTS

#: Per-chunk cost at one stage, seconds (a frame header, digest, parse and queue hand-off of the
#: agent, measured with benchmarks/bench_transfer.py on a 2-core machine: a few hundred us).
ALPHA_S = 3e-4
#: The smallest chunk every agent accepts (`workers.config`): a bound on the frame count, not a
#: choice of the model above (which never goes below about 2 KB at 100 Mbit/s).
MIN_CHUNK_BYTES = 1024
MAX_CHUNK_BYTES = 8 * 1024 * 1024
#: Margin over the store-and-forward round before a child counts as a straggler.
TIMEOUT_MARGIN = 3.0
#: Floor under every timeout: process scheduling on a busy machine, not the network.
TIMEOUT_FLOOR_S = 5.0
#: What a round may spend training on top of its transfer timeouts, seconds, unless a task's config
#: (`task.train_allowance_s`) or ``netai task run --attach --train-allowance`` says otherwise.
TRAIN_ALLOWANCE_S = 30.0


def optimal_chunk_bytes(model_bytes: int, stages: int, rate_mbps: float, *, alpha_s: float = ALPHA_S) -> int:
    """The chunk size that minimises T(c) (see the module docstring), within the bounds.

    Parameters
    ----------
    model_bytes
        S, the model's tensor bytes.
    stages
        h, the pipeline's stages (>= 1): overlay depth + 1.
    rate_mbps
        B, the bottleneck rate in Mbit/s.

    Raises
    ------
    ValueError
        A model size or rate that is not positive.
    """
    if model_bytes <= 0 or rate_mbps <= 0:
        raise ValueError("model_bytes and rate_mbps must be positive")
    fewest = max(1, math.ceil(model_bytes / MAX_CHUNK_BYTES))
    most = max(fewest, model_bytes // MIN_CHUNK_BYTES)
    best = 0.0 if stages <= 1 else math.sqrt(model_bytes * alpha_s * rate_mbps * 1e6 / 8 / (stages - 1))
    if stages <= 1:
        ideal = 1.0  # nothing to pipeline: every extra chunk only costs alpha
    elif best <= 0:
        ideal = float(most)  # chunks cost nothing (alpha = 0): as many as allowed
    else:
        ideal = model_bytes / best
    # T is convex in the count: its integer optimum is next to the continuous one
    counts = {min(most, max(fewest, n)) for n in range(math.floor(ideal) - 1, math.ceil(ideal) + 2)}

    def t(n: int) -> float:
        return pipelined_time_s(model_bytes, math.ceil(model_bytes / n), stages, rate_mbps, alpha_s=alpha_s)

    return math.ceil(model_bytes / min(sorted(counts), key=t))


def pipelined_time_s(model_bytes: int, chunk_bytes: int, stages: int, rate_mbps: float,
                     *, alpha_s: float = ALPHA_S) -> float:
    """T(c) of the module docstring (for choosing the chunk size and for the docs' figures)."""
    chunks = math.ceil(model_bytes / chunk_bytes)
    return (chunks + stages - 1) * (alpha_s + chunk_bytes * 8 / (rate_mbps * 1e6))


@dataclass(frozen=True)
class TaskTiming:
    """What every agent of one task is told about sizes and time limits."""

    chunk_bytes: int
    child_timeout_s: Mapping[str, float]
    connect_timeout_s: float
    global_timeout_s: float
    store_and_forward_s: float


def subtree_heights(children: Mapping[str, list[str]], root: str) -> dict[str, int]:
    """Height of every node's subtree (0 for a leaf)."""
    out: dict[str, int] = {}

    def height(n: str) -> int:
        if n not in out:
            out[n] = 0 if not children.get(n) else 1 + max(height(c) for c in children[n])
        return out[n]

    height(root)
    return out


def task_timing(
    model: NetworkModel,
    schedule: Schedule,
    model_bytes: int,
    *,
    rate: RateFn,
    train_allowance_s: float,
    connect_timeout_s: float = DEFAULTS.connect_timeout_s,
    propagation: bool = False,
    margin: float = TIMEOUT_MARGIN,
    chunk_bytes: int | None = None,
    time_dilation: float = 1.0,
) -> TaskTiming:
    """Chunk size and timeouts of `schedule`'s task (see the module docstring). `rate` is what the
    links carry in wall time (under time dilation K, the emulated rate / K: the timeouts are wall
    seconds); the chunk size is chosen at the emulated rates (``rate x time_dilation``), so that it is
    the same at every K (see the module docstring)."""
    sf = sum(store_and_forward_s(model, schedule, p, model_bytes, rate=rate, propagation=propagation)
             for p in PROCEDURES)
    links = [link for e in schedule.edges for link in e.links()]
    bottleneck = min((rate(u, v) for u, v in links), default=1000.0)
    stages = max(schedule.depth("broadcast"), schedule.depth("upload")) + 1
    chunk = chunk_bytes or optimal_chunk_bytes(model_bytes, stages, bottleneck * time_dilation)
    base = max(TIMEOUT_FLOOR_S, margin * sf + train_allowance_s)
    children: dict[str, list[str]] = {}
    for child, parent in schedule.upload_parent.items():
        children.setdefault(parent, []).append(child)
    heights = subtree_heights(children, schedule.global_site)
    timeouts = {n: base * max(1, heights.get(n, 0)) for n in schedule.overlay_nodes}
    return TaskTiming(
        chunk_bytes=chunk,
        child_timeout_s=timeouts,
        connect_timeout_s=connect_timeout_s,
        global_timeout_s=2 * max(timeouts.values()) + connect_timeout_s,
        store_and_forward_s=sf,
    )
