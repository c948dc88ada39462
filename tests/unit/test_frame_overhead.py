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
