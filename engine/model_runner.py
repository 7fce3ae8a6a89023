"""Owns the built model and the KV tensors, and runs one scheduled step."""
from __future__ import annotations

import torch

from engine.attention.base import AttentionBatch
from engine.attention.select import select_backend
from engine.kv.cache import KVCache
from engine.model import CausalLM
from engine.scheduler import ScheduledBatch


class ModelRunner:
    """Runs the model on one scheduled step, with one attention backend over the KV pool (engine.attention)."""

    def __init__(self, model: CausalLM, kv: KVCache, device: torch.device, cascade: bool = True):
        self.model = model
        self.kv = kv
        self.device = device
        self.attention = select_backend(kv, scale=model.config.head_dim ** -0.5)
        self.use_cascade(cascade)
        self.tokens_computed = 0
        self.prompt_tokens_computed = 0

    def use_cascade(self, on: bool) -> None:
        """Cascade attention on or off from the next step (`swarm bench-decode` alternates)."""
        self.attention.use_cascade(on)

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits at the last new token of each scheduled sequence: [seqs, vocab]."""
        self.kv.copy_blocks([(c.src, c.dst) for c in batch.copies])
        input_ids, positions, attention_batch = self._prepare(batch)
        self.attention.plan(attention_batch)
        self.tokens_computed += input_ids.numel()
        if batch.is_prefill:
            self.prompt_tokens_computed += input_ids.numel()
        return self.model.compute_logits(self.model(input_ids, positions, attention_batch, self.attention))

    def _prepare(self, batch: ScheduledBatch) -> tuple[torch.Tensor, torch.Tensor, AttentionBatch]:
        block_size = self.kv.block_size
        tokens, positions, slots, context_lens = [], [], [], []
        for seq, n in zip(batch.seqs, batch.num_new):
            start = seq.num_computed_tokens
            span = range(start, start + n)
            tokens += seq.token_ids[start:start + n]
            positions += span
            slots += [seq.block_table[p // block_size] * block_size + p % block_size for p in span]
            context_lens.append(start + n)
        def as_tensor(values):
            return torch.tensor(values, dtype=torch.long, device=self.device)
        tables = [seq.block_table for seq in batch.seqs]
        last_rows = None
        if batch.is_prefill:   # the last layer computes only each sequence's last new token
            last_rows = torch.tensor(batch.num_new, device=self.device).cumsum(0) - 1
        attention_batch = AttentionBatch(batch.is_prefill, as_tensor(slots), context_lens, list(batch.num_new), tables,
                                         last_rows, queries="all" if batch.is_prefill else "last")
        return as_tensor(tokens), as_tensor(positions), attention_batch
