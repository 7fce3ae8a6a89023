"""The attention backend: one forward over a kernel set (engine.attention.kernel_sets), splitting
every step's attention into the shared trunk, read once, and each sequence's private tail.

    last-token queries (decode, a prefill's last layer):
        private tails: paged_decode_with_lse over plan.decode's private tables  -> out, lse
        each shared prefix: prefix_attention(its rows' queries, its K/V)        -> merged by lse
      or, on kernel sets with trunk_chunks (the C kernels), each row the bits of its context read alone:
        each shared prefix, cut at whole chunks: trunk_chunks(its rows' queries, its K/V) -> chunks' partials
        private tails: paged_decode_with_lse(..., given=those partials)   -> merged in one pass, chunk by chunk
    prefill (every new token queries):
        prompts continuing one cached trunk: the set's cascade_prefill (kernel sets that do it)
        the others: the set's prefill, causal over their own context
"""
from __future__ import annotations

import torch

from engine import prompt_matmul
from engine.attention.base import AttentionBatch
from engine.attention.kernel_sets import AttentionKernels
from engine.attention.plan import MIN_PREFIX_TOKENS, DecodePlan, SharedPrefix, StepPlan, plan_decode, plan_prefill
from engine.kv.cache import KVCache
from kernels.cpu import native_attention


class CascadeBackend:
    """AttentionBackend on `kernels`, over the pool `kv`; `scale` is the softmax scale."""

    def __init__(self, kernels: AttentionKernels, kv: KVCache, scale: float):
        self.kernels = kernels
        self.name = kernels.name
        self.kv = kv
        self.scale = scale
        self.device = kv.layers[0][0].device
        self.min_prefix_tokens: float = MIN_PREFIX_TOKENS
        self.bf16_prompts = False
        self.int8_prompts = False
        self.bf16_decode = False

    def use_cascade(self, on: bool) -> None:
        self.min_prefix_tokens = MIN_PREFIX_TOKENS if on else float("inf")

    def plan(self, batch: AttentionBatch) -> None:
        tables, block_size = batch.block_tables, self.kv.block_size
        chunk = self.kernels.decode_chunk() if self.kernels.decode_chunk else 1
        decode = plan_decode(tables, batch.context_lens, block_size, self.device, self.min_prefix_tokens, chunk)
        if not batch.is_prefill:
            batch.plan = StepPlan(decode)
            return
        d = batch.num_decode
        decode_rows = None
        if d:
            decode_rows = plan_decode(tables[:d], batch.context_lens[:d], block_size, self.device,
                                      self.min_prefix_tokens, chunk)
        tables, context_lens, query_lens = tables[d:], batch.context_lens[d:], batch.query_lens[d:]
        block_tables = [torch.tensor(table, dtype=torch.long, device=self.device) for table in tables]
        groups = []
        if self.kernels.cascade_prefill is not None and len(tables) > 1:
            starts = [context - new for context, new in zip(context_lens, query_lens)]
            groups = plan_prefill(tables, starts, query_lens, block_size, self.device, self.min_prefix_tokens)
        batch.plan = StepPlan(decode, block_tables, groups, decode_rows)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                batch: AttentionBatch) -> torch.Tensor:
        assert batch.plan is not None, "plan(batch) runs once a step, before the model"
        k_cache, v_cache = self.kv.layers[layer]
        self.kernels.write_kv(k_cache, v_cache, k, v, batch.slot_mapping)
        if batch.queries == "last":
            return self._last_tokens(q, k_cache, v_cache, batch.plan.decode)
        d = batch.num_decode
        if not d:
            return self._prefill(q, k_cache, v_cache, batch)
        # a mixed step: decode rows attend as they would in a decode-only step, the prompt chunks as in a prefill
        return torch.cat((self._last_tokens(q[:d], k_cache, v_cache, batch.plan.decode_rows),
                          self._prefill(q[d:], k_cache, v_cache, batch)))

    def _last_tokens(self, q, k_cache, v_cache, plan: DecodePlan) -> torch.Tensor:
        kernels = self.kernels
        if (plan.prefixes and kernels.trunk_chunks is not None
                and native_attention.takes_c(q, k_cache, v_cache, self.bf16_decode)):
            return self._with_trunk_chunks(q, k_cache, v_cache, plan)
        out, lse = kernels.paged_decode_with_lse(q, k_cache, v_cache, plan.private_tables, plan.private_lens,
                                                 self.scale, **self._decode_precision())
        for prefix in plan.prefixes:
            k, v = prefix_kv(k_cache, prefix), prefix_kv(v_cache, prefix)
            shared_out, shared_lse = kernels.prefix_attention(q[prefix.rows], k, v, self.scale)
            if prefix.members is not None:   # rows that do not share the prefix take none of it
                shared_lse = shared_lse.masked_fill(~prefix.members[:, None], float("-inf"))
            merged, _ = kernels.merge_attention(shared_out, shared_lse, out[prefix.rows], lse[prefix.rows])
            out[prefix.rows] = merged
        return out.to(q.dtype)

    def _with_trunk_chunks(self, q, k_cache, v_cache, plan: DecodePlan) -> torch.Tensor:
        batch, heads, dim = q.shape
        pieces = [(prefix, self.kernels.trunk_chunks(q[prefix.rows], prefix_kv(k_cache, prefix),
                                                     prefix_kv(v_cache, prefix), self.scale,
                                                     **self._decode_precision()))
                  for prefix in plan.prefixes]
        partials = q.new_zeros(batch, max(chunks.shape[1] for _, chunks in pieces), heads, dim + 2)
        counts = torch.zeros(batch, dtype=torch.int64)
        for prefix, chunks in pieces:
            partials[prefix.rows, :chunks.shape[1]] = chunks
            taken = torch.full((chunks.shape[0],), chunks.shape[1], dtype=torch.int64)
            if prefix.members is not None:   # rows that do not share the prefix take none of it
                taken = taken.masked_fill(~prefix.members.cpu(), 0)
            counts[prefix.rows] = taken
        given = native_attention.TrunkChunks(partials, counts)
        out, _ = self.kernels.paged_decode_with_lse(q, k_cache, v_cache, plan.private_tables, plan.private_lens,
                                                    self.scale, given=given, **self._decode_precision())
        return out

    def use_decode_attention(self, precision: str) -> None:
        bf16 = precision == "bfloat16" and self.kernels.decode_bf16
        self.bf16_decode = bf16 and native_attention.bf16_products_native()

    def decode_attention(self) -> str:
        return "bfloat16" if self.bf16_decode else "float32"

    def _decode_precision(self) -> dict[str, bool]:
        """The decode kernels' precision argument: only kernel sets with bfloat16 products take it."""
        return {"bf16": True} if self.bf16_decode else {}

    def _prefill(self, q, k_cache, v_cache, batch: AttentionBatch) -> torch.Tensor:
        """The prompt chunks' rows: those after the decode rows."""
        plan, rows_attention, d = batch.plan, self._rows_kernel(), batch.num_decode
        context_lens, query_lens = batch.context_lens[d:], batch.query_lens[d:]
        if plan.prefill_groups:
            return self.kernels.cascade_prefill(q, k_cache, v_cache, plan.block_tables, context_lens, query_lens,
                                                plan.prefill_groups, self.scale, prefix_kv, rows_attention)
        return self.kernels.prefill(q, k_cache, v_cache, plan.block_tables, context_lens, query_lens, self.scale,
                                    rows_attention)

    def use_prompt_attention(self, precision: str) -> None:
        bf16 = precision in ("bfloat16", "int8") and self.kernels.prefill_rows_bf16 is not None
        self.bf16_prompts = bf16 and native_attention.bf16_products_native()
        int8 = precision == "int8" and self.kernels.prefill_rows_int8 is not None
        self.int8_prompts = int8 and self.bf16_prompts and native_attention.int8_products_native()

    def prompt_attention(self) -> str:
        return "int8" if self.int8_prompts else "bfloat16" if self.bf16_prompts else "float32"

    def _rows_kernel(self):
        """The prompt rows' kernel: integer products where the backend takes them (use_prompt_attention) and the
        step's matmuls take integers, bfloat16 ones where it takes those and the step's matmuls round to bfloat16
        or integers (engine.prompt_matmul)."""
        if self.int8_prompts and prompt_matmul.int8_now():
            return self.kernels.prefill_rows_int8
        if self.bf16_prompts and prompt_matmul.bfloat16_now():
            return self.kernels.prefill_rows_bf16
        return self.kernels.prefill_rows


def prefix_kv(cache: torch.Tensor, prefix: SharedPrefix) -> torch.Tensor:
    """A shared prefix's K or V: [tokens, kv_heads, dim] (a view where its blocks are consecutive)."""
    if prefix.blocks is None:
        blocks = cache[prefix.first_block:prefix.first_block + prefix.num_blocks]
    else:
        blocks = cache.index_select(0, prefix.blocks)
    return blocks.reshape(-1, *cache.shape[2:])
