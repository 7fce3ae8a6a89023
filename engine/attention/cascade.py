"""The attention backend: one forward over a kernel set (engine.attention.kernel_sets), splitting
every step's attention into the shared trunk, read once, and each sequence's private tail.

    last-token queries (decode, a prefill's last layer):
        private tails: paged_decode_with_lse over plan.decode's private tables  -> out, lse
        each shared prefix: prefix_attention(its rows' queries, its K/V)        -> merged by lse
    prefill (every new token queries):
        prompts continuing one cached trunk: kernels.cpu.cascade_prefill (kernel sets that do it)
        the others: causal over their own context (kernels.reference.paged_attention)
"""
from __future__ import annotations

import torch

from engine.attention.base import AttentionBatch
from engine.attention.kernel_sets import AttentionKernels
from engine.attention.plan import MIN_PREFIX_TOKENS, DecodePlan, SharedPrefix, StepPlan, plan_decode, plan_prefill
from engine.kv.cache import KVCache
from kernels.cpu import cascade_prefill
from kernels.reference import paged_attention


class CascadeBackend:
    """AttentionBackend on `kernels`, over the pool `kv`; `scale` is the softmax scale."""

    def __init__(self, kernels: AttentionKernels, kv: KVCache, scale: float):
        self.kernels = kernels
        self.name = kernels.name
        self.kv = kv
        self.scale = scale
        self.device = kv.layers[0][0].device
        self.min_prefix_tokens: float = MIN_PREFIX_TOKENS

    def use_cascade(self, on: bool) -> None:
        self.min_prefix_tokens = MIN_PREFIX_TOKENS if on else float("inf")

    def plan(self, batch: AttentionBatch) -> None:
        tables, block_size = batch.block_tables, self.kv.block_size
        decode = plan_decode(tables, batch.context_lens, block_size, self.device, self.min_prefix_tokens)
        if not batch.is_prefill:
            batch.plan = StepPlan(decode)
            return
        block_tables = [torch.tensor(table, dtype=torch.long, device=self.device) for table in tables]
        groups = []
        if self.kernels.cascade_prefill and len(tables) > 1:
            starts = [context - new for context, new in zip(batch.context_lens, batch.query_lens)]
            groups = plan_prefill(tables, starts, batch.query_lens, block_size, self.device, self.min_prefix_tokens)
        batch.plan = StepPlan(decode, block_tables, groups)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                batch: AttentionBatch) -> torch.Tensor:
        assert batch.plan is not None, "plan(batch) runs once a step, before the model"
        k_cache, v_cache = self.kv.layers[layer]
        self.kernels.write_kv(k_cache, v_cache, k, v, batch.slot_mapping)
        if batch.queries == "last":
            return self._last_tokens(q, k_cache, v_cache, batch.plan.decode)
        return self._prefill(q, k_cache, v_cache, batch)

    def _last_tokens(self, q, k_cache, v_cache, plan: DecodePlan) -> torch.Tensor:
        kernels = self.kernels
        out, lse = kernels.paged_decode_with_lse(q, k_cache, v_cache, plan.private_tables, plan.private_lens,
                                                 self.scale)
        for prefix in plan.prefixes:
            k, v = prefix_kv(k_cache, prefix), prefix_kv(v_cache, prefix)
            shared_out, shared_lse = kernels.prefix_attention(q[prefix.rows], k, v, self.scale)
            merged, _ = kernels.merge_attention(shared_out, shared_lse, out[prefix.rows], lse[prefix.rows])
            out[prefix.rows] = merged
        return out.to(q.dtype)

    def _prefill(self, q, k_cache, v_cache, batch: AttentionBatch) -> torch.Tensor:
        plan, rows_attention = batch.plan, self.kernels.prefill_rows
        if plan.prefill_groups:
            return cascade_prefill.prefill_attention(q, k_cache, v_cache, plan.block_tables, batch.context_lens,
                                                     batch.query_lens, plan.prefill_groups, self.scale, prefix_kv,
                                                     rows_attention)
        return paged_attention.prefill_attention(q, k_cache, v_cache, plan.block_tables, batch.context_lens,
                                                 batch.query_lens, self.scale, rows_attention)


def prefix_kv(cache: torch.Tensor, prefix: SharedPrefix) -> torch.Tensor:
    """A shared prefix's K or V: [tokens, kv_heads, dim] (a view where its blocks are consecutive)."""
    if prefix.blocks is None:
        blocks = cache[prefix.first_block:prefix.first_block + prefix.num_blocks]
    else:
        blocks = cache.index_select(0, prefix.blocks)
    return blocks.reshape(-1, *cache.shape[2:])
