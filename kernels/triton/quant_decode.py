"""The decode matmul from GGUF blocks: out [M, N] = x [M, K] @ W.T + bias for a few rows of x, each
weight byte read once a step whatever M is (decode is bound by the weights' bytes).

    grid (n tile, split)   a program owns BLOCK_N rows of W and the columns
                           [split * split_len, + split_len) of K
    per BLOCK_K columns    W tile [BLOCK_N, BLOCK_K] expanded to float32 (gguf's values exactly)
                           x tile [ROWS, BLOCK_K] as float32 (ROWS: M up to a power of two)
                           acc [ROWS, BLOCK_N] += x tile @ W tile.T, an IEEE float32 dot

Triton lowers an IEEE float32 tl.dot to multiply-adds where the GPU has no float32 matrix unit
(NVIDIA, RDNA), one chain in k order for each output: a row's result depends neither on the other
rows nor on M, and each thread keeps its share of the K sum in registers (a tl.sum of a broadcast
product instead crossed lanes every step).

A K split across programs (for occupancy when N is small; it depends on N, K and the GPU, never on
M) writes float32 partials [split, M, N] that `sum_splits_kernel` adds in split order:
deterministic, unlike atomics.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton.quant_expand import expand_tile


@triton.jit(do_not_specialize=["m_rows"])
def decode_kernel(x_ptr, blocks_ptr, bias_ptr, out_ptr, m_rows, n, cols, row_bytes, split_len,
                  sx_m, sx_k, so_split, so_m,
                  FORMAT: tl.constexpr, BLOCK_VALUES: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                  GROUP: tl.constexpr, HAS_BIAS: tl.constexpr,
                  ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    split = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    r = tl.arange(0, ROWS)
    row_ok, r_ok = rows < n, r < m_rows
    acc = tl.zeros([ROWS, BLOCK_N], tl.float32)
    k_start = split * split_len
    k_end = tl.minimum(cols, k_start + split_len)
    for k0 in range(k_start, k_end, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + r[:, None] * sx_m + k[None, :] * sx_k,
                    mask=r_ok[:, None] & (k < k_end)[None, :], other=0.0).to(tl.float32)
        w = expand_tile(blocks_ptr, rows, row_ok, row_bytes, k0, k_end,
                        FORMAT, BLOCK_VALUES, BLOCK_BYTES, GROUP, BLOCK_N, BLOCK_K)
        acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + split * so_split + r[:, None] * so_m + rows[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=r_ok[:, None] & row_ok[None, :])


@triton.jit
def sum_splits_kernel(part_ptr, bias_ptr, out_ptr, splits, count, n,
                      HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    """out (flat [M * N]) = the sum over splits of part [splits, M * N], in split order, + bias."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = i < count
    total = tl.zeros([BLOCK], tl.float32)
    for split in range(splits):
        total += tl.load(part_ptr + split * count + i, mask=ok, other=0.0)
    if HAS_BIAS:
        total += tl.load(bias_ptr + i % n, mask=ok, other=0.0).to(tl.float32)
    tl.store(out_ptr + i, total.to(out_ptr.dtype.element_ty), mask=ok)
