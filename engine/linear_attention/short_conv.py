"""The depthwise causal convolution (then SiLU) that mixes each channel over its last `kernel` inputs, before the
gated delta rule. A sequence's conv state is its last kernel − 1 inputs (zeros before its first token), so a
prompt cut into the scheduler's chunks, or a prompt then its decode steps, sees the same windows as one pass.

A packed batch is convolved in one call: each sequence's state is put before its tokens, and of the windows
over the whole row only those ending on a token are kept.

    extended: | state₀ (K−1) | tokens₀ (T₀) | state₁ (K−1) | tokens₁ (T₁) | ...
    window of token t of sequence i: the K inputs ending at it, starting at offset_i + t
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_conv1d(x: torch.Tensor, seq_lens: list[int], weight: torch.Tensor,
                  conv_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x: [tokens, channels], the sequences' tokens one after another; seq_lens: each sequence's token count (>= 1);
    weight: [channels, kernel]; conv_states: [sequences, channels, kernel − 1].
    Returns SiLU(conv(x)) [tokens, channels] and the new conv states; the states given are not changed."""
    assert len(seq_lens) == conv_states.shape[0] and min(seq_lens) >= 1 and sum(seq_lens) == x.shape[0]
    state_len = weight.shape[-1] - 1
    pieces = []
    for state, tokens in zip(conv_states, x.split(seq_lens)):
        pieces += [state.transpose(0, 1), tokens]
    extended = torch.cat(pieces).to(weight.dtype).transpose(0, 1)   # [channels, tokens + sequences·(kernel − 1)]
    windows = F.conv1d(extended.unsqueeze(0), weight.unsqueeze(1), groups=weight.shape[0]).squeeze(0)

    lengths = torch.tensor(seq_lens, device=x.device)
    offsets = torch.cumsum(lengths + state_len, dim=0) - (lengths + state_len)
    token_in_sequence = torch.arange(x.shape[0], device=x.device) - torch.repeat_interleave(
        torch.cumsum(lengths, dim=0) - lengths, lengths)
    out = windows[:, torch.repeat_interleave(offsets, lengths) + token_in_sequence].transpose(0, 1)

    last_inputs = (offsets + lengths).unsqueeze(-1) + torch.arange(state_len, device=x.device)
    new_states = extended[:, last_inputs].permute(1, 0, 2)
    return F.silu(out).to(x.dtype), new_states.to(conv_states.dtype)


def causal_conv1d_step(x: torch.Tensor, weight: torch.Tensor,
                       conv_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for each sequence (decode). x: [sequences, channels]; weight: [channels, kernel];
    conv_states: [sequences, channels, kernel − 1]. Returns SiLU(conv) [sequences, channels] and the new states."""
    window = torch.cat([conv_states, x.unsqueeze(-1)], dim=-1).to(weight.dtype)
    out = F.silu((window * weight).sum(dim=-1))
    return out.to(x.dtype), window[..., 1:].to(conv_states.dtype)
