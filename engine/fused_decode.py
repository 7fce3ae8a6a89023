"""A decode step's Llama-family layer as three C calls around its attention (kernels.cpu.decode_layer), where
every projection is a QuantizedLinear on the CPU kernel and the rows are float32: the dozen Python calls of the
layer's PyTorch path (engine.model.DecoderLayer) cost about a third of a SmolLM2 decode step. Where every layer
is such a layer and the attention is the cascade backend on the C kernels, the whole stack of layers runs as one
C call (kernels.cpu.decode_stack): the backend's Python in each layer cost another fifth.

The C calls run the same code in the same order as that path, so a row's bits are the same either way: a decode
row beside a prompt in a mixed step, which takes the PyTorch path (engine.model.rows_apart), gets the logits a
decode-only step gives it. `unfused()` turns the C calls off and `layer_by_layer()` the one-call stack, for the
tests that compare them.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention.base import AttentionBackend, AttentionBatch
from engine.attention.cascade import CascadeBackend
from engine.attention.kernel_sets import NATIVE_KERNELS
from engine.attention.plan import DecodePlan
from engine.quantized_layers import QuantizedLinear
from kernels.cpu import fused_ops, ops
from kernels.cpu.decode_layer import DecodeLayer, LayerNorms
from kernels.cpu.decode_stack import DecodeStack, Trunk
from kernels.cpu.quant_matmul import MAX_ROWS

_enabled = True
_stacked = True


@contextmanager
def unfused():
    """Decode steps take the PyTorch path while inside."""
    global _enabled
    before, _enabled = _enabled, False
    try:
        yield
    finally:
        _enabled = before


@contextmanager
def layer_by_layer():
    """Decode steps run their layers' C calls one layer at a time while inside."""
    global _stacked
    before, _stacked = _stacked, False
    try:
        yield
    finally:
        _stacked = before


def kernel_for(layer: nn.Module) -> DecodeLayer | None:
    """The C description of a DecoderLayer whose parts are plain (the caller checks their types), or None where a
    part is not one the C code computes: a float weight, a weight the kernel cannot read, a norm's other eps."""
    attn, mlp = layer.self_attn, layer.mlp
    projections = (attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)
    if not (DecodeLayer.available() and all(isinstance(p, QuantizedLinear) and p.on_cpu_kernel for p in projections)):
        return None
    qk_norms = (attn.q_norm, attn.k_norm) if hasattr(attn, "q_norm") else ()
    norms = (layer.input_layernorm, layer.post_attention_layernorm, *qk_norms)
    if len({norm.eps for norm in norms}) != 1 or not all(_on_cpu(norm.weight, (torch.float32,)) for norm in norms):
        return None
    q_norm, k_norm = (norm.weight.detach() for norm in qk_norms) if qk_norms else (None, None)
    weights = LayerNorms(norms[0].weight.detach(), norms[1].weight.detach(), q_norm, k_norm, norms[0].eps)
    return DecodeLayer(attn.q_proj.weight_set_with((attn.k_proj, attn.v_proj)), attn.o_proj.weight_set_with(()),
                       mlp.gate_proj.weight_set_with((mlp.up_proj,)), mlp.down_proj.weight_set_with(()), weights,
                       attn.num_heads, attn.num_kv_heads, attn.head_dim)


def takes(kernel: DecodeLayer, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor]) -> bool:
    """Whether this step's rows take the C calls: a few float32 CPU rows, the rotary over whole heads, and torch
    not watching (compiling, tracing, profiling: it sees the ops instead)."""
    return _rows_take_c(x, rotary[0], kernel.head_dim)


def _rows_take_c(x: torch.Tensor, cos: torch.Tensor, head_dim: int) -> bool:
    return (_enabled and x.dtype == torch.float32 and x.is_cpu and x.dim() == 2 and x.shape[0] <= MAX_ROWS
            and cos.shape[-1] == head_dim and not ops.torch_is_watching())


def layer_step(layer: nn.Module, kernel: DecodeLayer, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
               batch: AttentionBatch, attention: AttentionBackend) -> torch.Tensor:
    """The layer's output for a decode step's rows x; every row's K/V is written."""
    cos, sin = rotary
    q, k, v = kernel.attention_inputs(x, cos.contiguous(), sin.contiguous())
    attended = attention.forward(q, k, v, layer.self_attn.layer_index, batch)
    h, gate, up = kernel.mlp_inputs(x, attended.reshape(x.shape[0], -1).contiguous())
    return kernel.mlp_output(h, silu_mul(gate, up))


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up: the C op where it applies (the bits the stack's C loop gives), torch's otherwise."""
    fused = fused_ops.silu_mul(gate, up)
    return fused if fused is not None else F.silu(gate, inplace=True).mul_(up)


class StackCache:
    """A model's DecodeStack, made on the first decode step that can take it and made again if the attention
    backend or its KV pool changes; None where a layer or the backend is not one the C code runs."""

    def __init__(self):
        self._key: tuple | None = None
        self._stack: DecodeStack | None = None

    def stack(self, layers: list[nn.Module], attention: AttentionBackend) -> DecodeStack | None:
        """layers: the model's DecoderLayers, in order."""
        if not (_stacked and isinstance(attention, CascadeBackend) and attention.kernels is NATIVE_KERNELS):
            return None
        caches = [attention.kv.layers[layer.self_attn.layer_index] for layer in layers]
        key = (id(attention), attention.bf16_decode, tuple((k.data_ptr(), v.data_ptr()) for k, v in caches))
        if key != self._key:
            self._stack = _stack_or_none([layer.decode_kernel() for layer in layers], caches, attention.scale,
                                         attention.bf16_decode)
            self._key = key
        return self._stack


def stack_step(stack: DecodeStack, x: torch.Tensor, rotary: tuple[torch.Tensor, torch.Tensor],
               batch: AttentionBatch) -> torch.Tensor | None:
    """The last layer's output for a decode-only step's rows x, every row's K/V written; None (nothing written)
    where the step is not one the stack takes."""
    cos, sin = rotary
    plan = batch.plan.decode if batch.plan is not None else None
    if batch.is_prefill or plan is None or not (_rows_take_c(x, cos, stack.head_dim) and x.shape[0]):
        return None
    return stack.run(x.contiguous(), cos.contiguous(), sin.contiguous(), batch.slot_mapping.contiguous(),
                     plan.private_tables.contiguous(), plan.private_lens.contiguous(), _trunks(plan))


def _trunks(plan: DecodePlan) -> list[Trunk]:
    trunks = []
    for prefix in plan.prefixes:
        rows = prefix.rows
        if isinstance(rows, slice):
            rows = torch.arange(rows.start, rows.stop, dtype=torch.int64)
        trunks.append(Trunk(rows.to(torch.int64).contiguous(), prefix.members, prefix.blocks, prefix.first_block,
                            prefix.num_blocks))
    return trunks


def _stack_or_none(kernels: list[DecodeLayer | None], caches, scale: float, bf16: bool) -> DecodeStack | None:
    """The stack over these layers and caches; None where the C stack does not take them (float32 caches, or
    bfloat16 ones read by bfloat16 products)."""
    cache_dtypes = (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)
    if not (DecodeStack.available() and all(kernel is not None for kernel in kernels)
            and all(_on_cpu(k, cache_dtypes) and _on_cpu(v, cache_dtypes) for k, v in caches)):
        return None
    return DecodeStack(kernels, caches, scale, bf16_attention=bf16)


def _on_cpu(tensor: torch.Tensor, dtypes: tuple[torch.dtype, ...]) -> bool:
    """A contiguous CPU tensor of one of `dtypes`."""
    return tensor.dtype in dtypes and tensor.is_cpu and tensor.is_contiguous()
