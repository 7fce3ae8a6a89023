"""Prefill of prompts that continue one cached trunk, against the plain paged reference."""
import pytest
import torch

from engine.attention.plan import plan_prefill
from kernels.cpu import cascade_prefill, native_attention, sdpa_attention
from kernels.reference import paged_attention

BLOCK, KV_HEADS, HEADS, DIM = 4, 2, 6, 8
SCALE = DIM ** -0.5
CPU = torch.device("cpu")


def prefix_kv(cache, prefix):
    ids = prefix.blocks if prefix.blocks is not None else torch.arange(prefix.first_block,
                                                                         prefix.first_block + prefix.num_blocks)
    return cache[ids].reshape(-1, *cache.shape[2:])


KERNELS = [pytest.param(None, id="sdpa"),
           pytest.param(native_attention.RowsKernel(), id="native",
                        marks=pytest.mark.skipif(not native_attention.available(), reason="no C compiler"))]


def run_both(tables, starts, query_lens, dtype=torch.float32, seed=0, min_prefix_tokens=8, rows_attention=None):
    gen = torch.Generator().manual_seed(seed)
    k_cache = torch.randn(64, BLOCK, KV_HEADS, DIM, generator=gen).to(dtype)
    v_cache = torch.randn(64, BLOCK, KV_HEADS, DIM, generator=gen).to(dtype)
    q = torch.randn(sum(query_lens), HEADS, DIM, generator=gen).to(dtype)
    context_lens = [s + n for s, n in zip(starts, query_lens)]
    block_tables = [torch.tensor(t) for t in tables]
    groups = plan_prefill(tables, starts, query_lens, BLOCK, CPU, min_prefix_tokens)
    expected = paged_attention.prefill_attention(q.float(), k_cache.float(), v_cache.float(), block_tables,
                                                 context_lens, query_lens, SCALE)
    got = cascade_prefill.prefill_attention(q, k_cache, v_cache, block_tables, context_lens, query_lens,
                                            groups, SCALE, prefix_kv, rows_attention)
    return groups, got, expected


@pytest.mark.parametrize("rows_attention", KERNELS)
@pytest.mark.parametrize("seed", range(3))
def test_suffixes_after_a_shared_trunk_match_the_reference(seed, rows_attention):
    trunk = [3, 4, 5, 6, 7]                                   # 20 tokens, all cached
    tables = [trunk + [10, 11], trunk + [12, 13, 14], trunk + [15]]
    starts, query_lens = [20, 20, 20], [6, 10, 3]
    groups, got, expected = run_both(tables, starts, query_lens, seed=seed, rows_attention=rows_attention)
    assert [seqs for seqs, _ in groups] == [[0, 1, 2]] and groups[0][1].num_blocks == 5
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("rows_attention", KERNELS)
def test_cached_parts_past_the_trunk_mid_block_starts_and_a_lone_prompt(rows_attention):
    trunk = [1, 2, 3, 4]
    tables = [trunk + [20, 21, 22], [30, 31], trunk + [23, 24], trunk[:2] + [25, 26, 27]]
    starts = [22, 3, 17, 9]                                   # row 3 shares only 2 blocks: the group takes 2
    query_lens = [5, 4, 3, 10]
    groups, got, expected = run_both(tables, starts, query_lens, rows_attention=rows_attention)
    assert [(seqs, prefix.num_blocks) for seqs, prefix in groups] == [([0, 2, 3], 2)]
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_a_trunk_not_yet_computed_for_every_prompt_is_not_shared():
    tables = [[1, 2, 3, 9], [1, 2, 3, 10]]
    groups, got, expected = run_both(tables, [12, 2], [3, 12])
    assert groups == []  # the second prompt still computes the trunk's tokens itself
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_bfloat16_stays_close():
    trunk = [3, 4, 5, 6, 7]
    groups, got, expected = run_both([trunk + [10, 11], trunk + [12]], [20, 20], [7, 4], dtype=torch.bfloat16)
    assert groups
    torch.testing.assert_close(got.float(), expected, atol=3e-2, rtol=3e-2)


def test_the_causal_tail_gives_the_oracles_lse():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(5, HEADS, DIM, generator=gen)
    k = torch.randn(9, KV_HEADS, DIM, generator=gen)
    v = torch.randn(9, KV_HEADS, DIM, generator=gen)
    out, lse = sdpa_attention.causal_tail_with_lse(q, k, v, SCALE)
    kk, vv = k.repeat_interleave(HEADS // KV_HEADS, 1), v.repeat_interleave(HEADS // KV_HEADS, 1)
    scores = torch.einsum("qhd,khd->hqk", q, kk) * SCALE
    scores.masked_fill_(torch.arange(9)[None, None, :] > torch.arange(4, 9)[None, :, None], float("-inf"))
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1).T, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, torch.einsum("hqk,khd->qhd", scores.softmax(-1), vv), atol=1e-5, rtol=1e-5)


NATIVE = pytest.mark.skipif(not native_attention.available(), reason="no C compiler for the kernels")


@NATIVE
@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("trunk_tokens", [512, 600, 100])
def test_the_native_kernel_gives_each_prompt_the_bits_it_gets_alone(trunk_tokens, bf16):
    """A trunk of two whole chunks, one that ends inside a chunk, and one shorter than a chunk: each prompt's rows
    get the bits of the same kernel causal over the prompt's whole context, in either precision of products."""
    block, kv_heads, heads, dim = 16, 3, 9, 64
    gen = torch.Generator().manual_seed(trunk_tokens)
    trunk = list(range(trunk_tokens // block))
    k_cache, v_cache = (torch.randn(len(trunk) + 20, block, kv_heads, dim, generator=gen) for _ in range(2))
    after = len(trunk)
    tables = [trunk + [after + 1, after + 2], trunk + [after + 5], trunk + [after + 9, after + 10, after + 11]]
    starts, query_lens = [trunk_tokens + 3, trunk_tokens, trunk_tokens + 17], [20, 9, 30]
    q = torch.randn(sum(query_lens), heads, dim, generator=gen)
    context_lens = [s + n for s, n in zip(starts, query_lens)]
    block_tables = [torch.tensor(t) for t in tables]
    groups = plan_prefill(tables, starts, query_lens, block, CPU, 64)
    assert [seqs for seqs, _ in groups] == [[0, 1, 2]]
    kernel = native_attention.RowsKernel(bf16=bf16)
    together = cascade_prefill.prefill_attention(q, k_cache, v_cache, block_tables, context_lens, query_lens, groups,
                                                 0.125, prefix_kv, kernel)
    alone = paged_attention.prefill_attention(q, k_cache, v_cache, block_tables, context_lens, query_lens, 0.125,
                                              kernel)
    assert torch.equal(together, alone)
    expected = paged_attention.prefill_attention(q, k_cache, v_cache, block_tables, context_lens, query_lens, 0.125)
    torch.testing.assert_close(together, expected, atol=1e-2 if bf16 else 1e-5, rtol=1e-2 if bf16 else 1e-5)
