"""GGUF blocks to floats in plain PyTorch: the values gguf's own dequantizer gives, on any device.

`dequantize` expands rows of a QuantizedTensor; `dequantize_rows` expands a gather of rows (the
embedding lookup of a quantized token_embd). In float32 the values are bitwise gguf.quants'.
Each format's decoder takes whole blocks, uint8 [n, block bytes], and repeats gguf's float32
operations in gguf's order, so every product that float32 cannot hold exactly is rounded where
gguf rounds it. Block layouts (byte offsets, as in ggml-common.h):

    Q8_0   d 0:2                       qs 2:34 (int8)
    Q4_0   d 0:2                       qs 2:18 (nibbles)
    Q4_1   d 0:2  m 2:4                qs 4:20
    Q5_0   d 0:2         qh 2:6        qs 6:22
    Q5_1   d 0:2  m 2:4  qh 4:8        qs 8:24
    Q4_K   d 0:2  dmin 2:4  scales 4:16            qs 16:144
    Q5_K   d 0:2  dmin 2:4  scales 4:16  qh 16:48  qs 48:176
    Q6_K   ql 0:128  qh 128:192  scales 192:208 (int8)  d 208:210
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernels.reference.quant_blocks import FLOAT_DTYPES, QuantizedTensor, block_layout

# Rows are decoded this many values at a time, which bounds the float32 temporaries of one call.
CHUNK_VALUES = 1 << 20


def dequantize(weight: QuantizedTensor, rows: tuple[int, int] | None = None, out: Tensor | None = None,
               dtype: torch.dtype = torch.float32) -> Tensor:
    """The values of rows [r0, r1) of `weight` (all rows by default) as [r1 - r0, cols] floats, written
    into `out` when given (any float dtype, on the weight's device), else into a new `dtype` tensor.
    Computed in float32; the cast to a narrower dtype is the only rounding."""
    first, stop = rows if rows is not None else (0, weight.shape[0])
    assert 0 <= first <= stop <= weight.shape[0], f"rows {first}:{stop} of a {weight.shape[0]}-row weight"
    if out is None:
        out = torch.empty(stop - first, weight.cols, dtype=dtype, device=weight.device)
    assert out.shape == (stop - first, weight.cols), f"out is {tuple(out.shape)}, rows {first}:{stop}"
    assert out.is_floating_point() and out.device == weight.device, "out: floats on the weight's device"
    step = max(1, CHUNK_VALUES // weight.cols)
    for start in range(first, stop, step):
        end = min(start + step, stop)
        out[start - first:end - first].copy_(_decode(weight.blocks[start:end], weight.format, weight.cols))
    return out


def dequantize_rows(weight: QuantizedTensor, ids: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Rows `ids` (int64 row indices, any shape) as floats [*ids.shape, cols]: only their blocks are
    gathered and expanded."""
    picked = weight.rows(ids.reshape(-1))
    return dequantize(picked, dtype=dtype).reshape(*ids.shape, weight.cols)


def _decode(blocks: Tensor, format: str, cols: int) -> Tensor:
    """uint8 [rows, row bytes] -> [rows, cols] floats (float32, or the stored dtype for float formats)."""
    if format in FLOAT_DTYPES:
        return blocks.view(FLOAT_DTYPES[format])
    _, nbytes = block_layout(format)
    return DECODERS[format](blocks.reshape(-1, nbytes)).reshape(blocks.shape[0], cols)


def _fp16(blocks: Tensor, offset: int) -> Tensor:
    """The fp16 at byte `offset` of each block, as float32 [n, 1]."""
    return blocks[:, offset:offset + 2].contiguous().view(torch.float16).to(torch.float32)


def _fields(packed: Tensor, width: int, dim: int) -> Tensor:
    """The `width`-bit fields of each byte, lowest first, stacked along a new axis `dim`."""
    mask = (1 << width) - 1
    return torch.stack([(packed >> shift) & mask for shift in range(0, 8, width)], dim=dim)


def _low_nibbles_then_high(packed: Tensor) -> Tensor:
    """uint8 [n, k] -> [n, 2k]: the low nibble of each byte, then the high nibbles."""
    return _fields(packed, 4, -2).reshape(packed.shape[0], -1)


def _decode_q8_0(blocks: Tensor) -> Tensor:
    d = _fp16(blocks, 0)
    return blocks[:, 2:].view(torch.int8).to(torch.float32) * d


def _decode_q4_0(blocks: Tensor) -> Tensor:
    d = _fp16(blocks, 0)
    q = _low_nibbles_then_high(blocks[:, 2:]).to(torch.int8) - 8
    return d * q.to(torch.float32)


def _decode_q4_1(blocks: Tensor) -> Tensor:
    d, m = _fp16(blocks, 0), _fp16(blocks, 2)
    q = _low_nibbles_then_high(blocks[:, 4:]).to(torch.float32)
    return q.mul_(d).add_(m)


def _five_bit(qh: Tensor, qs: Tensor) -> Tensor:
    """Q5_0/Q5_1 codes: 4 low bits from the nibbles, the fifth from bit i of the little-endian qh."""
    high = _fields(qh, 1, -1).reshape(qh.shape[0], 32)
    return _low_nibbles_then_high(qs) | (high << 4)


def _decode_q5_0(blocks: Tensor) -> Tensor:
    d = _fp16(blocks, 0)
    q = _five_bit(blocks[:, 2:6], blocks[:, 6:]).to(torch.int8) - 16
    return d * q.to(torch.float32)


def _decode_q5_1(blocks: Tensor) -> Tensor:
    d, m = _fp16(blocks, 0), _fp16(blocks, 2)
    q = _five_bit(blocks[:, 4:8], blocks[:, 8:]).to(torch.float32)
    return q.mul_(d).add_(m)


def _k_scales_and_mins(packed: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K/Q5_K: the 8 six-bit sub-block scales and mins packed in 12 bytes, as float32 [n, 8]."""
    low, mid, top = packed.reshape(-1, 3, 4).unbind(1)
    scales = torch.cat([low & 0x3F, (top & 0x0F) | ((low >> 2) & 0x30)], dim=-1)
    mins = torch.cat([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], dim=-1)
    return scales.to(torch.float32), mins.to(torch.float32)


def _scaled_minus_min(blocks: Tensor, q: Tensor) -> Tensor:
    """Q4_K/Q5_K: (d * scale) * q - (dmin * min) per 32-value sub-block; q: float32 [n, 8, 32]."""
    scales, mins = _k_scales_and_mins(blocks[:, 4:16])
    d = (_fp16(blocks, 0) * scales).unsqueeze(-1)
    dm = (_fp16(blocks, 2) * mins).unsqueeze(-1)
    return q.mul_(d).sub_(dm).reshape(-1, 256)


def _decode_q4_k(blocks: Tensor) -> Tensor:
    q = _fields(blocks[:, 16:].reshape(-1, 4, 32), 4, -2).reshape(-1, 8, 32)
    return _scaled_minus_min(blocks, q.to(torch.float32))


def _decode_q5_k(blocks: Tensor) -> Tensor:
    low = _fields(blocks[:, 48:].reshape(-1, 4, 32), 4, -2).reshape(-1, 8, 32)
    high = _fields(blocks[:, 16:48], 1, -2)
    return _scaled_minus_min(blocks, (low | (high << 4)).to(torch.float32))


def _decode_q6_k(blocks: Tensor) -> Tensor:
    low = _fields(blocks[:, :128].reshape(-1, 2, 64), 4, -2).reshape(-1, 8, 32)
    high = _fields(blocks[:, 128:192].reshape(-1, 2, 32), 2, -2).reshape(-1, 8, 32)
    q = ((low | (high << 4)).to(torch.int8) - 32).reshape(-1, 16, 16).to(torch.float32)
    scales = blocks[:, 192:208].view(torch.int8).to(torch.float32)
    d = (_fp16(blocks, 208) * scales).unsqueeze(-1)
    return q.mul_(d).reshape(-1, 256)


DECODERS: dict[str, Callable[[Tensor], Tensor]] = {
    "Q8_0": _decode_q8_0, "Q4_0": _decode_q4_0, "Q4_1": _decode_q4_1, "Q5_0": _decode_q5_0,
    "Q5_1": _decode_q5_1, "Q4_K": _decode_q4_k, "Q5_K": _decode_q5_k, "Q6_K": _decode_q6_k,
}
