"""The gated delta rule (Yang et al., "Gated Delta Networks"), in plain PyTorch with float32 state.

Per value head, a state S of shape [k_dim, v_dim] maps keys to values. Each token decays it, corrects what it
predicts for the token's key towards the token's value, and is read by the token's query:

    S ← exp(g)·S                 g <= 0: the gate, in log space
    S ← S + k·(β·(v − Sᵀk))ᵀ     β in (0, 1): how far the prediction Sᵀk moves to v
    o  = Sᵀq·k_dim^-0.5

Queries and keys come L2-normalised (the layer does it); the query scale is applied here. Key heads are shared
by value heads: value head h reads key head h // (value_heads // key_heads).

`recurrent_gated_delta_step` runs that recurrence for one token of each sequence in a batch (decode).
`chunked_gated_delta_rule` gives the same outputs for one sequence's run of tokens (a prompt, or one of the
scheduler's prefill chunks of it) in a few matmuls a chunk; both continue from the state they are given.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(|x|² + eps) over the last dim, in x's dtype (eps inside the root, as flash-linear-attention)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def share_key_heads(x: torch.Tensor, num_value_heads: int) -> torch.Tensor:
    """[..., key_heads, dim] -> [..., value_heads, dim]: each key head repeated for the value heads it serves."""
    return x.repeat_interleave(num_value_heads // x.shape[-2], dim=-2)


def recurrent_gated_delta_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for each of B sequences.

    q, k: [B, key_heads, k_dim]; v: [B, value_heads, v_dim]; g, beta: [B, value_heads];
    state: [B, value_heads, k_dim, v_dim]. Returns out [B, value_heads, v_dim] in v's dtype and the new state
    (float32); the state given is not changed.
    """
    num_heads = v.shape[-2]
    q, k = (share_key_heads(x, num_heads).float() for x in (q, k))
    q = q * q.shape[-1] ** -0.5
    state = state.float() * g.float().exp()[..., None, None]
    predicted = (k.unsqueeze(-2) @ state).squeeze(-2)
    correction = (v.float() - predicted) * beta.float().unsqueeze(-1)
    state = state + k.unsqueeze(-1) * correction.unsqueeze(-2)
    out = (q.unsqueeze(-2) @ state).squeeze(-2)
    return out.to(v.dtype), state


def chunked_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             beta: torch.Tensor, initial_state: torch.Tensor,
                             chunk_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """T tokens of one sequence, in chunks of `chunk_size`.

    q, k: [T, key_heads, k_dim]; v: [T, value_heads, v_dim]; g, beta: [T, value_heads];
    initial_state: [value_heads, k_dim, v_dim]. Returns out [T, value_heads, v_dim] in v's dtype and the state
    after the last token (float32).

    Inside a chunk, with Γ_r the decay from the chunk's start S₀ to position r, the corrections
    u_r = β_r·(v_r − (Γ_r·S₀ + Σ_{s<r} Γ_r/Γ_s·k_s·u_sᵀ)ᵀk_r) solve one unit lower-triangular system
    (I + A)·U = β·V − β·Γ·K·S₀, A_rs = β_r·Γ_r/Γ_s·k_r·k_s (s < r); then
    o_r = Γ_r·S₀ᵀq_r + Σ_{s<=r} Γ_r/Γ_s·(q_r·k_s)·u_s, and the chunk ends at Γ_C·S₀ + Σ_s Γ_C/Γ_s·k_s·u_sᵀ.
    Everything but S₀ is computed for all chunks at once; only the hand-over of S₀ from chunk to chunk is a loop.
    """
    length, num_heads = v.shape[0], v.shape[-2]
    q, k = (share_key_heads(x, num_heads) for x in (q, k))
    q = q.float() * q.shape[-1] ** -0.5
    q, k, v = (to_chunks(x, chunk_size) for x in (q, k, v))
    g, beta = (to_chunks(x.unsqueeze(-1), chunk_size).squeeze(-1) for x in (g, beta))

    log_decay = g.cumsum(dim=-1)
    causal = torch.ones(chunk_size, chunk_size, dtype=torch.bool, device=q.device).tril()
    decay_between = (log_decay.unsqueeze(-1) - log_decay.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()
    k_beta = k * beta.unsqueeze(-1)
    system = (k_beta @ k.transpose(-1, -2)) * decay_between   # its diagonal is read as 1 (unitriangular)
    value_corrections = solve_unit_lower(system, v * beta.unsqueeze(-1))
    state_corrections = solve_unit_lower(system, k_beta * log_decay.exp().unsqueeze(-1))
    scores = (q @ k.transpose(-1, -2)) * decay_between
    q_from_start = q * log_decay.exp().unsqueeze(-1)
    k_to_end = k * (log_decay[..., -1:] - log_decay).exp().unsqueeze(-1)
    chunk_decay = log_decay[..., -1].exp()[..., None, None]

    state = initial_state.float()
    outputs = []
    for chunk in range(q.shape[1]):
        corrections = value_corrections[:, chunk] - state_corrections[:, chunk] @ state
        outputs.append(q_from_start[:, chunk] @ state + scores[:, chunk] @ corrections)
        state = state * chunk_decay[:, chunk] + k_to_end[:, chunk].transpose(-1, -2) @ corrections
    out = torch.stack(outputs, dim=1).flatten(1, 2)[:, :length].transpose(0, 1)
    return out.to(v.dtype), state


def to_chunks(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """[T, heads, dim] -> [heads, chunks, chunk_size, dim] in float32, zero-padded at the end. A padded token has
    β = 0 and g = 0, so it neither changes the state nor decays it."""
    padding = -x.shape[0] % chunk_size
    x = F.pad(x.float(), (0, 0, 0, 0, 0, padding))
    return x.unflatten(0, (-1, chunk_size)).permute(2, 0, 1, 3)


def solve_unit_lower(system: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    return torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
