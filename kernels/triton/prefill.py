"""The GPU path of prefill attention: Triton launchers with the contracts of
`kernels.reference.paged_attention.prefill_attention` and `kernels.cpu.cascade_prefill.prefill_attention`.

    plain     one launch of paged_prefill_kernel for the whole batch: every new token, causal over
              its sequence's paged context (the cached part and the new tokens up to its own)
    cascade   prompts continuing one cached trunk (groups from engine.attention.plan.plan_prefill):
                the trunk, once for all the group's new tokens   prefix_attention        -> out_p, lse_p
                each prompt after the trunk, causal              the same one launch     -> out_t, lse_t
              merged by log-sum-exp (merge_attention); the other prompts' pieces are whole already.

A step's metadata (the block tables end to end, each sequence's lengths, the query tiles) is built on
the host from the lists the step already has, copied to the device in one transfer, and reused by
every layer of the step: nothing is read back from the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from kernels.triton import attention
from kernels.triton.attention import INTERPRETED, LOG2E, _check_shapes, _dim_p
from kernels.triton.prefill_kernels import SEQ_FIELDS, paged_prefill_kernel

__all__ = ["prefill_attention", "cascade_prefill_attention"]

# (query rows: new tokens x the GROUP heads of a KV head, keys, warps) per program, by padded head dim
# for 16-bit and for float32 caches: no register spills on sm_90 (ptxas -v), and within ROCm's 64 KiB of LDS
TILE_SHAPES = {64: (128, 64, 8), 128: (128, 32, 8), 256: (64, 16, 8)}
FLOAT32_TILE_SHAPES = {64: (64, 32, 8), 128: (32, 16, 8), 256: (32, 16, 8)}
LARGE_DIM_TILE = (32, 16, 8)


@dataclass(frozen=True, slots=True)
class PrefillTiles:
    """The device metadata of one step's prefill (layout: kernels.triton.prefill_kernels)."""

    tables: torch.Tensor    # every sequence's block table, end to end
    seqs: torch.Tensor      # int32 [batch, SEQ_FIELDS]
    tiles: torch.Tensor     # int32 [tiles, 2], the heaviest first
    tokens: int             # new tokens per tile


def prefill_attention(q, k_cache, v_cache, block_tables, context_lens, query_lens, scale, rows_attention=None):
    """Same contract as kernels.reference.paged_attention.prefill_attention. `rows_attention`, a CPU
    kernel, is accepted for the contract and not used."""
    out, _ = _paged_prefill(q, k_cache, v_cache, block_tables, context_lens, query_lens, [0] * len(query_lens),
                            scale, q.dtype)
    return out


def cascade_prefill_attention(q, k_cache, v_cache, block_tables, context_lens, query_lens, groups, scale,
                              prefix_kv, rows_attention=None):
    """Same contract as kernels.cpu.cascade_prefill.prefill_attention (`rows_attention` is not used):
    each group's trunk is read once for all its prompts' new tokens."""
    kv_starts = [0] * len(query_lens)
    for seqs, prefix in groups:
        for i in seqs:
            kv_starts[i] = prefix.num_blocks * k_cache.shape[1]
    out, lse = _paged_prefill(q, k_cache, v_cache, block_tables, context_lens, query_lens, kv_starts, scale,
                              torch.float32)
    for _, prefix in groups:
        shared_out, shared_lse = attention.prefix_attention(q[prefix.rows], prefix_kv(k_cache, prefix),
                                                            prefix_kv(v_cache, prefix), scale)
        merged, _ = attention.merge_attention(shared_out, shared_lse, out[prefix.rows], lse[prefix.rows])
        out[prefix.rows] = merged
    return out.to(q.dtype)


def _paged_prefill(q, k_cache, v_cache, block_tables, context_lens, query_lens, kv_starts, scale, out_dtype):
    """(out [tokens, heads, dim] in out_dtype, lse [tokens, heads] float32) of every new token over
    its keys [kv_start, own position]."""
    tokens, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = _check_shapes(q, k_cache, kv_heads, block_size)
    assert tokens == sum(query_lens), f"q has {tokens} rows for {sum(query_lens)} new tokens"
    out = torch.empty(tokens, heads, dim, dtype=out_dtype, device=q.device)
    lse = torch.empty(tokens, heads, dtype=torch.float32, device=q.device)
    if tokens == 0:
        return out, lse
    tile_rows, tile_n, warps = _tile_shape(_dim_p(dim), k_cache.element_size())
    block_m = max(tile_rows, triton.next_power_of_2(group))
    meta = _last_step.tiles(block_tables, context_lens, query_lens, kv_starts, block_m // group, q.device)
    paged_prefill_kernel[(meta.tiles.shape[0], kv_heads)](
        q, k_cache, v_cache, meta.tables, meta.seqs, meta.tiles, out, lse,
        scale * LOG2E, heads, dim, *q.stride(), *k_cache.stride(), *v_cache.stride(),
        GROUP=group, TOKENS=meta.tokens, BLOCK_M=block_m, DIM_P=_dim_p(dim), BLOCK_SIZE=block_size,
        TILE_N=tile_n, UPCAST=INTERPRETED, num_warps=warps)
    return out, lse


def _tile_shape(dim_p: int, element_size: int) -> tuple[int, int, int]:
    shapes = FLOAT32_TILE_SHAPES if element_size >= 4 else TILE_SHAPES
    return next((shape for limit, shape in shapes.items() if dim_p <= limit), LARGE_DIM_TILE)


def _build_tiles(block_tables, context_lens, query_lens, kv_starts, tokens: int, device) -> PrefillTiles:
    """One step's metadata, `tokens` new tokens a tile; one host-to-device copy besides the tables."""
    seqs, tiles, table_start, first_row = [], [], 0, 0
    for i, (table, context, new, skip) in enumerate(zip(block_tables, context_lens, query_lens, kv_starts)):
        assert 0 <= new <= context, f"sequence {i}: {new} new tokens in a context of {context}"
        seqs += [table_start, context, first_row, new, skip]
        # a tile's work grows with its last token's position: heaviest first, so the last wave is short
        tiles += [(context - new + min(first + tokens, new), i, first) for first in range(0, new, tokens)]
        table_start += table.shape[0]
        first_row += new
    tiles.sort(key=lambda tile: -tile[0])
    packed = torch.tensor(seqs + [x for _, i, first in tiles for x in (i, first)], dtype=torch.int32).to(device)
    return PrefillTiles(torch.cat(list(block_tables)).to(device), packed[:len(seqs)].view(-1, SEQ_FIELDS),
                        packed[len(seqs):].view(-1, 2), tokens)


class _LastStep:
    """The metadata of the last call, reused while the same step comes back: every layer of a step
    passes the same block-table tensors and lengths. Holding the tensors keeps their ids unique; the
    entry is replaced whole, so a concurrent caller reads an old or a new one, never a mix."""

    def __init__(self):
        self.entry: tuple[tuple, tuple, PrefillTiles] | None = None

    def tiles(self, block_tables, context_lens, query_lens, kv_starts, tokens, device) -> PrefillTiles:
        key = (tuple(context_lens), tuple(query_lens), tuple(kv_starts), tokens, device)
        entry = self.entry
        if entry is not None and entry[1] == key and len(entry[0]) == len(block_tables) and all(
                held is table for held, table in zip(entry[0], block_tables)):
            return entry[2]
        value = _build_tiles(block_tables, context_lens, query_lens, kv_starts, tokens, device)
        self.entry = (tuple(block_tables), key, value)
        return value


_last_step = _LastStep()
