"""Paged attention against torch's own scaled_dot_product_attention on contiguous K/V."""
import pytest
import torch
import torch.nn.functional as F

from kernels.reference import paged_attention

BLOCK, KV_HEADS, HEADS, DIM = 4, 2, 6, 8


def scatter_into_pool(seqs_k, seqs_v, num_blocks=64, seed=0):
    """Puts each sequence's K/V in randomly chosen blocks; returns the pool and block tables."""
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, DIM, generator=gen)
    v_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, DIM, generator=gen)
    tables = []
    for k, v in zip(seqs_k, seqs_v):
        n_blocks = -(-k.shape[0] // BLOCK)
        table = [order.pop() for _ in range(n_blocks)]
        slots = torch.tensor([table[t // BLOCK] * BLOCK + t % BLOCK for t in range(k.shape[0])])
        paged_attention.write_kv(k_cache, v_cache, k, v, slots)
        tables.append(torch.tensor(table))
    return k_cache, v_cache, tables


def dense_reference(q, k, v, causal_offset):
    """q: [new, heads, dim]; k, v: [ctx, kv_heads, dim]; query i sees keys <= causal_offset + i."""
    groups = HEADS // KV_HEADS
    kh = k.repeat_interleave(groups, dim=1).transpose(0, 1)
    vh = v.repeat_interleave(groups, dim=1).transpose(0, 1)
    mask = torch.ones(q.shape[0], k.shape[0], dtype=torch.bool).tril(diagonal=causal_offset)
    return F.scaled_dot_product_attention(q.transpose(0, 1), kh, vh, attn_mask=mask).transpose(0, 1)


@pytest.mark.parametrize("seed", range(3))
def test_prefill_on_top_of_cached_tokens(seed):
    gen = torch.Generator().manual_seed(seed)
    ctx_lens, new_lens = [13, 4, 21], [5, 4, 1]
    ks = [torch.randn(n, KV_HEADS, DIM, generator=gen) for n in ctx_lens]
    vs = [torch.randn(n, KV_HEADS, DIM, generator=gen) for n in ctx_lens]
    qs = [torch.randn(n, HEADS, DIM, generator=gen) for n in new_lens]
    k_cache, v_cache, tables = scatter_into_pool(ks, vs, seed=seed)
    out = paged_attention.prefill_attention(torch.cat(qs), k_cache, v_cache, tables, ctx_lens, new_lens,
                                            scale=DIM ** -0.5)
    expected = torch.cat([dense_reference(q, k, v, ctx - new) for q, k, v, ctx, new
                          in zip(qs, ks, vs, ctx_lens, new_lens)])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_batched_decode_with_a_different_length_per_sequence(seed):
    gen = torch.Generator().manual_seed(seed)
    ctx_lens = [1, 9, 16, 30]
    ks = [torch.randn(n, KV_HEADS, DIM, generator=gen) for n in ctx_lens]
    vs = [torch.randn(n, KV_HEADS, DIM, generator=gen) for n in ctx_lens]
    q = torch.randn(len(ctx_lens), HEADS, DIM, generator=gen)
    k_cache, v_cache, tables = scatter_into_pool(ks, vs, seed=seed)
    width = max(len(t) for t in tables)
    padded = torch.stack([torch.cat([t, torch.zeros(width - len(t), dtype=torch.long)]) for t in tables])
    out = paged_attention.decode_attention(q, k_cache, v_cache, padded, torch.tensor(ctx_lens), DIM ** -0.5)
    expected = torch.cat([dense_reference(q[i:i + 1], ks[i], vs[i], ctx_lens[i] - 1) for i in range(len(ctx_lens))])
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
