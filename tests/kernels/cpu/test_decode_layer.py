"""A decode layer's three C calls against the ops one by one (the same bits: the engine's PyTorch path runs those
ops) and against float math on gguf's dequantized weights with transformers' RMSNorm and rotary (close)."""
import pytest
import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import LlamaRMSNorm, apply_rotary_pos_emb

from kernels.cpu import fused_ops
from kernels.cpu.decode_layer import DecodeLayer, LayerNorms
from kernels.cpu.weight_set import WeightSet
from kernels.errors import KernelError
from tests.helpers.decode_layers import (
    EPS,
    HEAD_DIM,
    HEADS,
    KV_HEADS,
    decode_layer,
    layer_parts,
    step_inputs,
)
from tests.helpers.random_blocks import gguf_values

pytestmark = pytest.mark.skipif(not DecodeLayer.available(), reason="no C compiler for the kernels")

def ops_one_by_one(weights, biases, norms, x, cos, sin):
    """The layer as engine.model's PyTorch path computes it on the CPU, op by op."""
    w = weights
    normed = fused_ops.rms_norm(x, norms.input, EPS)
    q, k, v = WeightSet([w["q"], w["k"], w["v"]], [biases["q"], biases["k"], biases["v"]])(normed)
    q, k, v = q.view(-1, HEADS, HEAD_DIM), k.view(-1, KV_HEADS, HEAD_DIM), v.view(-1, KV_HEADS, HEAD_DIM)
    if norms.q is not None:
        q, k = fused_ops.rms_norm(q, norms.q, EPS), fused_ops.rms_norm(k, norms.k, EPS)
    q, k = fused_ops.rotary(q, cos, sin), fused_ops.rotary(k, cos, sin)
    attended = torch.randn(x.shape[0], HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(7))
    h = x + WeightSet([w["o"]], [None])(attended)[0]
    gate, up = WeightSet([w["gate"], w["up"]], [None, None])(fused_ops.rms_norm(h, norms.post_attention, EPS))
    act = F.silu(gate).mul(up)
    out = h + WeightSet([w["down"]], [None])(act)[0]
    return (q, k, v), attended, (h, gate, up), act, out


def float_math(weights, biases, norms, x, cos, sin, attended):
    """The same layer in plain float math: gguf's dequantized weights, transformers' RMSNorm and rotary."""
    w = {name: gguf_values(weight) for name, weight in weights.items()}
    def rms(values, weight):
        module = LlamaRMSNorm(weight.shape[0], eps=EPS)
        with torch.no_grad():
            module.weight.copy_(weight)
            return module(values)
    normed = rms(x, norms.input)
    q = (normed @ w["q"].T + biases["q"]).view(-1, HEADS, HEAD_DIM)
    k = (normed @ w["k"].T).view(-1, KV_HEADS, HEAD_DIM)
    v = (normed @ w["v"].T + biases["v"]).view(-1, KV_HEADS, HEAD_DIM)
    if norms.q is not None:
        q, k = rms(q, norms.q), rms(k, norms.k)
    q, k = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos[None], sin[None])
    h = x + attended @ w["o"].T
    post = rms(h, norms.post_attention)
    gate, up = post @ w["gate"].T, post @ w["up"].T
    return (q[0].transpose(0, 1), k[0].transpose(0, 1), v), (h, gate, up)


@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])
@pytest.mark.parametrize("rows", [1, 3, 8, 64])
def test_the_three_calls_give_the_bits_of_the_ops_one_by_one(qk_norm, rows):
    weights, biases, norms = layer_parts(qk_norm)
    x, cos, sin = step_inputs(rows)
    layer = decode_layer(weights, biases, norms)
    qkv, attended, mlp_in, act, out = ops_one_by_one(weights, biases, norms, x, cos, sin)
    got_qkv = layer.attention_inputs(x, cos, sin)
    got_mlp_in = layer.mlp_inputs(x, attended)
    for got, want in zip((*got_qkv, *got_mlp_in), (*qkv, *mlp_in)):
        assert got.shape == want.shape and torch.equal(got, want)
    assert torch.equal(layer.mlp_output(mlp_in[0], act), out)


@pytest.mark.parametrize("qk_norm", [False, True], ids=["llama", "qwen3"])
def test_the_calls_compute_the_layer_of_the_dequantized_weights(qk_norm):
    weights, biases, norms = layer_parts(qk_norm, seed=3)
    x, cos, sin = step_inputs(5)
    layer = decode_layer(weights, biases, norms)
    attended = torch.randn(5, HEADS * HEAD_DIM, generator=torch.Generator().manual_seed(4))
    want_qkv, want_mlp_in = float_math(weights, biases, norms, x, cos, sin, attended)
    for got, want in zip((*layer.attention_inputs(x, cos, sin), *layer.mlp_inputs(x, attended)),
                         (*want_qkv, *want_mlp_in)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_weights_that_make_no_layer_are_refused_when_it_is_made():
    weights, biases, norms = layer_parts(False)
    w = weights
    with pytest.raises(KernelError, match=r"swarm::decode_layer: o must be \[256\] rows of 256 columns, got \[512\]"):
        DecodeLayer(WeightSet([w["q"], w["k"], w["v"]], [None] * 3), WeightSet([w["gate"]], [None]),
                    WeightSet([w["gate"], w["up"]], [None] * 2), WeightSet([w["down"]], [None]), norms, HEADS,
                    KV_HEADS, HEAD_DIM)
    short_norm = LayerNorms(norms.input[:10], norms.post_attention, None, None, EPS)
    with pytest.raises(KernelError, match=r"input norm must have shape \[256\], got \[10\]"):
        decode_layer(weights, biases, short_norm)


@pytest.mark.parametrize("call,message", [
    (lambda layer, x, cos, sin: layer.attention_inputs(x[:, :100], cos, sin), r"x must be contiguous"),
    (lambda layer, x, cos, sin: layer.attention_inputs(x.double(), cos, sin), r"x must be torch.float32"),
    (lambda layer, x, cos, sin: layer.attention_inputs(x, cos[:1], sin), r"cos must have shape \[2, 64\]"),
    (lambda layer, x, cos, sin: layer.mlp_inputs(x, x[:, :100].contiguous()),
     r"attended must have shape \[2, 256\], got \[2, 100\]"),
    (lambda layer, x, cos, sin: layer.mlp_output(x[:, :128].contiguous(), x), r"h has 128 columns, the layer 256"),
])
def test_tensors_the_kernel_would_misread_are_refused(call, message):
    layer = decode_layer(*layer_parts(False))
    x, cos, sin = step_inputs(2)
    with pytest.raises(KernelError, match=rf"swarm::decode_layer: {message}"):
        call(layer, x, cos, sin)
