"""Attention over paged KV: the plain PyTorch reference that every fast path is checked against.

K/V live in a pool shaped [num_blocks, block_size, kv_heads, head_dim]. A sequence's
block table lists its blocks in order; token t sits at block_table[t // B], slot t % B.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store new K/V ([tokens, kv_heads, head_dim]) at flat slots block_id * B + offset."""
    flat_k = k_cache.view(-1, *k_cache.shape[2:])
    flat_v = v_cache.view(-1, *v_cache.shape[2:])
    flat_k.index_copy_(0, slot_mapping, k.to(flat_k.dtype))
    flat_v.index_copy_(0, slot_mapping, v.to(flat_v.dtype))


def gather_kv(cache: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """The first `length` tokens of one sequence: [length, kv_heads, head_dim]."""
    blocks = cache.index_select(0, block_table[: -(-length // cache.shape[1])])
    return blocks.reshape(-1, *cache.shape[2:])[:length]


def prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                      block_tables: list[torch.Tensor], context_lens: list[int],
                      query_lens: list[int], scale: float, rows_attention=None) -> torch.Tensor:
    """Causal attention for new tokens on top of each sequence's cached ones.

    q: [sum(query_lens), heads, head_dim], sequences packed in order. The new tokens of a
    sequence are the last query_len of its context_len tokens. rows_attention: a faster kernel with
    native_attention.rows_attention's contract; None for torch's SDPA.
    """
    outputs, start = [], 0
    for table, ctx, qlen in zip(block_tables, context_lens, query_lens):
        k = gather_kv(k_cache, table, ctx)
        v = gather_kv(v_cache, table, ctx)
        if rows_attention is None:
            outputs.append(_causal_attention(q[start:start + qlen], k, v, scale))
        else:
            outputs.append(rows_attention(q[start:start + qlen], k, v, scale, True)[0].to(q.dtype))
        start += qlen
    return torch.cat(outputs)


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One new token per sequence. q: [batch, heads, head_dim]; block_tables: [batch, max_blocks]
    padded with any valid block id; context_lens: [batch] including the new token."""
    batch, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_len = block_tables.shape[1] * block_size
    k = k_cache[block_tables].reshape(batch, max_len, kv_heads, dim)
    v = v_cache[block_tables].reshape(batch, max_len, kv_heads, dim)
    k, v = _expand_kv(k.transpose(1, 2), heads), _expand_kv(v.transpose(1, 2), heads)
    scores = torch.einsum("bhd,bhtd->bht", q.float(), k.float()) * scale
    positions = torch.arange(max_len, device=q.device)
    scores.masked_fill_(positions[None, None, :] >= context_lens[:, None, None], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("bht,bhtd->bhd", probs, v.float()).to(q.dtype)


def _causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # [1, heads, tokens, dim]: the fused (flash) CPU kernel takes 4-D inputs only
    qlen, ctx = q.shape[0], k.shape[0]
    qh = q.transpose(0, 1).unsqueeze(0)
    kh = k.transpose(0, 1).unsqueeze(0).to(qh.dtype)
    vh = v.transpose(0, 1).unsqueeze(0).to(qh.dtype)
    if ctx == qlen:
        out = F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, scale=scale, enable_gqa=True)
    else:
        rows = torch.arange(ctx - qlen, ctx, device=q.device)[:, None]
        mask = torch.arange(ctx, device=q.device)[None, :] <= rows
        out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


def _expand_kv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """Grouped-query attention: repeat each KV head for the query heads that read it."""
    kv_heads = x.shape[-3]
    if kv_heads == heads:
        return x
    return x.repeat_interleave(heads // kv_heads, dim=-3)
