"""The C shared-prefix attention and log-sum-exp merge (kernels/cpu/csrc/prefix_attention.c) against the
torch oracle (kernels.reference.cascade_attention), in the native build, the AVX2 one and the portable one."""
import pytest
import torch

from kernels.cpu import native_attention
from kernels.reference import cascade_attention
from tests.helpers import portable_kernels as portable

pytestmark = pytest.mark.skipif(not native_attention.available(), reason="no C compiler for the kernels")

# (rows, heads, kv_heads, dim, prefix tokens): SmolLM2's decode step; no grouping with a wide head
# and a prefix of several chunks ending mid-chunk; one row over one key; many rows, one past a chunk
SHAPES = [(8, 9, 3, 64, 2048), (5, 4, 4, 128, 700), (1, 6, 2, 8, 1), (13, 32, 8, 64, 257)]


def inputs(rows, heads, kv_heads, dim, keys, seed=0, spread=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, heads, dim, generator=gen) * spread
    return q, torch.randn(keys, kv_heads, dim, generator=gen), torch.randn(keys, kv_heads, dim, generator=gen)


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_the_oracle(shape):
    q, k, v = inputs(*shape)
    scale = shape[3] ** -0.5
    got = native_attention.prefix_attention(q, k, v, scale)
    expected = cascade_attention.prefix_attention(q, k, v, scale)
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], expected[1], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("keys", [2048, 700])
def test_the_bits_do_not_depend_on_the_threads_or_how_the_chunks_are_split_among_them(keys):
    """With chunks to spare a task takes every KV head of a chunk, else one head of one: the same sums."""
    q, k, v = inputs(8, 9, 3, 64, keys, seed=3)
    before = torch.get_num_threads()
    try:
        runs = []
        for threads in (1, 2, 3, 8):
            torch.set_num_threads(threads)
            runs.append(native_attention.prefix_attention(q, k, v, 0.125))
    finally:
        torch.set_num_threads(before)
    for out, lse in runs[1:]:
        assert torch.equal(out, runs[0][0]) and torch.equal(lse, runs[0][1])


def test_peaked_scores_underflow_to_zero_weights_not_nan():
    q, k, v = inputs(4, 6, 2, 64, 600, seed=1, spread=30.0)
    got = native_attention.prefix_attention(q, k, v, 0.125)
    expected = cascade_attention.prefix_attention(q, k, v, 0.125)
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got[1], expected[1], atol=1e-4, rtol=1e-5)


def test_a_rows_result_does_not_depend_on_its_batch():
    q, k, v = inputs(11, 9, 3, 64, 1000, seed=2)
    out, lse = native_attention.prefix_attention(q, k, v, 0.125)
    for row in (0, 5, 10):
        alone, alone_lse = native_attention.prefix_attention(q[row:row + 1], k, v, 0.125)
        assert torch.equal(alone[0], out[row]) and torch.equal(alone_lse[0], lse[row])
    pair, pair_lse = native_attention.prefix_attention(q[3:5], k, v, 0.125)
    assert torch.equal(pair, out[3:5]) and torch.equal(pair_lse, lse[3:5])


def test_strided_keys_are_read_as_the_view_says():
    q, k, v = inputs(3, 4, 2, 16, 300, seed=3)
    k, v = k[::2], v[1::2]
    got = native_attention.prefix_attention(q, k, v, 0.25)
    expected = cascade_attention.prefix_attention(q, k, v, 0.25)
    torch.testing.assert_close(got[0], expected[0], atol=1e-5, rtol=1e-5)


def test_merge_matches_the_oracle_including_empty_pieces():
    gen = torch.Generator().manual_seed(5)
    out_a, out_b = torch.randn(6, 9, 64, generator=gen), torch.randn(6, 9, 64, generator=gen)
    lse_a, lse_b = torch.randn(6, 9, generator=gen) * 5, torch.randn(6, 9, generator=gen) * 5
    lse_b[2] = float("-inf")          # a row whose private part is empty
    out_b[2] = 0
    got = native_attention.merge_attention(out_a, lse_a, out_b, lse_b)
    expected = cascade_attention.merge_attention(out_a, lse_a, out_b, lse_b)
    torch.testing.assert_close(got[0], expected[0], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(got[1], expected[1], atol=1e-6, rtol=1e-5)
    assert torch.equal(got[0][2], out_a[2]) and torch.equal(got[1][2], lse_a[2])


@pytest.fixture(scope="module")
def portable_library(tmp_path_factory):
    """The same source built without AVX2 or FMA: its plain-C path."""
    return portable.portable_library("prefix_attention", tmp_path_factory.mktemp("portable"))


@pytest.mark.parametrize("shape", SHAPES[1:])
def test_the_portable_build_matches_the_oracle(portable_library, shape):
    q, k, v = inputs(*shape, seed=4)
    out, lse = native_attention.prefix_attention(q, k, v, 0.3, portable_library)
    expected = cascade_attention.prefix_attention(q, k, v, 0.3)
    torch.testing.assert_close(out, expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, expected[1], atol=1e-5, rtol=1e-5)


def test_the_avx2_build_gives_the_native_builds_bits(tmp_path):
    """Where the native build is AVX-512, its 16 lanes take the AVX2 code's steps lane for lane."""
    library = portable.avx2_library("prefix_attention", tmp_path)
    for shape in SHAPES + [(3, 9, 3, 64, 300), (16, 8, 2, 64, 1000)]:
        q, k, v = inputs(*shape, seed=5)
        native_out, native_lse = native_attention.prefix_attention(q, k, v, 0.3)
        out, lse = native_attention.prefix_attention(q, k, v, 0.3, library)
        assert torch.equal(out, native_out) and torch.equal(lse, native_lse), shape
