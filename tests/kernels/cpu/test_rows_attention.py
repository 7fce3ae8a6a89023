"""The C prefill attention (kernels/cpu/csrc/rows_attention.c) against attention written out in torch
(scores, mask, softmax, weighted values), in the native build, the AVX2 one and the portable one."""
import pytest
import torch

from kernels.cpu import native_attention
from tests.helpers import portable_kernels as portable
from tests.helpers.written_attention import inputs, written_out

pytestmark = pytest.mark.skipif(not native_attention.available(), reason="no C compiler for the kernels")

# (tokens, keys, heads, kv_heads, dim, causal): a whole prompt of several chunks and blocks; a tail
# whose blocks straddle a chunk's start (rows that see none of it); SmolLM2's suffixes over the
# trunk; no grouping with a wide head; eight groups; one token over one key
SHAPES = [(600, 600, 9, 3, 64, True), (100, 300, 6, 2, 32, True), (130, 2048, 9, 3, 64, False),
          (37, 300, 4, 4, 128, True), (70, 90, 32, 4, 16, True), (1, 1, 6, 2, 8, True)]


@pytest.mark.parametrize("shape", SHAPES)
def test_matches_attention_written_out(shape):
    *sizes, causal = shape
    q, k, v = inputs(*sizes)
    scale = sizes[4] ** -0.5
    out, lse = native_attention.rows_attention(q, k, v, scale, causal)
    expected = written_out(q, k, v, scale, causal)
    torch.testing.assert_close(out.double(), expected[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse.double(), expected[1], atol=1e-5, rtol=1e-5)


def test_peaked_scores_underflow_to_zero_weights_not_nan():
    q, k, v = inputs(300, 300, 6, 2, 64, seed=2, spread=30.0)   # scores in the thousands: float32 keeps ~1e-4
    out, lse = native_attention.rows_attention(q, k, v, 0.125, True)
    expected = written_out(q, k, v, 0.125, True)
    assert out.isfinite().all() and lse.isfinite().all()
    torch.testing.assert_close(out.double(), expected[0], atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(lse.double(), expected[1], atol=1e-3, rtol=1e-5)


def test_a_token_gets_the_same_bits_alone_on_the_keys_it_sees():
    q, k, v = inputs(300, 300, 6, 2, 64, seed=3)
    out, lse = native_attention.rows_attention(q, k, v, 0.125, True)
    for i in (0, 95, 96, 255, 256, 299):   # block and chunk edges
        alone = native_attention.rows_attention(q[i:i + 1], k[:i + 1], v[:i + 1], 0.125, True)
        assert torch.equal(alone[0][0], out[i]) and torch.equal(alone[1][0], lse[i])


def test_the_portable_build_matches_attention_written_out(tmp_path):
    library = portable.portable_library("rows_attention", tmp_path)
    for shape in SHAPES[:3]:
        *sizes, causal = shape
        q, k, v = inputs(*sizes, seed=4)
        out, lse = native_attention.rows_attention(q, k, v, 0.3, causal, library)
        expected = written_out(q, k, v, 0.3, causal)
        torch.testing.assert_close(out.double(), expected[0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse.double(), expected[1], atol=1e-5, rtol=1e-5)


def test_the_avx2_build_gives_the_native_builds_bits(tmp_path):
    """Where the native build is AVX-512, its 16 lanes take the AVX2 code's steps lane for lane."""
    library = portable.avx2_library("rows_attention", tmp_path)
    for shape in SHAPES:
        *sizes, causal = shape
        q, k, v = inputs(*sizes, seed=5)
        native_out, native_lse = native_attention.rows_attention(q, k, v, 0.3, causal)
        out, lse = native_attention.rows_attention(q, k, v, 0.3, causal, library)
        assert torch.equal(out, native_out) and torch.equal(lse, native_lse), shape


def test_other_dtypes_go_to_torch():
    q, k, v = (t.to(torch.bfloat16) for t in inputs(20, 30, 4, 2, 16))
    out, lse = native_attention.rows_attention(q, k, v, 0.25, True)
    expected = written_out(q.float(), k.float(), v.float(), 0.25, True)
    torch.testing.assert_close(out.double(), expected[0], atol=3e-2, rtol=3e-2)


def bf16_rounded(*tensors):
    return [t.to(torch.bfloat16).float() for t in tensors]


@pytest.mark.parametrize("shape", SHAPES)
def test_bfloat16_products_match_attention_written_out_on_rounded_operands(shape):
    """q, k and v rounded to bfloat16 are exact in the products; the weights' rounding to bfloat16 is the rest of
    the difference, at most 2^-9 of each weight."""
    *sizes, causal = shape
    q, k, v = inputs(*sizes, seed=6)
    scale = sizes[4] ** -0.5
    out, lse = native_attention.rows_attention(q, k, v, scale, causal, bf16=True)
    expected = written_out(*bf16_rounded(q, k, v), scale, causal)
    torch.testing.assert_close(out.double(), expected[0], atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), expected[1], atol=1e-5, rtol=1e-5)
    assert not torch.equal(out, native_attention.rows_attention(q, k, v, scale, causal)[0])


def test_a_build_without_avx512_bf16_gives_the_bfloat16_products_bits(tmp_path):
    """The AVX2 build takes the products in plain C and its exp in the AVX-512 build's steps (the portable
    build's expf rounds otherwise)."""
    library = portable.avx2_library("rows_attention", tmp_path)
    assert not native_attention.rows_attention_bf16_native(library)
    for shape in SHAPES[:4]:
        *sizes, causal = shape
        q, k, v = inputs(*sizes, seed=7)
        native_out, native_lse = native_attention.rows_attention(q, k, v, 0.3, causal, bf16=True)
        out, lse = native_attention.rows_attention(q, k, v, 0.3, causal, library, bf16=True)
        assert torch.equal(out, native_out) and torch.equal(lse, native_lse), shape


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("tokens, split", [(40, 256), (300, 512), (1, 768)])
def test_a_span_split_at_a_chunk_gives_the_bits_of_one_call(tokens, split, bf16):
    """The running states over the keys before a multiple of the chunk, continued over the rest: each row's bits
    are those of the whole span in one call, as a prompt after a shared trunk gets its own prompt's."""
    assert native_attention.chunk_keys() == 256
    keys = split + tokens + 37
    q, k, v = inputs(tokens, keys, 9, 3, 64, seed=tokens)
    kernel = native_attention.RowsKernel(bf16=bf16)
    whole = kernel(q, k, v, 0.125, True)
    running = kernel.running(q, k[:split], v[:split], 0.125)
    assert running.shape == (tokens, 9, 66)
    out, lse = kernel.continued(q, k[split:], v[split:], 0.125, running)
    assert torch.equal(out, whole[0]) and torch.equal(lse, whole[1])


def test_a_running_state_is_max_sum_and_unnormalised_output():
    q, k, v = inputs(5, 256, 4, 2, 16, seed=8)
    running = native_attention.RowsKernel().running(q, k, v, 0.25)
    out, lse = native_attention.rows_attention(q, k, v, 0.25, False)
    top, total, unnormalised = running[..., 0], running[..., 1], running[..., 2:]
    torch.testing.assert_close(top + total.log(), lse)
    torch.testing.assert_close(unnormalised / total[..., None], out)
    expected_top = torch.einsum("qhd,khd->qhk", q, k.repeat_interleave(2, 1)).amax(-1) * 0.25
    torch.testing.assert_close(top, expected_top)


def test_a_carry_of_the_wrong_shape_is_refused():
    from kernels.errors import KernelError
    q, k, v = inputs(5, 300, 4, 2, 16)
    with pytest.raises(KernelError, match="carry must have shape"):
        native_attention.RowsKernel().continued(q, k, v, 0.25, torch.zeros(5, 4, 16))
