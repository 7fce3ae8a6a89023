"""The Triton decode kernels against the PyTorch reference, with fresh random inputs per case.

Without a GPU they run under TRITON_INTERPRET=1 on CPU tensors (set here unless already set);
with one, compiled on CUDA tensors.
"""
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before the kernels are defined
pytest.importorskip("triton")

from kernels.reference import cascade_attention, paged_attention  # noqa: E402
from kernels.triton import attention as triton_attention  # noqa: E402

DEVICE = "cpu" if triton_attention.INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                reason="TRITON_INTERPRET=0 needs a GPU")

# max |out - reference| / max |reference|; the reference computes in float32 from the same inputs
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
LSE_TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}
DTYPES = list(TOLERANCE)
BLOCK = 16
# (heads, kv_heads, head_dim): GQA ratios 1 and 3, a single KV head; head_dim 24 pads to 32
SHAPES = [(4, 4, 24), (6, 2, 64), (6, 2, 24), (4, 1, 64)]
_case_seed = iter(range(10_000))


def fresh(*shape, dtype=torch.float32):
    gen = torch.Generator().manual_seed(next(_case_seed))
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


def make_pool(shape, dtype, num_blocks=40, block_size=BLOCK):
    _, kv_heads, dim = shape
    return (fresh(num_blocks, block_size, kv_heads, dim, dtype=dtype),
            fresh(num_blocks, block_size, kv_heads, dim, dtype=dtype))


def as_tensor(values):
    return torch.tensor(values, dtype=torch.long, device=DEVICE)


def padded(tables):
    width = max(len(t) for t in tables)
    return as_tensor([t + [0] * (width - len(t)) for t in tables])


def assert_close(out, expected, dtype, tolerance=TOLERANCE):
    error = (out.float() - expected.float()).abs().max() / expected.float().abs().max()
    assert error <= tolerance[dtype], f"relative error {error:.2e} above {tolerance[dtype]:.0e} for {dtype}"


def assert_lse_close(lse, expected, dtype):
    assert torch.equal(lse.isinf(), expected.isinf())
    finite = ~expected.isinf()
    assert (lse[finite] - expected[finite]).abs().max() <= LSE_TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_stores_each_token_at_its_slot(dtype):
    k_cache, v_cache = make_pool((4, 2, 24), dtype, num_blocks=6)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    k, v = fresh(5, 2, 24, dtype=dtype), fresh(5, 2, 24, dtype=dtype)
    slots = as_tensor([3, 17, 40, 95, 16])
    triton_attention.write_kv(k_cache, v_cache, k, v, slots)
    paged_attention.write_kv(expected_k, expected_v, k, v, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


def test_write_kv_casts_to_the_pool_dtype():
    k_cache, v_cache = make_pool((4, 2, 64), torch.bfloat16, num_blocks=4)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    k, v = fresh(3, 2, 64), fresh(3, 2, 64)
    slots = as_tensor([0, 33, 63])
    triton_attention.write_kv(k_cache, v_cache, k, v, slots)
    paged_attention.write_kv(expected_k, expected_v, k, v, slots)
    # one bfloat16 step at most: the interpreter truncates where the GPU rounds to nearest
    assert_close(k_cache, expected_k, torch.bfloat16, {torch.bfloat16: 2 ** -7})
    assert_close(v_cache, expected_v, torch.bfloat16, {torch.bfloat16: 2 ** -7})


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_paged_decode_matches_reference(shape, dtype, num_splits):
    heads, _, dim = shape
    k_cache, v_cache = make_pool(shape, dtype)
    tables = [[7, 3, 12, 30, 1, 2], [5], [8, 9, 10, 11, 20, 21], [33]]
    lengths = as_tensor([81, 0, 96, 16])     # mid-block, empty, exactly 6 blocks, one block
    q = fresh(4, heads, dim, dtype=dtype)
    out, lse = triton_attention.paged_decode_with_lse(q, k_cache, v_cache, padded(tables), lengths, 0.3,
                                                      num_splits=num_splits)
    expected, expected_lse = cascade_attention.paged_decode_with_lse(
        q.float(), k_cache.float(), v_cache.float(), padded(tables), lengths, 0.3)
    assert out.dtype == torch.float32 and out.shape == (4, heads, dim)
    assert_close(out, expected, dtype)
    assert_lse_close(lse, expected_lse, dtype)
    assert torch.all(out[1] == 0)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("batch,prefix_len,num_splits", [(1, 80, 1), (5, 144, 2)])
def test_prefix_attention_matches_reference(shape, dtype, batch, prefix_len, num_splits):
    heads, kv_heads, dim = shape
    q = fresh(batch, heads, dim, dtype=dtype)
    k, v = fresh(prefix_len, kv_heads, dim, dtype=dtype), fresh(prefix_len, kv_heads, dim, dtype=dtype)
    out, lse = triton_attention.prefix_attention(q, k, v, dim ** -0.5, num_splits=num_splits)
    expected, expected_lse = cascade_attention.prefix_attention(q.float(), k.float(), v.float(), dim ** -0.5)
    assert out.dtype == torch.float32 and out.shape == (batch, heads, dim)
    assert_close(out, expected, dtype)
    assert_lse_close(lse, expected_lse, dtype)


def test_prefix_attention_over_many_rows_uses_several_row_tiles():
    heads, kv_heads, dim = 6, 2, 24            # 30 rows x 3 query heads = 90 rows: two tiles of 64
    q = fresh(30, heads, dim)
    k, v = fresh(70, kv_heads, dim), fresh(70, kv_heads, dim)
    out, lse = triton_attention.prefix_attention(q, k, v, 0.2)
    expected, expected_lse = cascade_attention.prefix_attention(q, k, v, 0.2)
    assert_close(out, expected, torch.float32)
    assert_lse_close(lse, expected_lse, torch.float32)


def test_merge_matches_reference_and_ignores_empty_pieces():
    out_a, out_b = fresh(3, 4, 24), fresh(3, 4, 24)
    lse_a, lse_b = fresh(3, 4) * 3, fresh(3, 4) * 3
    lse_b[1] = float("-inf")                   # a row whose private part is empty
    out_b[1] = 0
    out, lse = triton_attention.merge_attention(out_a, lse_a, out_b, lse_b)
    expected, expected_lse = cascade_attention.merge_attention(out_a, lse_a, out_b, lse_b)
    assert_close(out, expected, torch.float32)
    assert_lse_close(lse, expected_lse, torch.float32)
    assert torch.equal(out[1], out_a[1]) and torch.equal(lse[1], lse_a[1])


def cascade(q, k_cache, v_cache, tables, lengths, groups, consecutive=False):
    """Decode by the cascade split, all on Triton. groups: list of (rows, shared_block_count)."""
    skip = [0] * len(tables)
    for rows, shared in groups:
        for r in rows:
            skip[r] = shared
    private = padded([t[s:] or [0] for t, s in zip(tables, skip)])
    private_lens = as_tensor([n - s * BLOCK for n, s in zip(lengths, skip)])
    out, lse = triton_attention.paged_decode_with_lse(q, k_cache, v_cache, private, private_lens, q.shape[-1] ** -0.5)
    for rows, shared in groups:
        k, v = prefix_kv(k_cache, tables[rows[0]][:shared]), prefix_kv(v_cache, tables[rows[0]][:shared])
        rows = as_tensor(rows)
        shared_out, shared_lse = triton_attention.prefix_attention(q[rows], k, v, q.shape[-1] ** -0.5)
        out[rows], _ = triton_attention.merge_attention(shared_out, shared_lse, out[rows], lse[rows])
    return out


def prefix_kv(cache, blocks):
    """As the engine passes it: a slice of the pool when the blocks are consecutive, else a gather."""
    if blocks == list(range(blocks[0], blocks[0] + len(blocks))):
        return cache[blocks[0]:blocks[0] + len(blocks)].reshape(-1, *cache.shape[2:])
    return cache.index_select(0, as_tensor(blocks)).reshape(-1, *cache.shape[2:])


def oracle(q, k_cache, v_cache, tables, lengths):
    return paged_attention.decode_attention(q.float(), k_cache.float(), v_cache.float(), padded(tables),
                                            as_tensor(lengths), q.shape[-1] ** -0.5)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cascade_agents_at_different_lengths_sharing_a_trunk(shape, dtype):
    heads, _, dim = shape
    k_cache, v_cache = make_pool(shape, dtype)
    trunk = [5, 9, 2, 30, 31]                  # 80 tokens, not consecutive
    tables = [trunk + [20], trunk + [21, 22], trunk + [23, 24, 25], trunk + [26]]
    lengths = [81, 100, 125, 96]
    q = fresh(4, heads, dim, dtype=dtype)
    out = cascade(q, k_cache, v_cache, tables, lengths, [([0, 1, 2, 3], 5)])
    assert_close(out, oracle(q, k_cache, v_cache, tables, lengths), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_cascade_trunk_shared_by_only_some_rows_and_a_lone_agent(dtype):
    shape = (6, 2, 24)
    k_cache, v_cache = make_pool(shape, dtype)
    trunk_a, trunk_b = [1, 2, 3], [10, 11, 12, 13]      # consecutive: passed as a slice of the pool
    tables = [trunk_a + [20], [30, 31, 32], trunk_a + [21, 22], trunk_b + [23], trunk_b + [24]]
    lengths = [50, 40, 75, 70, 65]
    q = fresh(5, 6, 24, dtype=dtype)
    out = cascade(q, k_cache, v_cache, tables, lengths, [([0, 2], 3), ([3, 4], 4)])
    assert_close(out, oracle(q, k_cache, v_cache, tables, lengths), dtype)


@pytest.mark.parametrize("shape", [(4, 1, 64), (4, 4, 24)])
def test_cascade_trunk_ending_mid_block_one_agent_and_an_empty_private_part(shape):
    heads, _, dim = shape
    k_cache, v_cache = make_pool(shape, torch.float32)
    # the trunk's partly filled last block was copied by each agent: only full blocks are shared;
    # the third row has nothing after the shared blocks (private length 0)
    tables = [[4, 5, 6, 36], [4, 5, 6, 37], [4, 5, 6]]
    lengths = [60, 55, 48]
    q = fresh(3, heads, dim)
    expected = oracle(q, k_cache, v_cache, tables, lengths)
    assert_close(cascade(q, k_cache, v_cache, tables, lengths, [([0, 1, 2], 3)]), expected, torch.float32)
    alone = cascade(q[:1], k_cache, v_cache, tables[:1], lengths[:1], [])
    assert_close(alone, expected[:1], torch.float32)
