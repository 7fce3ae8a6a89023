"""Prompt matmuls of quantized weights in bfloat16 products summed in float32, on CPUs with AVX512-BF16
(csrc/bf16_matmul.c; its oracle: kernels/reference/bf16_matmul.py).

oneDNN's bf16 mode (engine/prompt_matmul.py) is the fast path where it sums in float32 (AMX); on a Zen 4, whose
AVX512-BF16 it also uses, it rounds its sums. This kernel sums as vdpbf16ps does, in float32, in an order fixed
per output, so a row's bits never depend on the rows beside it. A weight is expanded a tile at a time into the
model's scratch, as for the float32 GEMM (kernels.reference.quant_matmul), and laid out in bfloat16 panels:

    x [M, K] float32  ── swarm::bf16_round_rows ──▶ pairs [M, K/2]        once a call
    tile of W         ── swarm::bf16_pack_quant ──▶ panels [rows/16, K/2, 16]   (64 rows at a time expanded
                         in the cache, for the formats csrc/quant_matmul.c reads)
                      ── expand (float32, in the scratch) ── swarm::bf16_pack_weight ──▶ panels   (the others)
    pairs, panels     ── swarm::bf16_matmul ──▶ out[:, tile's columns] (+ bias)

Where the build has no AVX512-BF16 the same C code runs plain (`native()` is False): the same bits, far slower,
for tests; `dtype: auto` takes this path only where the machine probe timed it native and fast.
"""
from __future__ import annotations

import ctypes

import torch

from kernels.cpu import entry_points, ops
from kernels.reference.quant_blocks import QuantizedTensor
from kernels.reference.quant_matmul import (
    DEFAULT_TILE_BYTES,
    DequantScratch,
    TileExpander,
    reference_expansion,
    tile_rows,
)

TILE_MULTIPLE = 64   # weight rows: whole steps of the kernel (4 panels of 16)


def available() -> bool:
    return entry_points.library("bf16_matmul") is not None


def native(library: ctypes.CDLL | None = None) -> bool:
    """Whether the build multiplies on AVX512-BF16 (library: another build, for tests)."""
    library = library or entry_points.library("bf16_matmul")
    return library is not None and library.swarm_bf16_native() == 1


def linear(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
           library: ctypes.CDLL | None = None) -> torch.Tensor:
    """x [M, K] @ w [N, K].T + bias, float32 CPU tensors."""
    out = torch.empty(x.shape[0], w.shape[0])
    panels = torch.empty(entry_points.bf16_panels_shape(*w.shape), dtype=torch.int32)
    pairs = ops.bf16_round_rows(x.contiguous(), library=library)
    ops.bf16_pack_weight(w.contiguous(), panels, library=library)
    ops.bf16_matmul(pairs, panels, w.shape[0], bias, out, 0, library=library)
    return out


def quantized_linear(x: torch.Tensor, weight: QuantizedTensor, bias: torch.Tensor | None, scratch: DequantScratch,
                     expand: TileExpander | None = None, tile_bytes: int = DEFAULT_TILE_BYTES) -> torch.Tensor:
    """x [..., K] float32 @ W.T + bias for a weight kept in blocks, expanded by the C code where it reads the
    format; otherwise, or where `expand` is given, by `expand` (gguf_dequant's by default), a tile of rows in
    float32 in `scratch`."""
    rows, cols = weight.shape
    if expand is None and weight.format not in entry_points.QUANT_FORMATS:
        expand = reference_expansion
    flat = x.reshape(-1, cols).contiguous()
    out = torch.empty(flat.shape[0], rows)
    pairs = ops.bf16_round_rows(flat)
    step = tile_rows(rows, cols, 4, tile_bytes)
    step = step if step == rows else max(TILE_MULTIPLE, step // TILE_MULTIPLE * TILE_MULTIPLE)
    for start in range(0, rows, step):
        stop = min(start + step, rows)
        shape = entry_points.bf16_panels_shape(stop - start, cols)
        panels = scratch.take(shape[0] * shape[1], shape[2], torch.int32, flat.device).view(shape)
        if expand is None:
            ops.bf16_pack_quant(weight.blocks[start:stop], weight.format, cols, panels)
        else:
            tile = expand(weight, (start, stop), scratch.take(stop - start, cols, torch.float32, flat.device))
            ops.bf16_pack_weight(tile, panels)
        ops.bf16_matmul(pairs, panels, stop - start, None if bias is None else bias[start:stop], out, start)
    return out.reshape(*x.shape[:-1], rows)


def pack_quantized(weight: QuantizedTensor) -> torch.Tensor:
    """The whole weight as bfloat16 panels (entry_points.bf16_panels_shape), once: the tiles quantized_linear
    expands on each call, kept."""
    panels = torch.empty(entry_points.bf16_panels_shape(*weight.shape), dtype=torch.int32)
    if weight.format in entry_points.QUANT_FORMATS:
        ops.bf16_pack_quant(weight.blocks, weight.format, weight.cols, panels)
    else:
        ops.bf16_pack_weight(reference_expansion(weight, (0, weight.shape[0]),
                                                 torch.empty(weight.shape, dtype=torch.float32)), panels)
    return panels


def packed_linear(x: torch.Tensor, panels: torch.Tensor, rows: int, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., K] float32 @ W.T + bias for a weight of `rows` rows packed by pack_quantized: quantized_linear's
    bits, without expanding the weight."""
    cols = x.shape[-1]
    flat = x.reshape(-1, cols).contiguous()
    out = torch.empty(flat.shape[0], rows)
    ops.bf16_matmul(ops.bf16_round_rows(flat), panels, rows, bias, out, 0)
    return out.reshape(*x.shape[:-1], rows)
