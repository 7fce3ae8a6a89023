"""The Triton kernel of prefill attention over the paged KV cache. Launchers: `kernels.triton.prefill`.

One program per (query tile, KV head). A query tile is up to TOKENS consecutive new tokens of one
sequence, each with the GROUP query heads that read the KV head (GQA), so one K/V tile is loaded
once for all of them:

    rows r of the tile   token  = first_token + r // GROUP      (index among the sequence's new tokens)
                         head   = kv_head * GROUP + r % GROUP
    its position         pos    = context_len - query_len + token
    keys                 [kv_start, pos]: the cached part (all of it) and the new tokens up to its own

Keys go by TILE_N tokens with an online softmax (base 2, as in `kernels.triton.decode`); token t of the
sequence sits at block_table[t // BLOCK_SIZE], slot t % BLOCK_SIZE. kv_start > 0 skips a shared prefix
that the cascade form attends to separately; the (out, lse) written here then merge with its piece.

Per-step metadata (int32, built once on the host, see `kernels.triton.prefill`):
    seqs  [batch, SEQ_FIELDS]: table offset (into the flat tables), context_len, first row in q,
                               query_len, kv_start
    tiles [tiles, 2]:          sequence, first_token
"""
from __future__ import annotations

import triton
import triton.language as tl

from kernels.triton.decode import _attend_tile, _store_partial

SEQ_FIELDS = 5


@triton.jit
def paged_prefill_kernel(q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, seqs_ptr, tiles_ptr, out_ptr, lse_ptr,
                         qk_scale, heads, dim,
                         sq_t, sq_h, sq_d, sk_b, sk_s, sk_h, sk_d, sv_b, sv_s, sv_h, sv_d,
                         GROUP: tl.constexpr, TOKENS: tl.constexpr, BLOCK_M: tl.constexpr,
                         DIM_P: tl.constexpr, BLOCK_SIZE: tl.constexpr, TILE_N: tl.constexpr,
                         UPCAST: tl.constexpr):
    tile, kv_head = tl.program_id(0), tl.program_id(1)
    seq, first_token = tl.load(tiles_ptr + 2 * tile), tl.load(tiles_ptr + 2 * tile + 1)
    meta = seqs_ptr + seq * 5     # SEQ_FIELDS
    table_start, context_len, first_row = tl.load(meta), tl.load(meta + 1), tl.load(meta + 2)
    query_len, kv_start = tl.load(meta + 3), tl.load(meta + 4)
    r, d = tl.arange(0, BLOCK_M), tl.arange(0, DIM_P)
    token, head = first_token + r // GROUP, kv_head * GROUP + r % GROUP
    r_ok, d_ok = (r < TOKENS * GROUP) & (token < query_len), d < dim
    row = first_row + token
    q = tl.load(q_ptr + row[:, None] * sq_t + head[:, None] * sq_h + d[None, :] * sq_d,
                mask=r_ok[:, None] & d_ok[None, :], other=0.0).to(k_cache_ptr.dtype.element_ty)
    pos = context_len - query_len + token
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM_P], tl.float32)
    end = tl.minimum(context_len, context_len - query_len + first_token + TOKENS)
    for first in range(kv_start, end, TILE_N):
        n = first + tl.arange(0, TILE_N)
        n_ok = n < end
        block = tl.load(tables_ptr + table_start + n // BLOCK_SIZE, mask=n_ok, other=0)
        slot = (n % BLOCK_SIZE)[:, None]
        kv_ok = n_ok[:, None] & d_ok[None, :]
        k = tl.load(k_cache_ptr + block[:, None] * sk_b + slot * sk_s + kv_head * sk_h + d[None, :] * sk_d,
                    mask=kv_ok, other=0.0)
        v = tl.load(v_cache_ptr + block[:, None] * sv_b + slot * sv_s + kv_head * sv_h + d[None, :] * sv_d,
                    mask=kv_ok, other=0.0)
        visible = n_ok[None, :] & (n[None, :] <= pos[:, None])
        m, l, acc = _attend_tile(q, k, v, visible, m, l, acc, qk_scale, UPCAST)
    _store_partial(out_ptr, lse_ptr, row * heads + head, dim, m, l, acc, r_ok, d)
