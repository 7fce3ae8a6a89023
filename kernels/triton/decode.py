"""Triton kernels for decode attention with log-sum-exp: paged rows, a shared prefix, the
reduction of a context split across programs, and the merge of two softmax pieces.
Launchers live in `kernels.triton.attention`.

Both attention kernels walk keys in tiles of TILE_N tokens with an online softmax (base 2),
and each program handles one KV head with all the query heads that read it (GQA):

    paged   grid (row, kv_head, split)   q: the row's GROUP query heads     [GROUP_P, D]
            keys: tokens [split * split_len, +split_len) of the row's block table,
            token t at block_table[t // BLOCK_SIZE], slot t % BLOCK_SIZE
    prefix  grid (kv_head, m_tile, split)   q: every row x GROUP query heads  [BLOCK_M, D]
            keys: tokens [split * split_len, +split_len) of the shared prefix, so each
            K/V tile is read once for all rows (once per m_tile)

Each program writes a partial (out, lse) at [row, head, split]; `reduce_splits_kernel`
merges the splits. An empty range gives out = 0, lse = -inf, which merges as nothing.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _dot(a, b, UPCAST: tl.constexpr):
    # The interpreter cannot multiply bfloat16 (triton-lang/triton#11584); products of
    # 16-bit floats are exact in float32, so upcasting matches the GPU's fp32 accumulation.
    if UPCAST:
        product = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        product = tl.dot(a, b, input_precision="ieee")
    return product


@triton.jit
def _attend_tile(q, k, v, valid, m, l, acc, qk_scale, UPCAST: tl.constexpr):
    """One online-softmax step: scores of q [M, D] against k [N, D], values v [N, D]; valid, the keys
    every row may see [N], or the keys each row may see [M, N] (causal prefill)."""
    s = _dot(q, tl.trans(k), UPCAST) * qk_scale
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m, tl.max(s, axis=1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m - m_use)
    p = tl.exp2(s - m_use[:, None])
    l = l * alpha + tl.sum(p, axis=1)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, UPCAST)
    return m_new, l, acc


@triton.jit
def _store_partial(out_ptr, lse_ptr, part, dim, m, l, acc, row_ok, d):
    """part [M]: index of (row, head, split) in the partial buffers."""
    has = l > 0
    l_use = tl.where(has, l, 1.0)
    out = tl.where(has[:, None], acc / l_use[:, None], 0.0)
    lse = tl.where(has, (m + tl.log2(l_use)) * 0.6931471805599453, float("-inf"))
    tl.store(out_ptr + part[:, None] * dim + d[None, :], out, mask=row_ok[:, None] & (d < dim)[None, :])
    tl.store(lse_ptr + part, lse, mask=row_ok)


@triton.jit
def paged_decode_kernel(q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, lengths_ptr, out_ptr, lse_ptr,
                        qk_scale, split_len, heads, dim,
                        sq_b, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d, sv_b, sv_s, sv_h, sv_d, st_b, st_w,
                        GROUP: tl.constexpr, GROUP_P: tl.constexpr, DIM_P: tl.constexpr,
                        BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr, UPCAST: tl.constexpr):
    row, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    g, d = tl.arange(0, GROUP_P), tl.arange(0, DIM_P)
    head = kv_head * GROUP + g
    g_ok, d_ok = g < GROUP, d < dim
    q = tl.load(q_ptr + row * sq_b + head[:, None] * sq_h + d[None, :] * sq_d,
                mask=g_ok[:, None] & d_ok[None, :], other=0.0).to(k_cache_ptr.dtype.element_ty)
    m = tl.full([GROUP_P], float("-inf"), tl.float32)
    l = tl.zeros([GROUP_P], tl.float32)
    acc = tl.zeros([GROUP_P, DIM_P], tl.float32)
    start = split * split_len
    end = tl.minimum(tl.load(lengths_ptr + row).to(tl.int32), start + split_len)
    for first in range(start, end, TILE_N):
        n = first + tl.arange(0, TILE_N)
        valid = n < end
        block = tl.load(tables_ptr + row * st_b + (n // BLOCK_SIZE) * st_w, mask=valid, other=0)
        slot = (n % BLOCK_SIZE)[:, None]
        kv_ok = valid[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + block[:, None] * sk_b + slot * sk_s + kv_head * sk_h + d[None, :] * sk_d,
                    mask=kv_ok, other=0.0)
        v = tl.load(v_cache_ptr + block[:, None] * sv_b + slot * sv_s + kv_head * sv_h + d[None, :] * sv_d,
                    mask=kv_ok, other=0.0)
        m, l, acc = _attend_tile(q, k, v, valid, m, l, acc, qk_scale, UPCAST)
    part = (row * heads + head) * tl.num_programs(2) + split
    _store_partial(out_ptr, lse_ptr, part, dim, m, l, acc, g_ok, d)


@triton.jit
def prefix_kernel(q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr,
                  qk_scale, split_len, prefix_len, batch, heads, dim,
                  sq_b, sq_h, sq_d, sk_n, sk_h, sk_d, sv_n, sv_h, sv_d,
                  GROUP: tl.constexpr, BLOCK_M: tl.constexpr, DIM_P: tl.constexpr,
                  TILE_N: tl.constexpr, UPCAST: tl.constexpr):
    kv_head, m_tile, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    r, d = m_tile * BLOCK_M + tl.arange(0, BLOCK_M), tl.arange(0, DIM_P)
    row, head = r // GROUP, kv_head * GROUP + r % GROUP
    r_ok, d_ok = r < batch * GROUP, d < dim
    q = tl.load(q_ptr + row[:, None] * sq_b + head[:, None] * sq_h + d[None, :] * sq_d,
                mask=r_ok[:, None] & d_ok[None, :], other=0.0).to(k_ptr.dtype.element_ty)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_P], tl.float32)
    start = split * split_len
    end = tl.minimum(prefix_len, start + split_len)
    for first in range(start, end, TILE_N):
        n = first + tl.arange(0, TILE_N)
        valid = n < end
        kv_ok = valid[:, None] & d_ok[None, :]
        k = tl.load(k_ptr + n[:, None] * sk_n + kv_head * sk_h + d[None, :] * sk_d, mask=kv_ok, other=0.0)
        v = tl.load(v_ptr + n[:, None] * sv_n + kv_head * sv_h + d[None, :] * sv_d, mask=kv_ok, other=0.0)
        m, l, acc = _attend_tile(q, k, v, valid, m, l, acc, qk_scale, UPCAST)
    part = (row * heads + head) * tl.num_programs(2) + split
    _store_partial(out_ptr, lse_ptr, part, dim, m, l, acc, r_ok, d)


@triton.jit
def _lse(top, total):
    """log-sum-exp of pieces whose weights e^(lse_i - top) add up to total; -inf when empty."""
    return tl.where(total > 0, top + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))


@triton.jit
def reduce_splits_kernel(part_out_ptr, part_lse_ptr, out_ptr, lse_ptr, splits, dim,
                         SPLITS_P: tl.constexpr, DIM_P: tl.constexpr):
    """One program per (row, head): merge its `splits` partial results by log-sum-exp."""
    i = tl.program_id(0)
    s, d = tl.arange(0, SPLITS_P), tl.arange(0, DIM_P)
    s_ok, d_ok = s < splits, d < dim
    lse = tl.load(part_lse_ptr + i * splits + s, mask=s_ok, other=float("-inf"))
    part = tl.load(part_out_ptr + (i * splits + s)[:, None] * dim + d[None, :],
                   mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    top = tl.max(lse, axis=0)
    top_use = tl.where(top == float("-inf"), 0.0, top)
    weight = tl.exp(lse - top_use)
    total = tl.sum(weight, axis=0)
    out = tl.sum(part * weight[:, None], axis=0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + i * dim + d, out, mask=d_ok)
    tl.store(lse_ptr + i, _lse(top_use, total))


@triton.jit
def merge_kernel(out_a_ptr, lse_a_ptr, out_b_ptr, lse_b_ptr, out_ptr, lse_ptr, count, dim,
                 BLOCK_R: tl.constexpr, DIM_P: tl.constexpr):
    """Two softmax pieces over disjoint keys -> one, for BLOCK_R (row, head) pairs a program."""
    i, d = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R), tl.arange(0, DIM_P)
    i_ok = i < count
    tile = i[:, None] * dim + d[None, :]
    tile_ok = i_ok[:, None] & (d < dim)[None, :]
    lse_a = tl.load(lse_a_ptr + i, mask=i_ok, other=float("-inf")).to(tl.float32)
    lse_b = tl.load(lse_b_ptr + i, mask=i_ok, other=float("-inf")).to(tl.float32)
    top = tl.maximum(lse_a, lse_b)
    top_use = tl.where(top == float("-inf"), 0.0, top)
    weight_a, weight_b = tl.exp(lse_a - top_use), tl.exp(lse_b - top_use)
    total = weight_a + weight_b
    out_a = tl.load(out_a_ptr + tile, mask=tile_ok, other=0.0).to(tl.float32)
    out_b = tl.load(out_b_ptr + tile, mask=tile_ok, other=0.0).to(tl.float32)
    out = (out_a * weight_a[:, None] + out_b * weight_b[:, None]) / tl.where(total > 0, total, 1.0)[:, None]
    tl.store(out_ptr + tile, out, mask=tile_ok)
    tl.store(lse_ptr + i, _lse(top_use, total), mask=i_ok)
