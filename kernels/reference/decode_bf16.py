"""The oracle of the decode attention in bfloat16 products (kernels/cpu/csrc/decode_bf16.h, which
csrc/paged_decode.c and csrc/prefix_attention.c run with bf16=True), in plain PyTorch.

A row's context is cut into chunks of `chunk` keys from its first token. In each chunk:

    s = bf16_matmul(q, K) * scale          each score over the pairs of dims in order, as vdpbf16ps sums them
    p = exp(s - max s);  sum = sum of p    float32, p unrounded
    o = bf16_matmul(p, V^T)                each output over the pairs of consecutive keys in order

and the chunks' (max, sum, o) are merged by log-sum-exp: out = sum_c e^(max_c - m) o_c / sum_c e^(max_c - m) sum_c.
The products' bits are the kernel's; its exp and the order of its sums of p are its own, so the two agree to
float32 rounding, not bit for bit. Slow (bf16_matmul's loop), for tests.
"""
from __future__ import annotations

import torch
from torch import Tensor

from kernels.reference.bf16_matmul import bf16_matmul


def paged_decode_with_lse(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, lengths: Tensor,
                          scale: float, chunk: int) -> tuple[Tensor, Tensor]:
    """q [batch, heads, dim]; k_cache, v_cache [blocks, block_size, kv_heads, dim]; each row attends to the first
    lengths[i] tokens of its block table. Returns out [batch, heads, dim] and lse [batch, heads] (float32)."""
    batch, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out, lse = q.new_zeros(batch, heads, dim), q.new_full((batch, heads), float("-inf"))
    for b in range(batch):
        length = int(lengths[b])
        if length == 0:
            continue
        blocks = block_tables[b, :(length + block_size - 1) // block_size]
        k = k_cache[blocks].reshape(-1, kv_heads, dim)[:length]
        v = v_cache[blocks].reshape(-1, kv_heads, dim)[:length]
        for head in range(heads):
            kv_head = head // (heads // kv_heads)
            out[b, head], lse[b, head] = _attend(q[b, head], k[:, kv_head], v[:, kv_head], scale, chunk)
    return out, lse


def _attend(query: Tensor, k: Tensor, v: Tensor, scale: float, chunk: int) -> tuple[Tensor, Tensor]:
    """One query row over keys k, v [length, dim]."""
    tops, sums, outputs = [], [], []
    for first in range(0, k.shape[0], chunk):
        scores = bf16_matmul(query[None], k[first:first + chunk])[0] * scale
        top = scores.max()
        weights = torch.exp(scores - top)
        tops.append(top)
        sums.append(weights.sum())
        outputs.append(bf16_matmul(weights[None], v[first:first + chunk].T.contiguous())[0])
    tops, sums, outputs = torch.stack(tops), torch.stack(sums), torch.stack(outputs)
    most = tops.max()
    factors = torch.exp(tops - most)
    total = (factors * sums).sum()
    return (factors[:, None] * outputs).sum(0) / total, most + torch.log(total)
