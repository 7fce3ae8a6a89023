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

pytestmark = pytest.mark.skipif(not native_attention.available(), reason="no C compiler for the kernels")

BLOCK = 16
# (rows, heads, kv_heads, dim, trunk blocks): SmolLM2's decode step over a 2,048-token trunk; Qwen3-8B's heads over
# two chunks; a wide group; one query head a KV head, narrow
SHAPES = [(8, 9, 3, 64, 128), (3, 32, 8, 128, 32), (5, 16, 2, 64, 16), (2, 4, 4, 8, 48)]


def a_batch(rows, heads, kv_heads, dim, trunk_blocks, seed=0):
    """Rows whose tables start with the same trunk blocks (scattered in the pool), then tails of their own."""
    gen = torch.Generator().manual_seed(seed)
    pool_blocks = trunk_blocks + 4 * rows + 1
    k_cache = torch.randn(pool_blocks, BLOCK, kv_heads, dim, generator=gen)
    v_cache = torch.randn(pool_blocks, BLOCK, kv_heads, dim, generator=gen)
    order = torch.randperm(pool_blocks, generator=gen).tolist()
    trunk, tails = order[:trunk_blocks], order[trunk_blocks:]
    tables = [trunk + tails[4 * r:4 * r + 1 + r % 4] for r in range(rows)]
    lengths = [(len(t) - 1) * BLOCK + 1 + 5 * r % BLOCK for r, t in enumerate(tables)]
    q = torch.randn(rows, heads, dim, generator=gen)
    return q, k_cache, v_cache, trunk, tables, lengths


def padded(tables: list[list[int]]) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables])


def shared_read(q, k_cache, v_cache, trunk, tables, lengths, cut_blocks, takers=None, prefix_lib=None,
                paged_lib=None, bf16=False):
    """The trunk's first cut_blocks read once for the rows in takers (every row: None), each row's rest paged;
    bf16: in bfloat16 products."""
    takers = range(len(q)) if takers is None else takers
    shape = k_cache.shape[2:]
    k = k_cache[trunk[:cut_blocks]].reshape(-1, *shape)
    v = v_cache[trunk[:cut_blocks]].reshape(-1, *shape)
    partials = native_attention.trunk_chunks(q, k, v, 0.3, prefix_lib, bf16)
    counts = torch.tensor([partials.shape[1] if r in takers else 0 for r in range(len(q))])
    private = padded([t[cut_blocks:] if r in takers else t for r, t in enumerate(tables)])
    lens = torch.tensor([n - cut_blocks * BLOCK if r in takers else n for r, n in enumerate(lengths)])
    given = native_attention.TrunkChunks(partials, counts)
    return native_attention.paged_decode_with_lse(q, k_cache, v_cache, private, lens, 0.3, paged_lib, given, bf16)


def alone(q, k_cache, v_cache, tables, lengths, paged_lib=None, bf16=False):
    return native_attention.paged_decode_with_lse(q, k_cache, v_cache, padded(tables), torch.tensor(lengths), 0.3,
                                                  paged_lib, bf16=bf16)


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
