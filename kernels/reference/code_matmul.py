"""The oracle of kernels/cpu/csrc/code_matmul.c in plain PyTorch and NumPy: a quantized weight's integer codes and
each sub-block's (a, c), read from its GGUF blocks, and y = x @ W.T + bias summed as the kernel's top says:

    for each sub-block b of 32 columns, from acc = 0:
        S = vdpbf16ps's sum over the sub-block's pairs of bfloat16 x and B + code (bf16_matmul's order)
        acc = acc + S * a
        4-bit codes (B = 128): X = the sub-block's bfloat16 x summed in float32, column by column, and
                               acc = acc + (c - 128 a) * X
    y = acc + bias                                                    (8-bit codes, Q8_0: B = 0, c = 0)

W[n, k] = a * code + c is gguf's value (tests check it against gguf.quants.dequantize).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from kernels.reference.bf16_matmul import _flushed, _rounded
from kernels.reference.quant_blocks import QuantizedTensor

NIBBLE_BIAS = 128.0
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q4_K": 144, "Q8_0": 34}


def codes_and_scales(weight: QuantizedTensor) -> tuple[Tensor, Tensor, Tensor]:
    """codes [rows, cols] (0-15, or -128-127 for Q8_0), a and c [rows, cols / 32] float32: value (n, k) =
    a * code + c"""
    raw = weight.blocks.numpy()
    blocks = raw.reshape(raw.shape[0], -1, BLOCK_BYTES[weight.format])
    codes, a, c = _q4_k(blocks) if weight.format == "Q4_K" else _one_sub_block(blocks, weight.format)
    return torch.from_numpy(codes.reshape(raw.shape[0], -1).astype(np.int32)), torch.from_numpy(a), torch.from_numpy(c)


def _halves(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)[..., 0]


def _one_sub_block(blocks: np.ndarray, format: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _halves(blocks[..., 0:2])
    if format == "Q8_0":
        return blocks[..., 2:34].view(np.int8), d, np.zeros_like(d)
    nibbles = blocks[..., 4:20] if format == "Q4_1" else blocks[..., 2:18]
    codes = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)
    c = _halves(blocks[..., 2:4]) if format == "Q4_1" else np.float32(-8.0) * d
    return codes, d, c


def _q4_k(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d, dmin = _halves(blocks[..., 0:2]), _halves(blocks[..., 2:4])
    scales = blocks[..., 4:16].astype(np.int32)
    low = scales[..., :4], scales[..., 4:8], scales[..., 8:12]
    sc = np.concatenate([low[0] & 63, (low[2] & 0x0F) | (low[0] >> 6) << 4], axis=-1)
    mn = np.concatenate([low[1] & 63, (low[2] >> 4) | (low[1] >> 6) << 4], axis=-1)
    qs = blocks[..., 16:144].reshape(*blocks.shape[:-1], 4, 32)
    codes = np.stack([qs & 0x0F, qs >> 4], axis=-2).reshape(*blocks.shape[:-1], 256)
    a = d[..., None] * sc.astype(np.float32)
    c = -(dmin[..., None] * mn.astype(np.float32))
    return codes, a.reshape(blocks.shape[0], -1), c.reshape(blocks.shape[0], -1)


def code_matmul(x: Tensor, weight: QuantizedTensor, bias: Tensor | None = None) -> Tensor:
    """x [M, K] float32 @ W.T + bias, summed as the kernel sums it"""
    codes, a, c = codes_and_scales(weight)
    nibbles = weight.format != "Q8_0"
    xs = _rounded(x)
    rows, cols = x.shape[0], x.shape[1]
    subs = cols // 32
    xb = xs.reshape(rows, 1, subs, 32)
    wb = (codes.float() + (NIBBLE_BIAS if nibbles else 0.0)).reshape(1, codes.shape[0], subs, 32)
    sums = torch.zeros(rows, codes.shape[0], subs)
    for k in range(0, 32, 2):
        sums = _flushed(sums + xb[..., k + 1] * wb[..., k + 1])
        sums = _flushed(sums + xb[..., k] * wb[..., k])
    totals = torch.zeros(rows, subs)
    for k in range(32):
        totals = totals + xs.reshape(rows, subs, 32)[..., k]
    offset = c - a * NIBBLE_BIAS
    acc = torch.zeros(rows, codes.shape[0])
    for b in range(subs):
        acc = acc + sums[..., b] * a[None, :, b]
        if nibbles:
            acc = acc + offset[None, :, b] * totals[:, None, b]
    return acc if bias is None else acc + bias
