"""The prefill matmul from GGUF blocks: out [M, N] = x [M, K] @ W.T for many rows, on tl.dot.

    program p -> (n tile p // m_tiles, m tile p % m_tiles): the programs that run together share
    one W tile, so its bytes come from the cache after the first expansion.
    per BLOCK_K columns:  x tile [BLOCK_M, BLOCK_K]  (x's dtype)
                          W tile [BLOCK_N, BLOCK_K]  expanded to float32, rounded to x's dtype
                          acc   [BLOCK_M, BLOCK_N]  += x tile @ W tile.T  (float32)

float32 x multiplies in IEEE float32 (no TF32). Under the interpreter the dot runs on float32 copies
(it cannot multiply bfloat16); products of 16-bit floats are exact in float32, so that is the
GPU's arithmetic too.
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton.quant_expand import expand_tile


@triton.jit
def prefill_kernel(x_ptr, blocks_ptr, bias_ptr, out_ptr, m_rows, n, cols, row_bytes, m_tiles,
                   sx_m, sx_k, so_m,
                   FORMAT: tl.constexpr, BLOCK_VALUES: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                   GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, UPCAST: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    p = tl.program_id(0)
    m = (p % m_tiles) * BLOCK_M + tl.arange(0, BLOCK_M)
    rows = (p // m_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok, row_ok = m < m_rows, rows < n
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, cols, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m.to(tl.int64)[:, None] * sx_m + k[None, :] * sx_k,
                    mask=m_ok[:, None] & (k < cols)[None, :], other=0.0)
        w = expand_tile(blocks_ptr, rows, row_ok, row_bytes, k0, cols,
                        FORMAT, BLOCK_VALUES, BLOCK_BYTES, GROUP, BLOCK_N, BLOCK_K).to(x.dtype)
        if UPCAST:
            acc += tl.dot(x.to(tl.float32), tl.trans(w).to(tl.float32), input_precision="ieee")
        else:
            acc += tl.dot(x, tl.trans(w), input_precision="ieee")
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + m.to(tl.int64)[:, None] * so_m + rows[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=m_ok[:, None] & row_ok[None, :])
