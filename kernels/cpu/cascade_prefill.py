"""Prefill of several prompts that continue one cached trunk: their new tokens attend to the
trunk's K/V together, in one product, instead of each re-reading it.

    prompt i:  [ shared prefix: cached, read-only blocks ][ its own cached part | new tokens ]
               all groups' new tokens x prefix keys        each prompt's new tokens x the rest,
               (no mask: the prefix precedes them all)     causal
               -> out_p, lse_p                             -> out_t, lse_t      merged by lse

CPU only: the pieces run on `rows_attention` (kernels.cpu.native_attention's C kernel) or, without
it, on torch's fused CPU kernel (kernels.cpu.sdpa_attention). Checked against
kernels.reference.paged_attention.prefill_attention, the oracle.
"""
from __future__ import annotations

import torch

from kernels.cpu import sdpa_attention
from kernels.reference import cascade_attention, paged_attention


def prefill_attention(q, k_cache, v_cache, block_tables, context_lens, query_lens, groups, scale,
                      prefix_kv, rows_attention=None):
    """Same contract as paged_attention.prefill_attention. `groups` pair the batch positions of
    prompts with the SharedPrefix they all have cached (its `rows` are their new tokens' rows in q);
    `prefix_kv(cache, prefix)` gives the prefix's K or V as [tokens, kv_heads, dim].
    rows_attention(q, k, v, scale, causal) -> (out, lse): native_attention.rows_attention's
    contract; None for torch's fused kernel."""
    attend = rows_attention or sdpa_attention.rows_attention
    starts = [0]
    for n in query_lens:
        starts.append(starts[-1] + n)
    pieces: list[torch.Tensor | None] = [None] * len(query_lens)
    for seqs, prefix in groups:
        shared_out, shared_lse = attend(q[prefix.rows], prefix_kv(k_cache, prefix), prefix_kv(v_cache, prefix),
                                        scale, False)
        row = 0
        for i in seqs:
            n, skip = query_lens[i], prefix.num_blocks
            tail = context_lens[i] - skip * k_cache.shape[1]
            k = paged_attention.gather_kv(k_cache, block_tables[i][skip:], tail)
            v = paged_attention.gather_kv(v_cache, block_tables[i][skip:], tail)
            out, lse = attend(q[starts[i]:starts[i] + n], k, v, scale, True)
            pieces[i], _ = cascade_attention.merge_attention(shared_out[row:row + n], shared_lse[row:row + n],
                                                              out, lse)
            row += n
    for i, piece in enumerate(pieces):
        if piece is None:
            pieces[i] = paged_attention.prefill_attention(q[starts[i]:starts[i + 1]], k_cache, v_cache,
                                                          [block_tables[i]], [context_lens[i]], [query_lens[i]],
                                                          scale, rows_attention)
    return torch.cat([piece.to(q.dtype) for piece in pieces])
