"""Shared-prefix (cascade) decode attention against the plain paged reference, in both
implementations of its pieces: plain torch (cascade_attention), the fused CPU kernel
(sdpa_attention) and the C paged kernel (native_attention)."""
import pytest
import torch

from kernels.cpu import native_attention, sdpa_attention
from kernels.reference import cascade_attention, paged_attention
from tests.helpers import portable_kernels as portable

NO_COMPILER = pytest.mark.skipif(not native_attention.available(), reason="no C compiler for the native kernel")
IMPLEMENTATIONS = [pytest.param(cascade_attention, id="torch"), pytest.param(sdpa_attention, id="sdpa"),
                   pytest.param(native_attention, id="native", marks=NO_COMPILER)]

BLOCK, KV_HEADS, HEADS, DIM = 4, 2, 6, 8
SCALE = DIM ** -0.5


def make_pool(num_blocks=80, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(num_blocks, BLOCK, KV_HEADS, DIM, generator=gen).to(dtype)
    v = torch.randn(num_blocks, BLOCK, KV_HEADS, DIM, generator=gen).to(dtype)
    return k, v, gen


def padded(tables):
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables])


def cascade(q, k_cache, v_cache, tables, lens, groups, impl=cascade_attention):
    """groups: list of (rows, shared_block_count)."""
    skip = [0] * len(tables)
    for rows, shared in groups:
        for r in rows:
            skip[r] = shared
    private = padded([t[s:] for t, s in zip(tables, skip)])
    private_lens = torch.tensor([n - s * BLOCK for n, s in zip(lens, skip)])
    out, lse = impl.paged_decode_with_lse(q, k_cache, v_cache, private, private_lens, SCALE)
    for rows, shared in groups:
        blocks = torch.tensor(tables[rows[0]][:shared])
        k = k_cache[blocks].reshape(-1, KV_HEADS, DIM)
        v = v_cache[blocks].reshape(-1, KV_HEADS, DIM)
        o, o_lse = impl.prefix_attention(q[rows], k, v, SCALE)
        out[rows], _ = cascade_attention.merge_attention(o, o_lse, out[rows], lse[rows])
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_agents_at_different_lengths_sharing_a_trunk(seed, impl):
    k_cache, v_cache, gen = make_pool(seed=seed)
    trunk = [5, 9, 2, 40, 41]                         # 5 full blocks shared
    tables = [trunk + [60], trunk + [61, 62], trunk + [63, 64, 65], trunk + [66]]
    lens = [21, 27, 38, 24]
    q = torch.randn(4, HEADS, DIM, generator=gen)
    expected = paged_attention.decode_attention(q, k_cache, v_cache, padded(tables), torch.tensor(lens), SCALE)
    out = cascade(q, k_cache, v_cache, tables, lens, [([0, 1, 2, 3], 5)], impl)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_trunk_shared_by_only_some_rows_and_a_lone_agent(impl):
    k_cache, v_cache, gen = make_pool(seed=7)
    trunk_a, trunk_b = [1, 2, 3], [10, 11]
    tables = [trunk_a + [20], [30, 31, 32], trunk_a + [21, 22], trunk_b + [23], trunk_b + [24]]
    lens = [14, 10, 19, 9, 12]
    q = torch.randn(5, HEADS, DIM, generator=gen)
    expected = paged_attention.decode_attention(q, k_cache, v_cache, padded(tables), torch.tensor(lens), SCALE)
    out = cascade(q, k_cache, v_cache, tables, lens, [([0, 2], 3), ([3, 4], 2)], impl)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_one_agent_and_a_trunk_that_ends_mid_block(impl):
    k_cache, v_cache, gen = make_pool(seed=3)
    # the trunk's last, partly filled block was copied by each agent: only full blocks are shared
    tables = [[4, 5, 6, 50], [4, 5, 6, 51]]
    lens = [15, 14]
    q = torch.randn(2, HEADS, DIM, generator=gen)
    expected = paged_attention.decode_attention(q, k_cache, v_cache, padded(tables), torch.tensor(lens), SCALE)
    torch.testing.assert_close(cascade(q, k_cache, v_cache, tables, lens, [([0, 1], 3)], impl), expected,
                               atol=1e-5, rtol=1e-5)
    alone = cascade(q[:1], k_cache, v_cache, tables[:1], lens[:1], [], impl)
    torch.testing.assert_close(alone, expected[:1], atol=1e-5, rtol=1e-5)


def test_merge_of_a_split_softmax_is_exact_in_float32():
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(3, HEADS, DIM, generator=gen)
    k = torch.randn(30, KV_HEADS, DIM, generator=gen)
    v = torch.randn(30, KV_HEADS, DIM, generator=gen)
    whole, whole_lse = cascade_attention.prefix_attention(q, k, v, SCALE)
    a, la = cascade_attention.prefix_attention(q, k[:11], v[:11], SCALE)
    b, lb = cascade_attention.prefix_attention(q, k[11:], v[11:], SCALE)
    merged, merged_lse = cascade_attention.merge_attention(a, la, b, lb)
    torch.testing.assert_close(merged, whole, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(merged_lse, whole_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_half_precision_cache_stays_within_tolerance(dtype, tol, impl):
    k_cache, v_cache, gen = make_pool(dtype=dtype, seed=11)
    tables = [[1, 2, 3, 7], [1, 2, 3, 8]]
    lens = [16, 13]
    q = torch.randn(2, HEADS, DIM, generator=gen).to(dtype)
    expected = paged_attention.decode_attention(q.float(), k_cache.float(), v_cache.float(), padded(tables),
                                                torch.tensor(lens), SCALE)
    out = cascade(q, k_cache, v_cache, tables, lens, [([0, 1], 3)], impl)
    torch.testing.assert_close(out.float(), expected, atol=tol, rtol=tol)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS[1:])
def test_fast_pieces_give_the_oracles_out_and_lse_including_an_empty_row(impl):
    k_cache, v_cache, gen = make_pool(seed=5)
    tables = padded([[3, 4, 9], [7], [8, 2]])
    for lens in (torch.tensor([11, 3, 6]), torch.tensor([11, 0, 6]), torch.tensor([0, 0, 0])):
        q = torch.randn(3, HEADS, DIM, generator=gen)
        expected = cascade_attention.paged_decode_with_lse(q, k_cache, v_cache, tables, lens, SCALE)
        got = impl.paged_decode_with_lse(q, k_cache, v_cache, tables, lens, SCALE)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    k, v = k_cache[:5].reshape(-1, KV_HEADS, DIM), v_cache[:5].reshape(-1, KV_HEADS, DIM)
    for a, b in zip(impl.prefix_attention(q, k, v, SCALE), cascade_attention.prefix_attention(q, k, v, SCALE)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


@NO_COMPILER
def test_native_rows_do_not_depend_on_their_batch():
    k_cache, v_cache, gen = make_pool(seed=3)
    tables = padded([[3, 4, 9, 10], [7, 1], [8, 2, 5]])
    lens = torch.tensor([15, 6, 10])
    q = torch.randn(3, HEADS, DIM, generator=gen)
    out, lse = native_attention.paged_decode_with_lse(q, k_cache, v_cache, tables, lens, SCALE)
    for row in range(3):
        alone = native_attention.paged_decode_with_lse(q[row:row + 1], k_cache, v_cache, tables[row:row + 1, :4],
                                                        lens[row:row + 1], SCALE)
        assert torch.equal(alone[0][0], out[row]) and torch.equal(alone[1][0], lse[row])


def long_contexts(seed=6):
    """Contexts past the C kernel's 256-token chunks: one of exactly two chunks, one ending a token
    into its third, a short one and an empty one, their blocks scattered through the pool."""
    k_cache, v_cache, gen = make_pool(num_blocks=400, seed=seed)
    lens = torch.tensor([512, 513, 37, 0])
    order = torch.randperm(400, generator=gen).tolist()
    tables = padded([order[:129], order[129:258], order[258:268], [order[268]]])
    return torch.randn(4, HEADS, DIM, generator=gen), k_cache, v_cache, tables, lens


@NO_COMPILER
def test_native_long_contexts_go_in_chunks_that_match_the_oracle_and_do_not_depend_on_their_batch():
    q, k_cache, v_cache, tables, lens = long_contexts()
    out, lse = native_attention.paged_decode_with_lse(q, k_cache, v_cache, tables, lens, SCALE)
    expected = cascade_attention.paged_decode_with_lse(q, k_cache, v_cache, tables, lens, SCALE)
    torch.testing.assert_close(out, expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, expected[1], atol=1e-5, rtol=1e-5)
    for row in range(4):
        alone = native_attention.paged_decode_with_lse(q[row:row + 1], k_cache, v_cache, tables[row:row + 1],
                                                        lens[row:row + 1], SCALE)
        assert torch.equal(alone[0][0], out[row]) and torch.equal(alone[1][0], lse[row])


@NO_COMPILER
def test_the_portable_paged_build_matches_the_oracle_and_the_avx2_one_gives_the_native_bits(tmp_path):
    q, k_cache, v_cache, tables, lens = long_contexts(seed=7)
    native_out = native_attention.paged_decode_with_lse(q, k_cache, v_cache, tables, lens, SCALE)
    plain = portable.portable_library("paged_decode", tmp_path)
    expected = cascade_attention.paged_decode_with_lse(q, k_cache, v_cache, tables, lens, SCALE)
    for got, want in zip(native_attention.paged_decode_with_lse(q, k_cache, v_cache, tables, lens, SCALE, plain),
                         expected):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    avx2 = portable.avx2_library("paged_decode", tmp_path)
    for got, want in zip(native_attention.paged_decode_with_lse(q, k_cache, v_cache, tables, lens, SCALE, avx2),
                         native_out):
        assert torch.equal(got, want)
