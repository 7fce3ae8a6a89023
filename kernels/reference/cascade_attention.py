"""Shared-prefix ("cascade") decode attention: the trunk's K/V is read once per step for all
the sequences that share it, instead of once per sequence.

    scores over [ trunk (shared blocks) | suffix (private blocks) ]
                  one batched product      paged, per sequence
                  -> out_t, lse_t          -> out_s, lse_s
    out = (out_t * e^(lse_t - m) + out_s * e^(lse_s - m)) / (e^(lse_t - m) + e^(lse_s - m))

The two halves are exact softmax pieces; merging by log-sum-exp in float32 gives the same
attention as one softmax over the whole context.
"""
from __future__ import annotations

import torch


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float):
    """Every query attends to all of one shared prefix (no mask).

    q: [batch, heads, dim]; k, v: [prefix_len, kv_heads, dim].
    Returns out [batch, heads, dim] (float32) and lse [batch, heads].
    """
    batch, heads, dim = q.shape
    kv_heads = k.shape[1]
    groups = heads // kv_heads
    # [kv_heads, batch * groups, dim]: every query head that reads a KV head, across the batch
    qg = q.float().view(batch, kv_heads, groups, dim).permute(1, 0, 2, 3).reshape(kv_heads, batch * groups, dim)
    kt = k.float().permute(1, 2, 0)            # [kv_heads, dim, prefix_len]
    vt = v.float().permute(1, 0, 2)            # [kv_heads, prefix_len, dim]
    scores = torch.bmm(qg, kt) * scale         # [kv_heads, batch * groups, prefix_len]
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.bmm(torch.exp(scores - lse[..., None]), vt)
    out = out.view(kv_heads, batch, groups, dim).permute(1, 0, 2, 3).reshape(batch, heads, dim)
    lse = lse.view(kv_heads, batch, groups).permute(1, 0, 2).reshape(batch, heads)
    return out, lse


def paged_decode_with_lse(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, lengths: torch.Tensor, scale: float):
    """Each query attends to the first `lengths[i]` tokens of its own block table.

    Returns out [batch, heads, dim] (float32) and lse [batch, heads]; a row with length 0
    gets lse = -inf and out = 0, so merging ignores it.
    """
    batch, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    groups = heads // kv_heads
    width = block_tables.shape[1] * block_size
    k = k_cache[block_tables].view(batch, width, kv_heads, dim).float()
    v = v_cache[block_tables].view(batch, width, kv_heads, dim).float()
    qg = q.float().view(batch, kv_heads, groups, dim)
    scores = torch.einsum("bhgd,bthd->bhgt", qg, k) * scale
    positions = torch.arange(width, device=q.device)
    scores.masked_fill_(positions[None, None, None, :] >= lengths[:, None, None, None], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.clamp_min(torch.finfo(torch.float32).min)[..., None])
    out = torch.einsum("bhgt,bthd->bhgd", probs, v)
    return out.reshape(batch, heads, dim), lse.reshape(batch, heads)


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """Combine two softmax pieces over disjoint key sets, in float32."""
    top = torch.maximum(lse_a, lse_b)
    weight_a = torch.exp(lse_a - top)
    weight_b = torch.exp(lse_b - top)
    total = weight_a + weight_b
    out = (out_a * weight_a[..., None] + out_b * weight_b[..., None]) / total[..., None]
    return out, top + torch.log(total)
