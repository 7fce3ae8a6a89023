"""The decoder-only transformer of the Llama family (Llama, Mistral, Qwen2, Qwen3), in plain PyTorch.

Tokens of all sequences in a step are packed into one flat batch; attention reads and
writes the paged KV pool through the step's `AttentionBackend` (engine.attention).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from engine import fused_decode, prompt_matmul, quantized_layers
from engine.attention.base import AttentionBackend, AttentionBatch
from engine.linear import Linear
from engine.loading.config import ModelConfig
from kernels.cpu import fused_ops


def rows_apart(layer: nn.Module, x: torch.Tensor, split: int | None) -> torch.Tensor:
    """`layer(x)`, with the rows before `split` (a mixed step's decode rows) multiplied apart from the
    prompt rows after it: matmul kernels choose their blocking, and so the order of their sums, by the
    number of rows, and a decode row must get the very logits a decode-only step gives it (in float32, where
    prompt rows may take bfloat16 products: engine.prompt_matmul)."""
    if split is None:
        return layer(x)
    with prompt_matmul.decode_rows():
        decode = layer(x[:split])
    return torch.cat((decode, layer(x[split:])))


def projections(layers: list[nn.Module], x: torch.Tensor, split: int | None) -> list[torch.Tensor]:
    """[rows_apart(layer, x, split) for layer in layers]: for a decode-only step, in one kernel call where the
    layers' weights can take it (engine.quantized_layers.together)."""
    if split is None:
        return quantized_layers.each_of(layers, x)
    return [rows_apart(layer, x, split) for layer in layers]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = fused_ops.rms_norm(x, self.weight, self.eps)
        if fused is not None:
            return fused
        return self.weight * rms_normalized(x.float(), self.eps).to(x.dtype)


def rms_normalized(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.register_buffer("inv_freq", _inv_freq(config), persistent=False)

    def forward(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float()[:, None] * self.inv_freq.float()[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def _inv_freq(config: ModelConfig) -> torch.Tensor:
    dim = config.rotary_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    if not scaling:
        return inv
    factor = scaling["factor"]
    low, high = scaling.get("low_freq_factor", 1.0), scaling.get("high_freq_factor", 4.0)
    old_ctx = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_ctx / low, old_ctx / high
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / factor, inv)
    smooth = (old_ctx / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [tokens, heads, head_dim]; cos/sin: [tokens, rotary_dim]. Partial rotary (rotary_dim < head_dim)
    turns the leading rotary_dim dims of each head and passes the rest through."""
    rotary_dim = cos.shape[-1]
    if rotary_dim < x.shape[-1]:
        return torch.cat((apply_rotary(x[..., :rotary_dim], cos, sin), x[..., rotary_dim:]), dim=-1)
    fused = fused_ops.rotary(x, cos, sin)
    if fused is not None:
        return fused
    cos, sin = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return x * cos + _rotate_half(x) * sin


class Attention(nn.Module):
    """`layer_index`: the layer's place in the KV pool. A subclass may widen q_proj (`query_parts` blocks
    of head_dim per head, the query first) and norm q and k its own way (`norm_type`)."""

    query_parts = 1
    norm_type: type[nn.Module] = RMSNorm

    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.layer_index = layer_index
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        bias = config.attention_bias
        self.q_proj = Linear(config.hidden_size, self.query_parts * self.num_heads * self.head_dim, bias=bias)
        self.k_proj = Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        if config.qk_norm:
            self.q_norm = self.norm_type(self.head_dim, config.rms_norm_eps)
            self.k_norm = self.norm_type(self.head_dim, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rotary, batch: AttentionBatch, attention: AttentionBackend) -> torch.Tensor:
        """Attention output of the tokens whose queries attend (`batch.query_rows`); every token's K/V
        is written."""
        q, k, v = self.project(x, batch)
        out = self.attend(q, k, v, rotary, batch, attention)
        return rows_apart(self.o_proj, out.reshape(q.shape[0], -1), batch.decode_split)

    def project(self, x: torch.Tensor, batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q_proj of the query rows ([rows, heads, query_parts · head_dim]); k_proj and v_proj of every token
        ([tokens, kv_heads, head_dim])."""
        rows, split = batch.query_rows, batch.decode_split
        if rows is None:
            q, k, v = projections([self.q_proj, self.k_proj, self.v_proj], x, split)
        else:
            q = rows_apart(self.q_proj, x[rows], split)
            k, v = projections([self.k_proj, self.v_proj], x, split)
        kv_shape = (x.shape[0], self.num_kv_heads, self.head_dim)
        return q.view(q.shape[0], self.num_heads, self.query_parts * self.head_dim), k.view(kv_shape), v.view(kv_shape)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotary, batch: AttentionBatch,
               attention: AttentionBackend) -> torch.Tensor:
        """Writes the K/V of every token, and attends with the queries `q`: [rows, heads, head_dim]."""
        rows = batch.query_rows
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        cos, sin = rotary
        q = apply_rotary(q, cos, sin) if rows is None else apply_rotary(q, cos[rows], sin[rows])
        k = apply_rotary(k, cos, sin)
        return attention.forward(q, k, v, self.layer_index, batch)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, split: int | None = None) -> torch.Tensor:
        gate, up = projections([self.gate_proj, self.up_proj], x, split)
        return rows_apart(self.down_proj, fused_decode.silu_mul(gate, up), split)


_NOT_MADE = object()


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int):
        super().__init__()
        self.self_attn = Attention(config, layer_index)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self._decode_kernel = _NOT_MADE

    def forward(self, x: torch.Tensor, rotary, batch: AttentionBatch, attention: AttentionBackend) -> torch.Tensor:
        kernel = None if batch.is_prefill else self.decode_kernel()
        if kernel is not None and fused_decode.takes(kernel, x, rotary):
            return fused_decode.layer_step(self, kernel, x, rotary, batch, attention)
        attended = self.self_attn(self.input_layernorm(x), rotary, batch, attention)
        rows = batch.query_rows
        x = (x if rows is None else x[rows]) + attended
        return x + self.mlp(self.post_attention_layernorm(x), batch.decode_split)

    def decode_kernel(self):
        """The layer's decode step in C (engine.fused_decode), made on the first decode step (after loading has
        swapped in the quantized layers); None where a part of the layer is not the plain one."""
        if self._decode_kernel is _NOT_MADE:
            attn = self.self_attn
            norms = [self.input_layernorm, self.post_attention_layernorm]
            norms += [attn.q_norm, attn.k_norm] if hasattr(attn, "q_norm") else []
            plain = type(attn) is Attention and type(self.mlp) is MLP and all(type(n) is RMSNorm for n in norms)
            self._decode_kernel = fused_decode.kernel_for(self) if plain else None
        return self._decode_kernel


class DecoderModel(nn.Module):
    layer_type: type[nn.Module] = DecoderLayer
    norm_type: type[nn.Module] = RMSNorm

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(self.layer_type(config, i) for i in range(config.num_layers))
        self.norm = self.norm_type(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb = RotaryEmbedding(config)


class CausalLM(nn.Module):
    decoder_type: type[nn.Module] = DecoderModel

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.model = self.decoder_type(config)
        self._decode_stack = fused_decode.StackCache()
        self.lm_head = Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, batch: AttentionBatch,
                attention: AttentionBackend) -> torch.Tensor:
        """Hidden states of each sequence's last new token: [seqs, hidden] (`attention` has planned
        `batch`). The last layer computes only those rows; every token's K/V is written in every layer."""
        x = self.model.embed_tokens(input_ids)
        rotary = self.model.rotary_emb(positions)
        stacked = self._stacked_step(x, rotary, batch, attention)
        if stacked is not None:
            return self.model.norm(stacked)
        *layers, last = self.model.layers
        for layer in layers:
            x = layer(x, rotary, batch, attention)
        return self.model.norm(last(x, rotary, batch.last_tokens(), attention))

    def _stacked_step(self, x, rotary, batch: AttentionBatch, attention: AttentionBackend) -> torch.Tensor | None:
        """A decode-only step through every layer as one C call (engine.fused_decode), or None: the layers then
        run one by one. Only a plain stack of DecoderLayers takes it: a subclass's layers compute other things."""
        if batch.is_prefill or any(type(layer) is not DecoderLayer for layer in self.model.layers):
            return None
        stack = self._decode_stack.stack(list(self.model.layers), attention)
        return None if stack is None else fused_decode.stack_step(stack, x, rotary, batch)

    def compute_logits(self, hidden: torch.Tensor, split: int | None = None) -> torch.Tensor:
        return rows_apart(self.lm_head, hidden, split)
