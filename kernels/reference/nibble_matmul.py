"""The oracle of kernels/cpu/csrc/nibble_matmul.c in plain PyTorch and NumPy: a 4-bit weight's codes and each
sub-block's (a, c), read from its GGUF blocks, and y = x @ W.T + bias summed as the kernel's top says:

    for each sub-block b of 32 columns, from acc = 0:
        S = vdpbf16ps's sum over the sub-block's pairs of bfloat16 x and 128 + code (bf16_matmul's order)
        X = the sub-block's bfloat16 x summed in float32, column by column
        acc = acc + S * a;  acc = acc + (c - 128 a) * X
    y = acc + bias

W[n, k] = a * code + c is gguf's value, bit for bit (tests check it against gguf.quants.dequantize).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from kernels.reference.bf16_matmul import _flushed, _rounded
from kernels.reference.quant_blocks import QuantizedTensor

CODE_BIAS = 128.0


def codes_and_scales(weight: QuantizedTensor) -> tuple[Tensor, Tensor, Tensor]:
    """codes [rows, cols] (0-15), a and c [rows, cols / 32] float32: value (n, k) = a * code + c"""
    raw = weight.blocks.numpy()
    if weight.format == "Q4_K":
        codes, a, c = _q4_k(raw.reshape(raw.shape[0], -1, 144))
    else:
        codes, a, c = _q4_0_or_1(raw.reshape(raw.shape[0], -1, 20 if weight.format == "Q4_1" else 18), weight.format)
    return torch.from_numpy(codes.reshape(raw.shape[0], -1)), torch.from_numpy(a), torch.from_numpy(c)


def _halves(raw: np.ndarray) -> np.ndarray:
    return raw.copy().view(np.float16).astype(np.float32)[..., 0]


def _q4_0_or_1(blocks: np.ndarray, format: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = _halves(blocks[..., 0:2])
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
    a = (d[..., None] * sc.astype(np.float32)).astype(np.float32)
    c = -(dmin[..., None] * mn.astype(np.float32)).astype(np.float32)
    return codes, a.reshape(blocks.shape[0], -1), c.reshape(blocks.shape[0], -1)


def nibble_matmul(x: Tensor, weight: QuantizedTensor, bias: Tensor | None = None) -> Tensor:
    """x [M, K] float32 @ W.T + bias, summed as the kernel sums it"""
    codes, a, c = codes_and_scales(weight)
    xs = _rounded(x)
    rows, cols = x.shape[0], x.shape[1]
    subs = cols // 32
    xb = xs.reshape(rows, 1, subs, 32)
    wb = (codes.float() + CODE_BIAS).reshape(1, codes.shape[0], subs, 32)
    sums = torch.zeros(rows, codes.shape[0], subs)
    for k in range(0, 32, 2):
        sums = _flushed(sums + xb[..., k + 1] * wb[..., k + 1])
        sums = _flushed(sums + xb[..., k] * wb[..., k])
    totals = torch.zeros(rows, subs)
    for k in range(32):
        totals = totals + xs.reshape(rows, subs, 32)[..., k]
    offset = c - a * CODE_BIAS
    acc = torch.zeros(rows, codes.shape[0])
    for b in range(subs):
        acc = acc + sums[..., b] * a[None, :, b]
        acc = acc + offset[None, :, b] * totals[:, None, b]
    return acc if bias is None else acc + bias
