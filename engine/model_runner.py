"""Owns the built model and the KV tensors, and runs one scheduled step."""
from __future__ import annotations

import torch

from engine import prompt_matmul
from engine.attention.base import AttentionBatch
from engine.attention.select import select_backend
from engine.decode_graphs import DecodeGraphs, GraphSettings
from engine.kv.cache import KVCache
from engine.linear_attention.state_pool import StatePool
from engine.model import CausalLM
from engine.scheduler import ScheduledBatch


class ModelRunner:
    """Runs the model on one scheduled step, with one attention backend over the KV pool (engine.attention);
    a hybrid model (engine.hybrid_model) also reads and writes its sequences' slots of `states`."""

    def __init__(self, model: CausalLM, kv: KVCache, device: torch.device, cascade: bool = True,
                 graphs: GraphSettings | None = None, states: StatePool | None = None,
                 prompt_precision: str = "float32", prompt_attention: str = "float32",
                 decode_attention: str = "float32"):
        assert model.config.is_hybrid == (states is not None), "a hybrid model runs with a state pool, only it"
        assert states is None or graphs is None, "a hybrid model's decode steps run eagerly"
        self.model = model
        self.kv = kv
        self.states = states
        self.device = device
        self.prompt_precision = prompt_precision   # of prompt rows' products (engine.prompt_matmul)
        self.attention = select_backend(kv, scale=model.config.head_dim ** -0.5)
        self.attention.use_prompt_attention(prompt_attention)   # (engine.prompt_matmul.choose_attention)
        self.attention.use_decode_attention(decode_attention)   # (engine.prompt_matmul.choose_decode_attention)
        self.cascade = cascade
        self.use_graphs(graphs)
        self.use_cascade(cascade)
        self.tokens_computed = 0
        self.prompt_tokens_computed = 0

    def use_cascade(self, on: bool) -> None:
        """Cascade attention on or off from the next step (`swarm bench-decode` alternates)."""
        self.cascade = on
        self.attention.use_cascade(on)
        if self.decode_graphs is not None:
            self.decode_graphs.use_cascade(on)

    def use_graphs(self, settings: GraphSettings | None) -> None:
        """Pure decode steps as graph replays (engine.decode_graphs) from the next step; None: eager."""
        self.decode_graphs = None
        if settings is not None:
            self.decode_graphs = DecodeGraphs(self.model, self.kv, self.attention, settings, self.cascade)

    def graphs_state(self) -> str:
        """"off", or what the decode graphs did so far (engine.decode_graphs.DecodeGraphs.describe)."""
        return "off" if self.decode_graphs is None else self.decode_graphs.describe()

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> torch.Tensor:
        """Logits at the last new token of each scheduled sequence: [seqs, vocab]."""
        self.kv.copy_blocks([(c.src, c.dst) for c in batch.copies])
        logits = None if self.decode_graphs is None else self.decode_graphs.run(batch)
        if logits is not None:
            self.tokens_computed += len(batch.seqs)
            return logits
        input_ids, positions, attention_batch = self._prepare(batch)
        self.attention.plan(attention_batch)
        self.tokens_computed += input_ids.numel()
        self.prompt_tokens_computed += input_ids.numel() - batch.num_decode
        with prompt_matmul.prompt_rows(self.prompt_precision if batch.is_prefill else "float32"):
            hidden = self._forward(batch, input_ids, positions, attention_batch)
        return self.model.compute_logits(hidden, attention_batch.decode_split)

    def _forward(self, batch: ScheduledBatch, input_ids, positions, attention_batch: AttentionBatch) -> torch.Tensor:
        if self.states is None:
            return self.model(input_ids, positions, attention_batch, self.attention)
        states = self.states.for_step([seq.seq_id for seq in batch.seqs])
        return self.model(input_ids, positions, attention_batch, self.attention, states)

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
                                         last_rows, queries="all" if batch.is_prefill else "last",
                                         num_decode=batch.num_decode)
        return as_tensor(tokens), as_tensor(positions), attention_batch
