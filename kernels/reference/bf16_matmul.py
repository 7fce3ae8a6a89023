"""The oracle of kernels/cpu/csrc/bf16_matmul.c in plain PyTorch: x @ W.T + bias from bfloat16 products summed in
float32, as AVX512-BF16's vdpbf16ps sums them.

Both inputs are rounded to bfloat16 (to nearest, ties to even; values below 2^-126 flushed to zero). For each
output, over the pairs (k, k + 1) of columns in order, from sum = 0:

    sum = flush(sum + x[k + 1] * w[k + 1]);  sum = flush(sum + x[k] * w[k])

each product exact in float32 (8-bit significands), each sum rounded to float32; then y = sum + bias. An odd
column count ends in a pair whose second column is zero. Slow (a float32 op a column over [M, N]), for tests.
"""
from __future__ import annotations

import torch
from torch import Tensor

SMALLEST_NORMAL = 2.0 ** -126


def bf16_matmul(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [M, K] @ w [N, K].T + bias [N], float32 in and out"""
    xs, ws = _rounded(x), _rounded(w)
    if xs.shape[1] % 2:
        xs, ws = _padded(xs), _padded(ws)
    total = torch.zeros(x.shape[0], w.shape[0], dtype=torch.float32)
    for k in range(0, xs.shape[1], 2):
        total = _flushed(total + xs[:, k + 1, None] * ws[None, :, k + 1])
        total = _flushed(total + xs[:, k, None] * ws[None, :, k])
    return total if bias is None else total + bias


def _rounded(values: Tensor) -> Tensor:
    return _flushed(values.float().bfloat16().float())


def _flushed(values: Tensor) -> Tensor:
    return torch.where(values.abs() < SMALLEST_NORMAL, torch.zeros_like(values).copysign(values), values)


def _padded(values: Tensor) -> Tensor:
    return torch.cat([values, values.new_zeros(values.shape[0], 1)], dim=1)


def lanes_matmul(x: Tensor, w: Tensor, bias: Tensor | None = None) -> Tensor:
    """x [M, K] @ w [N, K].T + bias [N] as csrc/quant_matmul.c sums a decode row's bfloat16 products: both inputs
    rounded as above; 8 lanes, lane 4 h + i taking the pairs (k, k + 1), k = 32 s + 16 c + 8 h + 2 i, for each
    sub-block s of 32 columns and c = 0, 1 in turn, from 0, as vdpbf16ps sums a pair (see bf16_matmul); then
    y = ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) + bias. K is a multiple of 32."""
    xs, ws = _rounded(x), _rounded(w)
    lanes = torch.zeros(x.shape[0], w.shape[0], 8, dtype=torch.float32)
    pairs = torch.arange(0, 16, 2)   # the first column of each lane's pair in 16 columns: lane = (k % 16) / 2
    for k0 in range(0, xs.shape[1], 16):
        high, low = k0 + pairs + 1, k0 + pairs
        lanes = _flushed(lanes + xs[:, None, high] * ws[None, :, high])
        lanes = _flushed(lanes + xs[:, None, low] * ws[None, :, low])
    r = lanes.unbind(-1)
    total = ((r[0] + r[4]) + (r[2] + r[6])) + ((r[1] + r[5]) + (r[3] + r[7]))
    return total if bias is None else total + bias
