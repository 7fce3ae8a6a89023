"""Prefill of several prompts that continue one cached trunk: their new tokens attend to the
trunk's K/V together, in one product, instead of each re-reading it.

    prompt i:  [ shared prefix: cached, read-only blocks ][ its own cached part | new tokens ]
               all groups' new tokens x prefix keys        each prompt's new tokens x the rest,
               (no mask: the prefix precedes them all)     causal

With a kernel that splits (native_attention.RowsKernel) the prefix part ends at a multiple of the kernel's
chunk, and each row's running state over it (max, sum, unnormalised output) is continued over the rest:

               [ prefix, whole chunks | rest of the prefix, own part, new tokens ]
                 running(all rows)      continued(each prompt's rows, from its running states)

so every row gets the bits it gets computed alone, causal over its whole context: sharing the trunk changes
nothing, in float32 or bfloat16 products. Other kernels (torch's fused CPU kernel, kernels.cpu.sdpa_attention)
return each part normalised with its log-sum-exp, and the parts are merged by it: close, not the same bits.
Checked against kernels.reference.paged_attention.prefill_attention, the oracle.
"""
from __future__ import annotations

import torch

from kernels.cpu import native_attention, sdpa_attention
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
        if isinstance(attend, native_attention.RowsKernel) and attend.splits(q, k_cache, v_cache):
            _continued(q, k_cache, v_cache, block_tables, context_lens, seqs, prefix, scale, prefix_kv, attend,
                       starts, pieces)
        else:
            _merged(q, k_cache, v_cache, block_tables, context_lens, seqs, prefix, scale, prefix_kv, attend, starts,
                    pieces)
    for i, piece in enumerate(pieces):
        if piece is None:
            pieces[i] = paged_attention.prefill_attention(q[starts[i]:starts[i + 1]], k_cache, v_cache,
                                                          [block_tables[i]], [context_lens[i]],
                                                          [starts[i + 1] - starts[i]], scale, rows_attention)
    return torch.cat([piece.to(q.dtype) for piece in pieces])


def _continued(q, k_cache, v_cache, block_tables, context_lens, seqs, prefix, scale, prefix_kv, kernel, starts,
               pieces) -> None:
    """The group's prompts through the prefix's whole chunks at once, then each over the rest of its context."""
    chunk = native_attention.chunk_keys()
    split = prefix.num_blocks * k_cache.shape[1] // chunk * chunk
    if split == 0:   # no whole chunk to share: each prompt alone
        return
    running = kernel.running(q[prefix.rows], prefix_kv(k_cache, prefix)[:split], prefix_kv(v_cache, prefix)[:split],
                             scale)
    row = 0
    for i in seqs:
        n = starts[i + 1] - starts[i]
        k = _keys_from(k_cache, block_tables[i], split, context_lens[i])
        v = _keys_from(v_cache, block_tables[i], split, context_lens[i])
        pieces[i], _ = kernel.continued(q[starts[i]:starts[i + 1]], k, v, scale, running[row:row + n])
        row += n


def _keys_from(cache: torch.Tensor, block_table: torch.Tensor, first: int, length: int) -> torch.Tensor:
    """Tokens first, ..., length - 1 of one sequence: [length - first, kv_heads, dim]."""
    block_size = cache.shape[1]
    skip = first // block_size
    gathered = paged_attention.gather_kv(cache, block_table[skip:], length - skip * block_size)
    return gathered[first - skip * block_size:]


def _merged(q, k_cache, v_cache, block_tables, context_lens, seqs, prefix, scale, prefix_kv, attend, starts,
            pieces) -> None:
    """The group's prompts over the whole prefix at once, then each over its own part, merged by log-sum-exp."""
    shared_out, shared_lse = attend(q[prefix.rows], prefix_kv(k_cache, prefix), prefix_kv(v_cache, prefix),
                                    scale, False)
    row, shared = 0, prefix.num_blocks * k_cache.shape[1]
    for i in seqs:
        n = starts[i + 1] - starts[i]
        k = _keys_from(k_cache, block_tables[i], shared, context_lens[i])
        v = _keys_from(v_cache, block_tables[i], shared, context_lens[i])
        out, lse = attend(q[starts[i]:starts[i + 1]], k, v, scale, True)
        pieces[i], _ = cascade_attention.merge_attention(shared_out[row:row + n], shared_lse[row:row + n], out, lse)
        row += n
