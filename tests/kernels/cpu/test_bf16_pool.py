"""A KV pool kept in bfloat16, read by the C kernels' bfloat16 products: the keys and values are written rounded as
those products round float32 ones (torch's round to nearest even, below 2^-126 flushed as vdpbf16ps does), and
every kernel gives a pool in bfloat16 the bits it gives a float32 pool holding the same values, in every build."""
import pytest
import torch

from kernels.cpu import native_attention, ops
from kernels.errors import KernelError
from tests.helpers import portable_kernels as portable
from tests.helpers.trunk_batches import SHAPES, a_batch, alone, shared_read

pytestmark = pytest.mark.skipif(not native_attention.available(), reason="no C compiler for the kernels")

BUILDS = ["native", "portable"]


def library(build: str, source: str):
    return None if build == "native" else portable.portable_library(source)


def rounded(*tensors):
    """Each float32 tensor as a bfloat16 pool holds it, and as a float32 pool holding the same values."""
    halves = [t.to(torch.bfloat16) for t in tensors]
    return halves, [t.float() for t in halves]


def test_writes_round_as_torch_rounds_to_bfloat16_and_flush_what_vdpbf16ps_flushes():
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(5, 3, 64, generator=gen) * torch.logspace(-30, 30, 64)
    k[0, 0, :4] = torch.tensor([1e-39, -1e-39, 0.0, -0.0])   # below 2^-126
    v = torch.randn(5, 3, 64, generator=gen)
    k_cache = torch.full((4, 4, 3, 64), 7.0, dtype=torch.bfloat16)
    v_cache = k_cache.clone()
    slots = torch.tensor([3, 0, 9, 15, 6])
    native_attention.write_kv(k_cache, v_cache, k, v, slots)
    flat_k, flat_v = k_cache.view(-1, 3, 64), v_cache.view(-1, 3, 64)
    want_k = k.to(torch.bfloat16)
    want_k[0, 0, :4] = torch.tensor([0.0, -0.0, 0.0, -0.0])
    assert torch.equal(flat_k[slots].view(torch.int16), want_k.view(torch.int16))   # signs of zeros too
    assert torch.equal(flat_v[slots], v.to(torch.bfloat16))
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[slots] = False
    assert bool((flat_k[untouched] == 7.0).all()) and bool((flat_v[untouched] == 7.0).all())


def test_a_float32_pool_takes_its_keys_and_values_as_they_are():
    k, v = torch.randn(2, 1, 8), torch.randn(2, 1, 8)
    k_cache, v_cache = torch.zeros(2, 2, 1, 8), torch.zeros(2, 2, 1, 8)
    native_attention.write_kv(k_cache, v_cache, k, v, torch.tensor([1, 2]))
    assert torch.equal(k_cache.view(-1, 1, 8)[1:3], k) and torch.equal(v_cache.view(-1, 1, 8)[1:3], v)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("shape", SHAPES[:3])
def test_decode_over_a_bfloat16_pool_has_the_bits_of_a_float32_one(shape, build):
    q, k_cache, v_cache, trunk, tables, lengths = a_batch(*shape, seed=2)
    (k16, v16), (k32, v32) = rounded(k_cache, v_cache)
    prefix_lib, paged_lib = library(build, "prefix_attention"), library(build, "paged_decode")
    cut = len(trunk) // 16 * 16
    for caches in ((k16, v16), (k32, v32)):
        shared = shared_read(q, *caches, trunk, tables, lengths, cut, None, prefix_lib, paged_lib, bf16=True)
        assert torch.equal(shared[0], alone(q, *caches, tables, lengths, paged_lib, bf16=True)[0])
    for got, want in zip(shared_read(q, k16, v16, trunk, tables, lengths, cut, None, prefix_lib, paged_lib, bf16=True),
                         shared_read(q, k32, v32, trunk, tables, lengths, cut, None, prefix_lib, paged_lib, bf16=True)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("causal", [True, False])
def test_prompt_rows_over_bfloat16_keys_have_the_bits_of_float32_ones(build, causal):
    gen = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(300, 9, 64, generator=gen), torch.randn(700, 3, 64, generator=gen), torch.randn(700, 3, 64)
    (k16, v16), (k32, v32) = rounded(k, v)
    lib = library(build, "rows_attention")
    got = native_attention.rows_attention(q, k16, v16, 0.3, causal, lib, bf16=True)
    want = native_attention.rows_attention(q, k32, v32, 0.3, causal, lib, bf16=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_a_prompt_continued_over_a_bfloat16_trunk_has_the_bits_of_a_float32_one():
    kernel = native_attention.RowsKernel(bf16=True)
    gen = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(40, 9, 64, generator=gen), torch.randn(552, 3, 64, generator=gen), torch.randn(552, 3, 64)
    split = native_attention.chunk_keys() * 2
    results = []
    for k_pool, v_pool in rounded(k, v):
        assert kernel.splits(q, k_pool, v_pool) == native_attention.bf16_products_native()
        running = kernel.running(q, k_pool[:split], v_pool[:split], 0.3)
        results.append(kernel.continued(q, k_pool[split:], v_pool[split:], 0.3, running))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


def test_a_bfloat16_pool_is_refused_to_float32_products():
    q, k_cache, v_cache, _, tables, lengths = a_batch(*SHAPES[0])
    k16, v16 = k_cache.to(torch.bfloat16), v_cache.to(torch.bfloat16)
    with pytest.raises(KernelError, match="bfloat16 products only"):
        ops.paged_decode(q, k16, v16, torch.tensor([t[:1] for t in tables]), torch.tensor([16] * len(q)), 0.3,
                         None, None, False)
    with pytest.raises(KernelError, match="bfloat16 products only"):
        ops.rows_attention(q, k16[0], v16[0], 0.3, False, False)
