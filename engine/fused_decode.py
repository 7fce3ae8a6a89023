"""A decode step's Llama-family layer as three C calls around its attention (kernels.cpu.decode_layer), where
every projection is a QuantizedLinear on the CPU kernel and the rows are float32: the dozen Python calls of the
layer's PyTorch path (engine.model.DecoderLayer) cost about a third of a SmolLM2 decode step.

The C calls run the same code in the same order as that path, so a row's bits are the same either way: a decode
row beside a prompt in a mixed step, which takes the PyTorch path (engine.model.rows_apart), gets the logits a
decode-only step gives it. `unfused()` turns the C calls off, for the tests that compare the two.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.base import AttentionBackend, AttentionBatch
from engine.quantized_layers import QuantizedLinear
from kernels.cpu import ops
from kernels.cpu.decode_layer import DecodeLayer, LayerNorms
from kernels.cpu.quant_matmul import MAX_ROWS

_enabled = True


@contextmanager
def unfused():
    """Decode steps take the PyTorch path while inside."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


def kernel_for(layer: nn.Module) -> DecodeLayer | None:
    """The C description of a DecoderLayer whose parts are plain (the caller checks their types), or None where a
    part is not one the C code computes: a float weight, a weight the kernel cannot read, a norm's other eps."""
    attn, mlp = layer.self_attn, layer.mlp
    projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    if not (DecodeLayer.available() and all(isinstance(p, QuantizedLinear) and p.on_cpu_kernel for p in projections)):
        return None
    qk_norms = (attn.q_norm, attn.k_norm) if hasattr(attn, "q_norm") else ()
    norms = (layer.input_layernorm, layer.post_attention_layernorm, *qk_norms)
    if len({norm.eps for norm in norms}) != 1 or not all(_float32_on_cpu(norm.weight) for norm in norms):
        return None
    q_norm, k_norm = (norm.weight.detach() for norm in qk_norms) if qk_norms else (None, None)
    weights = LayerNorms(norms[0].weight.detach(), norms[1].weight.detach(), q_norm, k_norm, norms[0].eps)
    return DecodeLayer(attn.q_proj.weight_set_with((attn.k_proj, attn.v_proj)), attn.o_proj.weight_set_with(()),
                       mlp.gate_proj.weight_set_with((mlp.up_proj,)), mlp.down_proj.weight_set_with(()), weights,
                       attn.num_heads, attn.num_kv_heads, attn.head_dim)


def takes(kernel: DecodeLayer, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether this step's rows take the C calls: a few float32 CPU rows, the rotary over whole heads, and torch
    not watching (compiling, tracing, profiling: it sees the ops instead)."""
    cos = rotary[0]
    return (_enabled and x.dtype == torch.float32 and x.is_cpu and x.dim() == 2 and x.shape[0] <= MAX_ROWS
            and cos.shape[-1] == kernel.head_dim and not ops.torch_is_watching())


def layer_step(layer: nn.Module, kernel: DecodeLayer, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
               batch: AttentionBatch, attention: AttentionBackend) -> torch.Tensor:
    """The layer's output for a decode step's rows x; every row's K/V is written."""
    cos, sin = rotary
    q, k, v = kernel.attention_inputs(x, cos.contiguous(), sin.contiguous())
    attended = attention.forward(q, k, v, layer.self_attn.layer_index, batch)
    h, gate, up = kernel.mlp_inputs(x, attended.reshape(x.shape[0], -1).contiguous())
    return kernel.mlp_output(h, F.silu(gate, inplace=True).mul_(up))


def _float32_on_cpu(tensor: torch.Tensor) -> bool:
    return tensor.dtype == torch.float32 and tensor.is_cpu and tensor.is_contiguous()
