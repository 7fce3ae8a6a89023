"""Qwen3.5's hybrid decoder, in plain PyTorch: most layers are Gated DeltaNet (linear attention with a state per
sequence, engine.linear_attention), every few a full-attention layer with an output gate (layer_types says which).

    layer i:  x ─ norm ─┬─ Gated DeltaNet (state of linear layer j, from the step's StepStates) ─┬─ + x ─ norm ─ MLP ─ +
                        └─ gated attention (KV layer j of the pool: the full-attention layers only) ┘

It differs from engine.model's decoder in its norms, x·(1 + w) (zero-centred: the checkpoint stores w − 1),
and in its attention: q_proj gives each head's query and a gate, q and k are normed per head, rotary turns
the leading `rotary_dim` dims of each head only, and the output is multiplied by sigmoid(gate) before o_proj.
"""
from __future__ import annotations

from dataclasses import asdict

import torch
from torch import nn

from engine import prompt_matmul
from engine.attention.base import AttentionBackend, AttentionBatch
from engine.linear_attention.gated_deltanet_layer import GatedDeltaNet
from engine.linear_attention.state_pool import StepStates
from engine.loading.config import LINEAR_ATTENTION, ModelConfig
from engine.model import MLP, Attention, CausalLM, DecoderModel, RMSNorm, rms_normalized, rows_apart


class ZeroCentredRMSNorm(RMSNorm):
    """RMSNorm times (1 + weight): the checkpoint stores the weight's offset from one (zeros at init). In float32,
    rounded to x's dtype once at the end."""

    def __init__(self, dim: int, eps: float):
        super().__init__(dim, eps)
        nn.init.zeros_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (rms_normalized(x.float(), self.eps) * (1.0 + self.weight.float())).to(x.dtype)


class GatedAttention(Attention):
    """Attention whose q_proj gives each head's query then its gate; the output is times sigmoid(gate)."""

    query_parts = 2
    norm_type = ZeroCentredRMSNorm

    def forward(self, x: torch.Tensor, rotary, batch: AttentionBatch, attention: AttentionBackend) -> torch.Tensor:
        q, k, v = self.project(x, batch)
        q, gate = q.chunk(2, dim=-1)
        rows = q.shape[0]
        out = self.attend(q, k, v, rotary, batch, attention).reshape(rows, -1)
        return rows_apart(self.o_proj, out * torch.sigmoid(gate.reshape(rows, -1)), batch.decode_split)


class HybridDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        if config.layer_types[layer_index] == LINEAR_ATTENTION:
            self.linear_attn = GatedDeltaNet(linear_layer_config(config))
            self.state_index = config.linear_layers.index(layer_index)
        else:
            self.self_attn = GatedAttention(config, config.kv_layers.index(layer_index))
        self.mlp = MLP(config)
        self.input_layernorm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rotary, batch: AttentionBatch, attention: AttentionBackend,
                states: StepStates) -> torch.Tensor:
        mixed = self.mix(self.input_layernorm(x), rotary, batch, attention, states)
        rows = batch.query_rows
        x = (x if rows is None else x[rows]) + mixed
        return x + self.mlp(self.post_attention_layernorm(x), batch.decode_split)

    def mix(self, x: torch.Tensor, rotary, batch: AttentionBatch, attention: AttentionBackend,
            states: StepStates) -> torch.Tensor:
        """The token mixer's output at the query rows. A linear layer runs every token (each moves the state);
        a mixed step's decode rows apart from its prompt rows, as engine.model.rows_apart says why."""
        if not hasattr(self, "linear_attn"):
            return self.self_attn(x, rotary, batch, attention)
        split = batch.decode_split
        if split is None:
            out = self.run_linear(x, batch.query_lens, states)
        else:
            with prompt_matmul.decode_rows():
                decode = self.run_linear(x[:split], batch.query_lens[:split], states.part(slice(None, split)))
            out = torch.cat((decode, self.run_linear(x[split:], batch.query_lens[split:],
                                                     states.part(slice(split, None)))))
        rows = batch.query_rows
        return out if rows is None else out[rows]

    def run_linear(self, x: torch.Tensor, seq_lens: list[int], states: StepStates) -> torch.Tensor:
        out, new_states = self.linear_attn(x, seq_lens, states.read(self.state_index))
        states.write(self.state_index, new_states)
        return out


class HybridDecoderModel(DecoderModel):
    layer_type = HybridDecoderLayer
    norm_type = ZeroCentredRMSNorm


class HybridCausalLM(CausalLM):
    """CausalLM over the hybrid decoder: the step also hands it each sequence's linear state (`states`)."""

    decoder_type = HybridDecoderModel

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                attention: AttentionBackend, states: StepStates) -> torch.Tensor:
        """Hidden states of each sequence's last new token: [seqs, hidden]; every linear layer's state of each
        sequence is moved past its new tokens, and every full-attention layer's K/V of them is written."""
        x = self.model.embed_tokens(input_ids)
        rotary = self.model.rotary_emb(positions)
        *layers, last = self.model.layers
        for layer in layers:
            x = layer(x, rotary, batch, attention, states)
        return self.model.norm(last(x, rotary, batch.last_tokens(), attention, states))


def linear_layer_config(config: ModelConfig) -> dict:
    """The fields GatedDeltaNet reads, under the checkpoint's names."""
    assert config.linear_attention is not None
    return dict(asdict(config.linear_attention), hidden_size=config.hidden_size,
                rms_norm_eps=config.rms_norm_eps, hidden_act=config.hidden_act)
