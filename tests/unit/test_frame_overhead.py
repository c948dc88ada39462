"""The frames of a copy (`workers.framing.frame_sizes`), which the flow-level simulation sends over
every link a copy crosses: what they add to the weights equals what real chunk frames carry beyond
the tensors."""

from __future__ import annotations

import pytest
import torch

from orchestrator.runtime.compute import model_sizes
from workers.framing import Header, chunk_layout, chunk_view, encode_chunk, frame_sizes


def _template() -> dict[str, torch.Tensor]:
    return {"fc1.weight": torch.zeros(64, 784), "fc1.bias": torch.zeros(64), "fc2.weight": torch.zeros(10, 64),
            "fc2.bias": torch.zeros(10)}


def frame_overhead_bytes(template: dict[str, torch.Tensor], chunk_bytes: int) -> int:
    """The bytes one copy's `frame_sizes` put in its frames beyond the tensors' own."""
    return sum(frame_sizes(template, chunk_bytes)) - sum(t.numel() * t.element_size() for t in template.values())


def _real_frames(template: dict[str, torch.Tensor], chunk_bytes: int, kind: str, sender: str) -> int:
    """Bytes of the real chunk frames of one copy (encoded, hashed) less the tensors' bytes."""
    layout = chunk_layout(template, chunk_bytes)
    frames = 0
    for c in layout:
        header = Header(kind, 1000, 1000, sender, num_examples=1000 if kind == "UPDATE" else 0, chunk=c.index,
                        chunks=len(layout))
        frames += sum(len(b) if isinstance(b, bytes) else memoryview(b).nbytes
                      for b in encode_chunk(header, chunk_view(template, c)))
    return frames - sum(t.numel() * t.element_size() for t in template.values())


@pytest.mark.parametrize("chunk_bytes", [4_000, 14_000, 36_000, 300_000])
def test_the_overhead_is_what_real_frames_carry_beyond_the_tensors(chunk_bytes: int) -> None:
    template = _template()
    chunks = len(chunk_layout(template, chunk_bytes))
    overhead = frame_overhead_bytes(template, chunk_bytes)

    # an UPDATE from a 16-character site: exactly
    assert overhead == _real_frames(template, chunk_bytes, "UPDATE", "s" * 16)
    # a GLOBAL, or another site's name: within a few bytes a chunk (the header's numbers and name)
    for kind, sender in (("GLOBAL", "G"), ("UPDATE", "Urbana-Champaign"), ("GLOBAL", "Salt-Lake-City")):
        assert abs(_real_frames(template, chunk_bytes, kind, sender) - overhead) <= 20 * chunks
    # smaller chunks, more frames: more header bytes a copy
    assert overhead > 0


def test_smaller_chunks_add_more_header_bytes_a_copy() -> None:
    template = _template()
    sizes = [frame_overhead_bytes(template, c) for c in (4_000, 14_000, 36_000, 300_000)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > 5 * sizes[-1]


def test_the_frames_are_the_encoded_chunks_one_by_one() -> None:
    template = _template()
    layout = chunk_layout(template, 14_000)
    encoded = [sum(memoryview(b).nbytes for b in encode_chunk(
        Header("UPDATE", 1000, 1000, "s" * 16, num_examples=1000, chunk=c.index, chunks=len(layout)),
        chunk_view(template, c))) for c in layout]
    assert len(encoded) > 1 and frame_sizes(template, 14_000) == tuple(encoded)


def test_model_sizes_gives_the_models_bytes_and_its_frames_at_each_chunk_size() -> None:
    size, frames = model_sizes("mlp", {})
    assert size > 0
    # each frame's bytes: more frames at a smaller chunk size, together the model and their headers
    assert len(frames(4_000)) > len(frames(100_000)) >= 1
    assert sum(frames(4_000)) > sum(frames(100_000)) > size
    assert frames(4_000) == frames(4_000)  # cached, the same figures


def test_the_simulation_sizes_the_model_on_the_tasks_own_dataset() -> None:
    from orchestrator.experiment.config import parse_config
    from orchestrator.experiment.simulated import _model_sizes
    from orchestrator.runtime.compute import _built_sizes

    # Prepare: a task on synthetic 3x16x16 images, whose mlp's first layer is 12 times digits' (8x8).
    cfg = parse_config({"name": "x", "engine": "simulation", "topology": "triangle", "locals": [2],
                        "task": {"dataset": "synthetic", "dataset_args": {"input_shape": [3, 16, 16]}}})

    # Execute
    size, frames = _model_sizes(cfg, None)

    # Assert: the model built on that dataset, not on digits (as the emulation's admission sizes it).
    own, own_frames = _built_sizes("mlp", {}, "synthetic", {"input_shape": [3, 16, 16]})
    assert size == own > _built_sizes("mlp", {}, "digits", None)[0]
    assert frames is not None and frames(4_000) == own_frames(4_000)


def test_a_paced_copys_carried_bytes_count_one_ack_per_two_segments_and_per_frames_odd_last() -> None:
    # The emulation's reader acknowledges each frame once read (TCP_QUICKACK), the kernel every
    # second full segment: a frame of three segments draws two ACKs, one of two segments one.
    from orchestrator.scheduling.cost import (
        ACK_WIRE_PER_PAYLOAD,
        SEGMENT_HEADER_BYTES,
        TCP_MSS,
        TCP_PAYLOAD_SHARE,
    )
    from orchestrator.simulation.frames import wire_bytes_factor
    from orchestrator.simulation.spec import WIRE_BYTES_FACTOR

    run = {"segment_mss": TCP_MSS, "payload_share": TCP_PAYLOAD_SHARE}
    h = SEGMENT_HEADER_BYTES
    three = 2 * TCP_MSS + 500  # two full segments and a short one
    got = wire_bytes_factor({**run, "frame_sizes": [three, 2 * TCP_MSS]}, default=9.9)
    wire = three + 3 * h + 2 * TCP_MSS + 2 * h
    assert got == pytest.approx((wire + 3 * h) / (wire * TCP_PAYLOAD_SHARE))
    # frames of whole pairs of full segments: one ACK for every two, as the constant has it
    big = wire_bytes_factor({**run, "frame_sizes": [100 * TCP_MSS] * 3}, default=9.9)
    assert big == pytest.approx(1 / TCP_PAYLOAD_SHARE + ACK_WIRE_PER_PAYLOAD) == pytest.approx(WIRE_BYTES_FACTOR, abs=1e-4)
    # the default mlp's copy (a 516-byte frame and short last segments) draws 1.6 % more
    small = wire_bytes_factor({**run, "frame_sizes": [516, *[3349] * 5, 1405, 2829]}, default=9.9)
    assert small / big == pytest.approx(1.0156, abs=5e-4)
    assert wire_bytes_factor({"frame_sizes": [three], "payload_share": 0.9}, default=1.07) == 1.07  # not paced
    assert wire_bytes_factor({**run, "frame_sizes": []}, default=1.07) == 1.07  # no frames modelled
