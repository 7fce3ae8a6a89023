"""The C RMSNorm and rotary embedding against transformers' own Llama modules (the oracle)."""
import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from kernels.cpu import fused_ops, native

pytestmark = pytest.mark.skipif(native.load("fused_ops") is None, reason="no C compiler for the kernels")


@pytest.mark.parametrize("shape", [(1, 576), (7, 64), (300, 576), (5, 9, 128)])
def test_rms_norm_matches_transformers(shape):
    torch.manual_seed(0)
    norm = LlamaRMSNorm(shape[-1], eps=1e-5)
    with torch.no_grad():
        norm.weight.uniform_(-2, 2)
        x = torch.randn(shape) * 3
        expected = norm(x)
    got = fused_ops.rms_norm(x, norm.weight.detach(), 1e-5)
    torch.testing.assert_close(got, expected, rtol=2e-6, atol=2e-6)


def test_rms_norm_of_a_strided_view_reads_the_view():
    x = torch.randn(4, 9, 64).transpose(0, 1)
    weight = torch.rand(64)
    expected = LlamaRMSNorm(64, eps=1e-6)
    with torch.no_grad():
        expected.weight.copy_(weight)
        torch.testing.assert_close(fused_ops.rms_norm(x, weight, 1e-6), expected(x), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("tokens,heads,dim", [(1, 9, 64), (33, 3, 64), (600, 4, 128)])
def test_rotary_is_bit_identical_to_transformers(tokens, heads, dim):
    torch.manual_seed(1)
    q, k = torch.randn(tokens, heads, dim), torch.randn(tokens, 2, dim)
    angles = torch.rand(tokens, dim // 2) * 100
    cos, sin = torch.cat((angles, angles), -1).cos(), torch.cat((angles, angles), -1).sin()
    # transformers' layout: [batch, heads, tokens, dim] with cos/sin [batch, tokens, dim]
    want_q, want_k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    assert torch.equal(fused_ops.rotary(q, cos, sin), want_q[0].transpose(0, 1))
    assert torch.equal(fused_ops.rotary(k, cos, sin), want_k[0].transpose(0, 1))


def test_other_dtypes_are_left_to_pytorch():
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    assert fused_ops.rms_norm(x, torch.ones(64, dtype=torch.bfloat16), 1e-5) is None
    assert fused_ops.rotary(x[:, None], x.float(), x.float()) is None
