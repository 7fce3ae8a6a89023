"""The decode attention in bfloat16 products (csrc/decode_bf16.h, through csrc/paged_decode.c and
csrc/prefix_attention.c with bf16=True): the oracle's attention (kernels.reference.decode_bf16) to float32's
rounding in every build, where the float32 products are a bfloat16 rounding away; a trunk read once for many rows
gives each the bits of its whole context read alone; and a build without AVX512-BF16 gives the same bits."""
import pytest
import torch

from kernels.cpu import native_attention
from kernels.reference import decode_bf16
from tests.helpers import portable_kernels as portable
from tests.helpers.trunk_batches import BLOCK, SHAPES, a_batch, alone, padded, shared_read

pytestmark = pytest.mark.skipif(not native_attention.available(), reason="no C compiler for the kernels")

# beside SHAPES' head widths (64, 128, 8): 24 and 48 dims fill part of a panel of 16 lanes, and 48 keys' dims are
# not a multiple of the 32 the transposed keys take at once
ODD_WIDTHS = [(3, 4, 2, 24, 20), (2, 6, 3, 48, 17)]
# SHAPES with shorter trunks, still past a chunk, for the oracle (a Python loop over each pair of products)
ORACLE_SHAPES = [(3, 9, 3, 64, 20), (2, 32, 8, 128, 17)] + SHAPES[2:] + ODD_WIDTHS


def oracle(q, k_cache, v_cache, tables, lengths):
    return decode_bf16.paged_decode_with_lse(q, k_cache, v_cache, padded(tables), torch.tensor(lengths), 0.3,
                                             native_attention.decode_chunk())


@pytest.mark.parametrize("shape", ORACLE_SHAPES)
def test_the_paged_kernel_in_bfloat16_is_the_oracles_attention(shape):
    q, k_cache, v_cache, _, tables, lengths = a_batch(*shape, seed=4)
    out, lse = native_attention.paged_decode_with_lse(q, k_cache, v_cache, padded(tables), torch.tensor(lengths), 0.3,
                                                      bf16=True)
    want_out, want_lse = oracle(q, k_cache, v_cache, tables, lengths)
    torch.testing.assert_close(out, want_out, atol=2e-6, rtol=2e-5)
    torch.testing.assert_close(lse, want_lse, atol=2e-6, rtol=2e-5)
    float32_out, _ = alone(q, k_cache, v_cache, tables, lengths)
    assert (float32_out - want_out).abs().max() > 1e-4   # the test tells the two precisions apart


@pytest.mark.parametrize("shape", SHAPES + ODD_WIDTHS)
def test_rows_sharing_a_trunk_in_bfloat16_get_the_bits_of_their_contexts_read_alone(shape):
    q, k_cache, v_cache, trunk, tables, lengths = a_batch(*shape)
    per_chunk = native_attention.decode_chunk() // BLOCK
    cut = len(trunk) // per_chunk * per_chunk
    if not cut:
        pytest.skip("a trunk shorter than a chunk is read by the paged kernel alone")
    out, lse = shared_read(q, k_cache, v_cache, trunk, tables, lengths, cut, bf16=True)
    want_out, want_lse = alone(q, k_cache, v_cache, tables, lengths, bf16=True)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    for row in range(len(q)):
        row_out, _ = alone(q[row:row + 1], k_cache, v_cache, tables[row:row + 1], lengths[row:row + 1], bf16=True)
        assert torch.equal(row_out, out[row:row + 1])


def test_rows_that_take_none_of_the_trunk_read_their_whole_tables_in_bfloat16():
    q, k_cache, v_cache, trunk, tables, lengths = a_batch(*SHAPES[0], seed=1)
    out, lse = shared_read(q, k_cache, v_cache, trunk, tables, lengths, 128, takers={0, 3, 4}, bf16=True)
    want_out, want_lse = alone(q, k_cache, v_cache, tables, lengths, bf16=True)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("build", ["portable", "avx2"])
def test_every_build_multiplies_as_vdpbf16ps_does(build):
    make = portable.portable_library if build == "portable" else portable.avx2_library
    prefix_lib, paged_lib = make("prefix_attention"), make("paged_decode")
    for shape in [SHAPES[0], SHAPES[2], ODD_WIDTHS[0]]:
        q, k_cache, v_cache, trunk, tables, lengths = a_batch(*shape, seed=5)
        cut = len(trunk) // 16 * 16
        out, lse = shared_read(q, k_cache, v_cache, trunk, tables, lengths, cut, None, prefix_lib, paged_lib,
                               bf16=True)
        want_out, want_lse = alone(q, k_cache, v_cache, tables, lengths, paged_lib, bf16=True)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), shape
        if shape is not SHAPES[0]:   # the oracle's loop: the shorter trunks
            torch.testing.assert_close(out, oracle(q, k_cache, v_cache, tables, lengths)[0], atol=2e-6, rtol=2e-5)
        if build == "avx2":   # the plain-C products and the AVX-512 build's exp take the same steps
            native_out, _ = alone(q, k_cache, v_cache, tables, lengths, bf16=True)
            assert torch.equal(out, native_out), shape
