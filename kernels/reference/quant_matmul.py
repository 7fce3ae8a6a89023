"""`x @ W.T + bias` for a weight kept in its GGUF blocks: dequantize a tile of output rows into a
reused scratch buffer, multiply it with the device's own GEMM, move on to the next tile.

The fallback on every device and the reference the C and Triton kernels are checked against. The
tile bound keeps the float copy small: an 8B model's 151,936 x 4,096 lm_head is never held as floats,
only a tile of it at a time (32 MiB by default), in one scratch that every layer shares.

    W rows    0 ........ t ........ 2t ....... rows
              [ tile 0  ][ tile 1  ][ last, partial ]   each dequantized into the same scratch
    out cols  [ x @ T0.T ][ x @ T1.T ][ x @ T2.T ]      written in place, bias added with them
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernels.reference import gguf_dequant
from kernels.reference.quant_blocks import QuantizedTensor

DEFAULT_TILE_BYTES = 32 << 20

# (weight, (first row, stop row), out [rows, cols] view of the scratch) -> out, filled with the rows' values
TileExpander = Callable[[QuantizedTensor, tuple[int, int], Tensor], Tensor]


class DequantScratch:
    """Float buffers for dequantized tiles, one per (device, dtype), grown on demand and never shrunk.
    One per engine, shared by every layer: a tile is dead once its matmul is done."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[torch.device, torch.dtype], Tensor] = {}

    def take(self, rows: int, cols: int, dtype: torch.dtype, device: torch.device) -> Tensor:
        """A [rows, cols] view of the buffer for (device, dtype), with stale contents; valid until the
        next `take` for the same device and dtype."""
        key = (torch.device(device), dtype)
        buffer = self._buffers.get(key)
        if buffer is None or buffer.numel() < rows * cols:
            self._buffers.pop(key, None)   # free the old buffer before the larger one is allocated
            buffer = self._buffers[key] = torch.empty(rows * cols, dtype=dtype, device=device)
        return buffer[:rows * cols].view(rows, cols)

    @property
    def nbytes(self) -> int:
        return sum(buffer.numel() * buffer.element_size() for buffer in self._buffers.values())


def dequant_matmul(x: Tensor, weight: QuantizedTensor, bias: Tensor | None = None,
                   scratch: DequantScratch | None = None, tile_bytes: int = DEFAULT_TILE_BYTES,
                   dequantize: TileExpander | None = None) -> Tensor:
    """x [..., cols] (any float dtype, on the weight's device) @ weight.T + bias -> [..., rows] in x's
    dtype. Tiles of at most `tile_bytes` of x's dtype (the whole weight when it is smaller) are
    dequantized into `scratch` in x's dtype, by `dequantize` (a faster expansion, such as the C one;
    gguf_dequant's by default); the bias is cast to x's dtype."""
    rows, cols = weight.shape
    assert x.shape[-1] == cols, f"x has {x.shape[-1]} columns, the weight {cols}"
    assert x.device == weight.device, f"x is on {x.device}, the weight on {weight.device}"
    scratch = DequantScratch() if scratch is None else scratch
    expand = dequantize or reference_expansion
    flat = x.reshape(-1, cols)
    out = torch.empty(flat.shape[0], rows, dtype=x.dtype, device=x.device)
    bias = None if bias is None else bias.to(x.dtype)
    step = tile_rows(rows, cols, x.element_size(), tile_bytes)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        tile = expand(weight, (start, stop), scratch.take(stop - start, cols, x.dtype, x.device))
        _multiply_into(out[:, start:stop], flat, tile, None if bias is None else bias[start:stop])
    return out.reshape(*x.shape[:-1], rows)


def tile_rows(rows: int, cols: int, element_size: int, tile_bytes: int) -> int:
    """Rows of the weight one tile holds: as many as fit in `tile_bytes`, at least one, at most all."""
    return max(1, min(rows, tile_bytes // (cols * element_size)))


def reference_expansion(weight: QuantizedTensor, rows: tuple[int, int], out: Tensor) -> Tensor:
    """Rows [r0, r1) of the weight into out, in out's dtype, by gguf_dequant (the expansion of any format)."""
    return gguf_dequant.dequantize(weight, rows, out=out)


def _multiply_into(out: Tensor, x: Tensor, tile: Tensor, bias: Tensor | None) -> None:
    """out [M, t] (a column slice of the result) = x @ tile.T + bias, written in place."""
    if bias is None:
        torch.mm(x, tile.t(), out=out)
    else:
        torch.addmm(bias, x, tile.t(), out=out)
