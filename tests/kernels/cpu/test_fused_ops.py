"""The C RMSNorm and rotary embedding against transformers' own Llama modules (the oracle), and silu(gate) * up
against torch's silu and float64."""
import pytest
import torch
import torch.nn.functional as F
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


@pytest.mark.parametrize("shape", [(1, 1536), (8, 1536), (3, 13), (70000,), (5,)])
def test_silu_mul_is_torchs_to_a_few_ulps(shape):
    torch.manual_seed(2)
    gate, up = torch.randn(shape) * 8, torch.randn(shape)
    got = fused_ops.silu_mul(gate, up)
    exact = gate.double() * torch.sigmoid(gate.double()) * up.double()
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=4e-6, atol=1e-30)
    assert ((got.double() - exact).abs() <= 6e-7 * exact.abs() + 1e-37).all()


def test_silu_mul_at_the_edges():
    """Past -87, where silu is below 1e-35, it flushes to 0, as its exp does."""
    gate = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 30.0, -30.0, 87.0, -87.5, 100.0, -100.0, 3e38, -3e38])
    got = fused_ops.silu_mul(gate, torch.full_like(gate, 2.0))
    exact = (gate.double() * torch.sigmoid(gate.double()) * 2).float()
    torch.testing.assert_close(got, exact, rtol=1e-6, atol=1e-35)
    assert not got.isnan().any()


def test_silu_mul_gives_each_element_the_same_bits_in_any_run():
    gate, up = torch.randn(3, 1541) * 5, torch.randn(3, 1541)
    whole = fused_ops.silu_mul(gate, up)
    assert torch.equal(fused_ops.silu_mul(gate[1:2, 3:], up[1:2, 3:]), whole[1:2, 3:])


def test_other_dtypes_are_left_to_pytorch():
    x = torch.randn(2, 64, dtype=torch.bfloat16)
    assert fused_ops.rms_norm(x, torch.ones(64, dtype=torch.bfloat16), 1e-5) is None
    assert fused_ops.rotary(x[:, None], x.float(), x.float()) is None
    assert fused_ops.silu_mul(x, x) is None
