"""A shared trunk's chunks read once for many decode rows (native_attention.trunk_chunks, csrc/prefix_attention.c)
and merged with each row's own chunks by the paged kernel (csrc/paged_decode.c's `given`): each row gets the bits
of its whole context read by the paged kernel alone, in every build, and the oracle's attention where the trunk
ends inside a chunk."""
import pytest
import torch

from kernels.cpu import native_attention
from kernels.errors import KernelError
from kernels.reference import cascade_attention
from tests.helpers import portable_kernels as portable
from tests.helpers.trunk_batches import BLOCK, SHAPES, a_batch, alone, padded, shared_read

pytestmark = pytest.mark.skipif(not native_attention.available(), reason="no C compiler for the kernels")


@pytest.mark.parametrize("shape", SHAPES)
def test_rows_sharing_whole_chunks_of_a_trunk_get_the_bits_of_their_contexts_read_alone(shape):
    q, k_cache, v_cache, trunk, tables, lengths = a_batch(*shape)
    cut = len(trunk) // (native_attention.decode_chunk() // BLOCK) * (native_attention.decode_chunk() // BLOCK)
    out, lse = shared_read(q, k_cache, v_cache, trunk, tables, lengths, cut)
    want_out, want_lse = alone(q, k_cache, v_cache, tables, lengths)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)
    for row in range(len(q)):
        row_out, _ = alone(q[row:row + 1], k_cache, v_cache, tables[row:row + 1], lengths[row:row + 1])
        assert torch.equal(row_out, out[row:row + 1])


def test_rows_that_take_none_of_the_trunk_read_their_whole_tables():
    q, k_cache, v_cache, trunk, tables, lengths = a_batch(*SHAPES[0], seed=1)
    out, lse = shared_read(q, k_cache, v_cache, trunk, tables, lengths, 128, takers={0, 3, 4})
    want_out, want_lse = alone(q, k_cache, v_cache, tables, lengths)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("cut", [1, 17, 40])
def test_a_trunk_that_ends_inside_a_chunk_still_gives_the_oracles_attention(cut):
    q, k_cache, v_cache, trunk, tables, lengths = a_batch(5, 16, 2, 64, 48, seed=2)
    out, lse = shared_read(q, k_cache, v_cache, trunk, tables, lengths, cut)
    want_out, want_lse = cascade_attention.paged_decode_with_lse(q, k_cache, v_cache, padded(tables),
                                                                 torch.tensor(lengths), 0.3)
    torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse, want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("build", ["portable", "avx2"])
def test_every_build_keeps_the_bits_of_a_context_read_alone(build):
    make = portable.portable_library if build == "portable" else portable.avx2_library
    prefix_lib, paged_lib = make("prefix_attention"), make("paged_decode")
    for shape in SHAPES[:3]:
        q, k_cache, v_cache, trunk, tables, lengths = a_batch(*shape, seed=3)
        cut = len(trunk) // 16 * 16
        out, lse = shared_read(q, k_cache, v_cache, trunk, tables, lengths, cut, None, prefix_lib, paged_lib)
        want_out, want_lse = alone(q, k_cache, v_cache, tables, lengths, paged_lib)
        assert torch.equal(out, want_out) and torch.equal(lse, want_lse), shape
        if build == "avx2":   # the AVX-512 build's 16 lanes take the AVX2 steps lane for lane
            native_out, _ = alone(q, k_cache, v_cache, tables, lengths)
            assert torch.equal(out, native_out), shape


def test_given_chunks_the_kernel_would_read_past_are_refused():
    q, k_cache, v_cache, trunk, tables, lengths = a_batch(*SHAPES[3])
    partials = native_attention.trunk_chunks(q, k_cache[trunk].reshape(-1, 4, 8), v_cache[trunk].reshape(-1, 4, 8),
                                             0.3)
    tables_t, lens = padded(tables), torch.tensor(lengths)
    with pytest.raises(KernelError, match=r"given_chunks must each lie in \[0, 3\]"):
        too_many = native_attention.TrunkChunks(partials, torch.tensor([3, 4]))
        native_attention.paged_decode_with_lse(q, k_cache, v_cache, tables_t, lens, 0.3, given=too_many)
    with pytest.raises(KernelError, match=r"given must have shape \[2, 3, 4, 10\]"):
        wrong = native_attention.TrunkChunks(partials[:, :, :, :8].contiguous(), torch.tensor([3, 3]))
        native_attention.paged_decode_with_lse(q, k_cache, v_cache, tables_t, lens, 0.3, given=wrong)
