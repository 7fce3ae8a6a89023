"""The C prefill attention in integer products (kernels/cpu/csrc/rows_attention_i8.h) against its oracle
(kernels/reference/rows_attention_int8.py, whose quantizer is checked against gguf's Q8_0), and against attention
written out in float64; a row's bits whatever comes with it, and the builds that multiply in plain C."""
import gguf
import numpy as np
import pytest
import torch

from kernels.cpu import native_attention
from kernels.reference import rows_attention_int8 as oracle
from tests.helpers import portable_kernels as portable
from tests.helpers.written_attention import inputs, written_out

pytestmark = pytest.mark.skipif(not native_attention.available(), reason="no C compiler for the kernels")

# (tokens, keys, heads, kv_heads, dim, causal): SmolLM2's heads, causal over several chunks and blocks; 32-dim heads
# (their scores in sub-blocks of 32) with blocks straddling a chunk's start; suffixes over a trunk; 128-dim heads
# (four sub-blocks of v); one token over one key
SHAPES = [(600, 600, 9, 3, 64, True), (100, 300, 6, 2, 32, True), (130, 2048, 9, 3, 64, False),
          (37, 300, 4, 4, 128, True), (1, 1, 6, 2, 32, True)]


def int8_attention(q, k, v, scale, causal, library=None):
    return native_attention.rows_attention(q, k, v, scale, causal, library, int8=True)


def test_the_oracles_quantizer_is_ggufs_q8_0():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 96, generator=gen) * torch.logspace(-6, 4, 64)[:, None]
    x[3] = 0.0                                                   # a sub-block of zeros: scale 0, codes 0
    codes, scales = oracle.q8_codes(x, 32)
    blocks = gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType.Q8_0).reshape(-1, 34)
    want_scales = blocks[:, :2].copy().view(np.float16).astype(np.float64).reshape(scales.shape)
    want_codes = blocks[:, 2:].copy().view(np.int8).astype(np.float64).reshape(codes.shape)
    assert torch.equal(scales, torch.from_numpy(want_scales)) and torch.equal(codes, torch.from_numpy(want_codes))


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_the_oracle(shape):
    """Float32 rounding apart, a weight's code may land a step apart where the kernel's exp rounds otherwise:
    rare, so the mean difference stays at float32's."""
    *sizes, causal = shape
    q, k, v = inputs(*sizes, seed=1)
    scale = sizes[4] ** -0.5
    out, lse = int8_attention(q, k, v, scale, causal)
    want_out, want_lse = oracle.rows_attention(q, k, v, scale, causal)
    difference = (out.double() - want_out).abs()
    assert difference.max() < 2e-3 and difference.mean() < 1e-6
    torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", SHAPES[:4])
def test_is_the_attention_within_int8s_rounding(shape):
    *sizes, causal = shape
    q, k, v = inputs(*sizes, seed=2)
    scale = sizes[4] ** -0.5
    out, lse = int8_attention(q, k, v, scale, causal)
    exact_out, exact_lse = written_out(q, k, v, scale, causal)
    assert ((out.double() - exact_out).norm() / exact_out.norm()) < 0.03
    torch.testing.assert_close(lse.double(), exact_lse, atol=0.05, rtol=0.0)


def test_a_token_gets_the_same_bits_alone_on_the_keys_it_sees():
    """Its codes of P' step by the largest scale of the keys it sees: a key past it changes nothing."""
    q, k, v = inputs(300, 300, 6, 2, 64, seed=3)
    out, lse = int8_attention(q, k, v, 0.125, True)
    for i in (0, 31, 32, 95, 96, 255, 256, 299):   # sub-block, block and chunk edges
        alone = int8_attention(q[i:i + 1], k[:i + 1], v[:i + 1], 0.125, True)
        assert torch.equal(alone[0][0], out[i]) and torch.equal(alone[1][0], lse[i])


@pytest.mark.parametrize("tokens, split", [(40, 256), (300, 512), (1, 768)])
def test_a_span_split_at_a_chunk_gives_the_bits_of_one_call(tokens, split):
    """As a prompt after a shared trunk gets its own prompt's bits."""
    keys = split + tokens + 37
    q, k, v = inputs(tokens, keys, 9, 3, 64, seed=tokens)
    kernel = native_attention.RowsKernel(int8=True)
    whole = kernel(q, k, v, 0.125, True)
    running = kernel.running(q, k[:split], v[:split], 0.125)
    out, lse = kernel.continued(q, k[split:], v[split:], 0.125, running)
    assert torch.equal(out, whole[0]) and torch.equal(lse, whole[1])


def test_a_pool_in_bfloat16_gives_the_bits_of_float32_keys_and_values():
    q, k, v = inputs(200, 500, 9, 3, 64, seed=4)
    want = int8_attention(q, k, v, 0.125, True)
    got = int8_attention(q, k.to(torch.bfloat16), v.to(torch.bfloat16), 0.125, True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_heads_of_no_multiple_of_32_take_the_bfloat16_products():
    q, k, v = inputs(70, 90, 8, 4, 16, seed=5)
    got = int8_attention(q, k, v, 0.25, True)
    want = native_attention.rows_attention(q, k, v, 0.25, True, bf16=True)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.skipif(not native_attention.rows_attention_int8_native(), reason="this build has no AVX512-VNNI")
def test_a_build_without_avx512_vnni_gives_the_integer_products_bits():
    """The products in plain C, the softmax in the same AVX-512 steps."""
    library = portable.without_vnni_library("rows_attention")
    assert not native_attention.rows_attention_int8_native(library)
    for shape in SHAPES:
        *sizes, causal = shape
        q, k, v = inputs(*sizes, seed=6)
        want = int8_attention(q, k, v, 0.3, causal)
        got = int8_attention(q, k, v, 0.3, causal, library)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), shape


def test_the_portable_build_matches_the_oracle():
    """Its exp is libm's: the oracle's tolerance."""
    library = portable.portable_library("rows_attention")
    for shape in SHAPES[1:3]:
        *sizes, causal = shape
        q, k, v = inputs(*sizes, seed=7)
        out, lse = int8_attention(q, k, v, 0.3, causal, library)
        want_out, want_lse = oracle.rows_attention(q, k, v, 0.3, causal)
        difference = (out.double() - want_out).abs()
        assert difference.max() < 2e-3 and difference.mean() < 1e-6
        torch.testing.assert_close(lse.double(), want_lse, atol=1e-5, rtol=1e-5)
