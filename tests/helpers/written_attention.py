"""Prompt attention written out in torch (scores, mask, softmax, weighted values) in float64, and random inputs
for it: the oracle the C prefill kernels are checked against (tests/kernels/cpu/test_rows_attention*.py)."""
import torch


def inputs(tokens, keys, heads, kv_heads, dim, seed=0, spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(tokens, heads, dim, generator=gen) * spread
    return q, torch.randn(keys, kv_heads, dim, generator=gen), torch.randn(keys, kv_heads, dim, generator=gen)


def written_out(q, k, v, scale, causal):
    """out, lse in float64, each head reading its KV head, token i at key position keys - tokens + i."""
    tokens, heads, _ = q.shape
    keys, kv_heads, _ = k.shape
    kk, vv = (t.double().repeat_interleave(heads // kv_heads, 1) for t in (k, v))
    scores = torch.einsum("qhd,khd->hqk", q.double(), kk) * scale
    if causal:
        positions = torch.arange(keys - tokens, keys)
        scores.masked_fill_(torch.arange(keys)[None, None, :] > positions[None, :, None], float("-inf"))
    return torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv), torch.logsumexp(scores, -1).T
