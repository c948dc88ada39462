"""What a copy puts on a link in the flow-level engine: its chunk frames, and their TCP segments.

Imported by the engine's own process (`orchestrator.simulation.engine`), so it imports nothing
of the project.
"""

from __future__ import annotations

import math
from typing import Any

#: Bytes a TCP segment's Ethernet, IP and TCP headers add on the wire: the same figure as
#: `orchestrator.scheduling.cost.SEGMENT_HEADER_BYTES` (the engine's process does not import the
#: schedulers that module's package brings; `tests/unit/test_simulation.py` checks the two agree).
SEGMENT_HEADER_BYTES = 66


def segmented_bytes(frame_bytes: int, mss: int) -> tuple[int, int]:
    """(wire bytes, segments) of one frame sent as TCP segments of at most `mss` payload bytes, each
    with its headers (`SEGMENT_HEADER_BYTES`)."""
    segments = math.ceil(frame_bytes / mss)
    return frame_bytes + SEGMENT_HEADER_BYTES * segments, segments


def chunk_sizes(run: dict[str, Any]) -> list[int]:
    """The bytes each chunk of a copy puts on a link, in the links' payload units: the copy's frames
    (``frame_sizes``) as they are or, with ``segment_mss``, each frame as its own TCP segments with
    their headers at the run's ``payload_share`` (a full segment then counts its payload, a short
    last one more); without frames, the model in equal chunks of ``chunk_bytes`` (the spec's
    ``frame_bytes`` is informational: `build_spec` gives it only with ``frame_sizes``)."""
    frames = [int(n) for n in run.get("frame_sizes") or ()]
    mss = int(run.get("segment_mss", 0))
    if frames and mss > 0:
        share = float(run.get("payload_share", 1.0))
        return [round(segmented_bytes(n, mss)[0] * share) for n in frames]
    if frames:
        return frames
    model, chunk = int(run["model_bytes"]), int(run["chunk_bytes"])
    k = max(1, math.ceil(model / chunk))
    return [chunk] * (k - 1) + [model - chunk * (k - 1)]


def wire_bytes_factor(run: dict[str, Any], default: float) -> float:
    """Wire bytes per byte a run's copies put on a link (its links' payload units, `chunk_sizes`),
    for its carried bytes: with ``segment_mss``, each frame's segments with their headers and the
    ACKs their receiver sends back, one for every two segments and one for a frame's odd last
    segment (the emulation's reader acknowledges each frame at once when it has read it,
    `workers.transport.ack_now`; the kernel every second full segment); otherwise `default` (the
    run's ``wire_bytes_factor``: ACKs as one for every two full segments)."""
    frames = [int(n) for n in run.get("frame_sizes") or ()]
    mss = int(run.get("segment_mss", 0))
    share = float(run.get("payload_share", 1.0))
    if not frames or mss <= 0 or share <= 0:
        return default
    sent = [segmented_bytes(n, mss) for n in frames]
    wire = sum(w for w, _ in sent)
    acks = sum(-(-s // 2) for _, s in sent)
    return (wire + SEGMENT_HEADER_BYTES * acks) / (wire * share)
