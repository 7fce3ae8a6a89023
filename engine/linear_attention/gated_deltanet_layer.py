"""Qwen3.5's Gated DeltaNet layer over a packed batch: [tokens, hidden] in, [tokens, hidden] out, each sequence's
state (`LinearState`) carried in and handed back updated.

    hidden ─┬─ in_proj_qkv ─ causal conv, SiLU ─ q, k, v; L2-normalise q, k ─┐
            ├─ in_proj_b ─ β = sigmoid(b) ───────────────────────────────────┼─ gated delta rule ─ o
            ├─ in_proj_a ─ g = −exp(A_log)·softplus(a + dt_bias) ────────────┘
            └─ in_proj_z ─ z
    out = out_proj(RMSNorm(o)·silu(z)), the norm over each value head

A sequence with one token in the batch (a decode step, or a one-token prefill chunk) takes the recurrent step,
batched with the others like it; the sequences with more take the chunked rule together. Both give
the same outputs and state to rounding, so where a prompt is cut does not matter.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

import torch
import torch.nn.functional as F
from torch import nn

from engine.errors import UnsupportedArchitectureError
from engine.linear import Linear
from engine.linear_attention.delta_rule_kernels import delta_rule_kernels
from engine.linear_attention.gated_delta_rule import l2_normalize
from engine.linear_attention.short_conv import causal_conv1d, causal_conv1d_step
from engine.quantized_layers import each_of


@dataclass(slots=True)
class LinearState:
    """One sequence's state in one layer: `conv` [conv_dim, kernel − 1], its last inputs to the convolution, and
    `recurrent` [value_heads, k_dim, v_dim] (float32), the delta rule's state."""
    conv: torch.Tensor
    recurrent: torch.Tensor


class GatedRMSNorm(nn.Module):
    """RMSNorm over each head's v_dim (weight·x, not x·(1 + w)), then times silu(gate), computed in float32."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        return (self.weight * normed * F.silu(gate.float())).to(x.dtype)


class GatedDeltaNet(nn.Module):
    """Parameters named as the checkpoint names them (`model.layers.N.linear_attn.*`), so a transformers
    `Qwen3_5GatedDeltaNet`'s state dict loads as it is. The projections are engine.linear's `Linear`, which
    loading may swap for other kinds (oneDNN's packed layout on a float32 CPU)."""

    def __init__(self, config: dict):
        super().__init__()
        check_config(config)
        self.num_key_heads = config["linear_num_key_heads"]
        self.num_value_heads = config["linear_num_value_heads"]
        self.key_head_dim = config["linear_key_head_dim"]
        self.value_head_dim = config["linear_value_head_dim"]
        self.key_dim = self.num_key_heads * self.key_head_dim
        self.value_dim = self.num_value_heads * self.value_head_dim
        self.conv_dim = 2 * self.key_dim + self.value_dim
        hidden = config["hidden_size"]
        kernel = config["linear_conv_kernel_dim"]

        self.in_proj_qkv = Linear(hidden, self.conv_dim, bias=False)
        self.in_proj_z = Linear(hidden, self.value_dim, bias=False)
        self.in_proj_b = Linear(hidden, self.num_value_heads, bias=False)
        self.in_proj_a = Linear(hidden, self.num_value_heads, bias=False)
        # Holds the checkpoint's [conv_dim, 1, kernel] weight; short_conv applies it, over packed sequences.
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.ones(self.num_value_heads))
        self.A_log = nn.Parameter(torch.zeros(self.num_value_heads))
        self.norm = GatedRMSNorm(self.value_head_dim, config["rms_norm_eps"])
        self.out_proj = Linear(self.value_dim, hidden, bias=False)

    def initial_state(self) -> LinearState:
        """The state before a sequence's first token: zeros."""
        weight = self.conv1d.weight
        conv = weight.new_zeros(self.conv_dim, weight.shape[-1] - 1)
        recurrent = torch.zeros(self.num_value_heads, self.key_head_dim, self.value_head_dim,
                                dtype=torch.float32, device=weight.device)
        return LinearState(conv, recurrent)

    def forward(self, hidden: torch.Tensor, seq_lens: list[int],
                states: list[LinearState]) -> tuple[torch.Tensor, list[LinearState]]:
        """hidden: [tokens, hidden_size], the sequences' tokens one after another; seq_lens: each one's token
        count; states: each one's state before its tokens. Returns the outputs and each sequence's new state."""
        qkv, z, b, a = each_of([self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a], hidden)
        mixed, conv_states = self.convolve(qkv, seq_lens, states)
        q, k, v = self.split_heads(mixed)
        beta = b.float().sigmoid()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        core, recurrent_states = run_delta_rule(q, k, v, g, beta, seq_lens, [s.recurrent for s in states])
        gate = z.unflatten(-1, (self.num_value_heads, self.value_head_dim))
        out = self.out_proj(self.norm(core, gate).flatten(1))
        return out, [LinearState(conv, recurrent) for conv, recurrent in zip(conv_states, recurrent_states)]

    def convolve(self, mixed: torch.Tensor, seq_lens: list[int],
                 states: list[LinearState]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        weight = self.conv1d.weight.squeeze(1)
        conv_states = torch.stack([state.conv for state in states])
        if all(length == 1 for length in seq_lens):
            mixed, conv_states = causal_conv1d_step(mixed, weight, conv_states)
        else:
            mixed, conv_states = causal_conv1d(mixed, seq_lens, weight, conv_states)
        return mixed, list(conv_states.unbind())

    def split_heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q, k = (l2_normalize(x.unflatten(-1, (self.num_key_heads, self.key_head_dim)).float()) for x in (q, k))
        return q, k, v.unflatten(-1, (self.num_value_heads, self.value_head_dim))


def run_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   seq_lens: list[int], states: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The rule over a packed batch, on the kernels for its device (engine.linear_attention.delta_rule_kernels):
    one batched recurrent step for the one-token sequences, one call of the chunked rule for the longer ones.
    Returns out [tokens, value_heads, v_dim] and each sequence's new recurrent state."""
    kernels = delta_rule_kernels(v.device.type)
    out = v.new_empty(v.shape)
    new_states = list(states)
    starts = list(accumulate(seq_lens, initial=0))
    single = [i for i, length in enumerate(seq_lens) if length == 1]
    longer = [i for i, length in enumerate(seq_lens) if length > 1]
    for chosen in (single, longer):
        if not chosen:
            continue
        rows = torch.tensor([t for i in chosen for t in range(starts[i], starts[i + 1])], device=v.device)
        inputs = (q[rows], k[rows], v[rows], g[rows], beta[rows])
        before = torch.stack([states[i] for i in chosen])
        if chosen is single:
            out[rows], after = kernels.step(*inputs, before)
        else:
            out[rows], after = kernels.prompts(*inputs, [seq_lens[i] for i in chosen], before)
        for i, state in zip(chosen, after.unbind()):
            new_states[i] = state
    return out, new_states


def check_config(config: dict) -> None:
    act = config.get("hidden_act", "silu")
    if act != "silu":
        raise UnsupportedArchitectureError(f"linear attention with hidden_act {act!r} is not supported: "
                                           "Qwen3.5's Gated DeltaNet uses 'silu'")
    if config["linear_num_value_heads"] % config["linear_num_key_heads"]:
        raise UnsupportedArchitectureError(
            f"linear_num_value_heads ({config['linear_num_value_heads']}) must be a multiple of "
            f"linear_num_key_heads ({config['linear_num_key_heads']})")
