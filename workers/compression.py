"""Update compression: what an UPDATE chunk carries on the wire, and how it is read back.

Compression applies to the uploads only (GLOBAL travels as the model's own dtypes). With a codec
other than ``none``, an UPDATE carries the *change* of the floating-point tensors over the round's
global model (``local - global``), not the weights: a mean of changes is the change of the mean, so
an in-path aggregator combines changes without knowing the global model (an upload-only relay never
receives it), and G adds the aggregated change to the global model it sent. Tensors that are not
floating point (counters) travel unchanged, as values.

Codecs (per piece of a chunk, `workers.framing.chunk_layout`):

- ``fp16``: the change as float16 (values beyond +-65504 are clamped); error <= 2**-11 relative,
  2**-25 absolute below float16's normal range (6.1e-5).
- ``int8``: symmetric linear quantisation with one float32 scale per tensor piece,
  ``q = round(x / s)``, ``s = max|x| / 127``; absolute error <= s / 2 per element.
- ``int8-chunk``: the same with one scale for every floating-point piece of the chunk.
- ``topk``: the ``ceil(k * n)`` largest-magnitude elements of each piece (k in (0, 1]) as int32
  indices (strictly increasing) and float32 values; the rest is zero. The sender keeps what it left
  out (error feedback: added to its next round's change of that chunk), so nothing is lost for good.

At an in-path aggregator every incoming chunk is decoded to float32, combined in float64
(`workers.aggregate.ChunkSum`, the same example-weighted mean as without compression) and the mean
is compressed again for the parent. Incoming chunks are checked like uncompressed ones
(`workers.framing.parse_chunk` against the compressed layout of the chunk: names, dtypes, shapes,
finite values), then by the codec (scales not negative, indices in range and increasing). Nothing
is unpickled.

References
----------
Stich, Cordonnier, Jaggi, "Sparsified SGD with Memory", NeurIPS 2018 (top-k with error feedback).
Alistarh et al., "QSGD: Communication-Efficient SGD via Gradient Quantization...", NeurIPS 2017.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Final

import torch

from workers.framing import ChunkSpec, FrameError, Header, PieceSpec, TensorSet

COMPRESSIONS: Final = ("none", "fp16", "int8", "int8-chunk", "topk")
#: Suffixes of the extra tensors of a compressed piece, and the name of a chunk's shared scale.
SCALE: Final = "#scale"
INDICES: Final = "#idx"
VALUES: Final = "#val"
FP16_MAX: Final = 65504.0


def _piece(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> PieceSpec:
    return PieceSpec(name=name, base=name, first_row=None, shape=shape, dtype=dtype)


def _lossy(p: PieceSpec) -> bool:
    """Whether a piece is compressed (a non-empty floating-point one) or travels as it is."""
    return p.dtype.is_floating_point and p.nbytes > 0


def topk_count(numel: int, k: float) -> int:
    """How many elements of a piece of `numel` elements top-k keeps (at least one)."""
    return min(numel, max(1, math.ceil(k * numel)))


class Codec:
    """One role's update codec (stateful for ``topk``: it keeps the residual of what it sent).

    Parameters
    ----------
    mode
        One of `COMPRESSIONS` other than ``none``.
    layout
        The task's chunk layout (`workers.framing.chunk_layout`).
    k
        Fraction of elements ``topk`` keeps, in (0, 1].
    """

    def __init__(self, mode: str, layout: Sequence[ChunkSpec], *, k: float = 0.01) -> None:
        if mode not in COMPRESSIONS or mode == "none":
            raise ValueError(f"unknown compression {mode!r}; choose from {', '.join(COMPRESSIONS[1:])}")
        if not 0 < k <= 1:
            raise ValueError(f"k must be in (0, 1], got {k!r}")
        self.mode = mode
        self.k = k
        self.layout = tuple(layout)
        #: What `parse_chunk` checks an incoming UPDATE chunk against.
        self.wire: tuple[ChunkSpec, ...] = tuple(self._wire_spec(c) for c in self.layout)
        self._residual: dict[int, TensorSet] = {}

    def _wire_spec(self, chunk: ChunkSpec) -> ChunkSpec:
        out: list[PieceSpec] = []
        floats = [p for p in chunk.pieces if p.dtype.is_floating_point]
        for p in chunk.pieces:
            numel = math.prod(p.shape)
            if not p.dtype.is_floating_point or numel == 0:
                out.append(_piece(p.name, p.dtype, p.shape))
            elif self.mode == "fp16":
                out.append(_piece(p.name, torch.float16, p.shape))
            elif self.mode in ("int8", "int8-chunk"):
                out.append(_piece(p.name, torch.int8, p.shape))
                if self.mode == "int8":
                    out.append(_piece(p.name + SCALE, torch.float32, (1,)))
            else:
                n = topk_count(numel, self.k)
                out += [_piece(p.name + INDICES, torch.int32, (n,)), _piece(p.name + VALUES, torch.float32, (n,))]
        if self.mode == "int8-chunk" and floats:
            out.append(_piece(SCALE, torch.float32, (1,)))
        return ChunkSpec(index=chunk.index, pieces=tuple(sorted(out, key=lambda p: p.name)))

    def wire_nbytes(self, k: int) -> int:
        """Tensor bytes of compressed chunk `k` (its safetensors header and frame header aside)."""
        return self.wire[k].nbytes

    # -- the change over the global model --------------------------------------------------------
    def delta(self, own: Mapping[str, torch.Tensor], base: Mapping[str, torch.Tensor]) -> TensorSet:
        """`own` - `base` for floating-point tensors (float32); other tensors as they are."""
        return {n: (t.detach().to(torch.float32) - base[n].to(torch.float32)) if t.is_floating_point() else t
                for n, t in own.items()}

    # -- sending -----------------------------------------------------------------------------------
    def compress(self, k: int, tensors: Mapping[str, torch.Tensor]) -> TensorSet:
        """The wire tensors of chunk `k` (`tensors`: its pieces, changes for floating-point ones)."""
        spec = self.layout[k]
        if self.mode == "topk":
            res = self._residual.get(k)
            full = {p.name: (tensors[p.name].to(torch.float32) + res[p.name]) if res and p.name in res
                    else tensors[p.name] for p in spec.pieces}
            wire = self.encode(k, full)
            back = self.decode(k, wire)
            self._residual[k] = {p.name: full[p.name].to(torch.float32) - back[p.name].to(torch.float32)
                                 for p in spec.pieces if _lossy(p)}
            return wire
        return self.encode(k, tensors)

    def encode(self, k: int, tensors: Mapping[str, torch.Tensor]) -> TensorSet:
        """Compress chunk `k` (no state)."""
        spec = self.layout[k]
        out: TensorSet = {}
        lossy = [p for p in spec.pieces if _lossy(p)]
        lossy_names = {p.name for p in lossy}
        chunk_scale = None
        if self.mode == "int8-chunk" and lossy:
            amax = max(float(tensors[p.name].abs().max()) for p in lossy)
            chunk_scale = amax / 127.0
            out[SCALE] = torch.tensor([chunk_scale], dtype=torch.float32)
        for p in spec.pieces:
            t = tensors[p.name].detach()
            if p.name not in lossy_names:
                out[p.name] = t.to(p.dtype) if p.dtype.is_floating_point else t
            elif self.mode == "fp16":
                out[p.name] = t.to(torch.float32).clamp(-FP16_MAX, FP16_MAX).to(torch.float16)
            elif self.mode in ("int8", "int8-chunk"):
                x = t.to(torch.float32)
                scale = chunk_scale if chunk_scale is not None else float(x.abs().max()) / 127.0
                q = torch.zeros_like(x) if scale == 0 else torch.round(x / scale).clamp_(-127, 127)
                out[p.name] = q.to(torch.int8)
                if self.mode == "int8":
                    out[p.name + SCALE] = torch.tensor([scale], dtype=torch.float32)
            else:
                flat = t.reshape(-1).to(torch.float32)
                n = topk_count(flat.numel(), self.k)
                idx = torch.sort(torch.topk(flat.abs(), n, sorted=False).indices).values
                out[p.name + INDICES] = idx.to(torch.int32)
                out[p.name + VALUES] = flat[idx].contiguous()
        return out

    # -- receiving ---------------------------------------------------------------------------------
    def decode(self, k: int, wire: Mapping[str, torch.Tensor], header: Header | None = None) -> TensorSet:
        """The pieces of chunk `k` (float32 for floating-point pieces) from its checked wire tensors.

        Raises
        ------
        FrameError
            ``bad_tensors``: a negative scale, top-k indices out of range or not increasing.
        """
        spec = self.layout[k]
        out: TensorSet = {}
        chunk_scale = None
        if self.mode == "int8-chunk" and SCALE in wire:
            chunk_scale = self._scale(wire[SCALE], SCALE, header)
        for p in spec.pieces:
            numel = math.prod(p.shape)
            if not p.dtype.is_floating_point or numel == 0:
                out[p.name] = wire[p.name]
            elif self.mode == "fp16":
                out[p.name] = wire[p.name].to(torch.float32)
            elif self.mode in ("int8", "int8-chunk"):
                scale = chunk_scale if chunk_scale is not None else self._scale(wire[p.name + SCALE], p.name, header)
                out[p.name] = wire[p.name].to(torch.float32) * scale
            else:
                idx = wire[p.name + INDICES].to(torch.int64)
                if idx.numel() and (int(idx[0]) < 0 or int(idx[-1]) >= numel
                                    or (idx.numel() > 1 and not bool((idx[1:] > idx[:-1]).all()))):
                    raise FrameError("bad_tensors", f"{p.name}: top-k indices must increase within 0..{numel - 1}",
                                     header)
                dense = torch.zeros(numel, dtype=torch.float32)
                dense[idx] = wire[p.name + VALUES]
                out[p.name] = dense.view(p.shape)
        return out

    @staticmethod
    def _scale(t: torch.Tensor, name: str, header: Header | None) -> float:
        s = float(t[0])
        if not s >= 0:
            raise FrameError("bad_tensors", f"{name}: the int8 scale must not be negative, got {s}", header)
        return s


def make_codec(mode: str, layout: Sequence[ChunkSpec], *, k: float = 0.01) -> Codec | None:
    """The codec of `mode` (None for ``none``: updates travel as the model's weights)."""
    return None if mode == "none" else Codec(mode, layout, k=k)
