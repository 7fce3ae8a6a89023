"""A decode step's transformer layer in three C calls around its attention (csrc/decode_layer.c), for a few
float32 rows against weights in GGUF blocks:

    attention_inputs(x, cos, sin)   -> q, k, v      RMSNorm, the q/k/v projections, q and k norms, rotary
    mlp_inputs(x, attended)         -> h, gate, up  the o projection, the residual, RMSNorm, gate and up
    mlp_output(h, act)              -> x of the next layer   the down projection and the residual

Each call is the ops' own code in their order (kernels.cpu.fused_ops, the quantized matmul of a WeightSet),
so it gives the layer's bits; what it saves is the dozen Python calls, checks and outputs of each layer. The
weights and norms are described to the kernel once, when the layer is made.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from kernels.cpu import entry_points
from kernels.cpu.checks import expect_rank, expect_tensor, refusal
from kernels.cpu.weight_set import Description, WeightSet

OP = "decode_layer"
MAX_HEAD_DIM = 1024   # csrc/decode_layer.h's
_ptr = ctypes.c_void_p


class Layer(ctypes.Structure):
    """csrc/decode_layer.h's swarm_decode_layer"""

    _fields_ = [("qkv", ctypes.POINTER(Description)), ("o", ctypes.POINTER(Description)),
                ("gate_up", ctypes.POINTER(Description)), ("down", ctypes.POINTER(Description)),
                ("input_norm", _ptr), ("post_norm", _ptr), ("q_norm", _ptr), ("k_norm", _ptr),
                ("eps", ctypes.c_float), ("hidden", ctypes.c_int64), ("heads", ctypes.c_int64),
                ("kv_heads", ctypes.c_int64), ("head_dim", ctypes.c_int64)]


@dataclass(frozen=True)
class LayerNorms:
    """The RMSNorm weights of a layer, all with the same eps; q and k: per head (Qwen3), or None."""

    input: torch.Tensor
    post_attention: torch.Tensor
    q: torch.Tensor | None
    k: torch.Tensor | None
    eps: float


class DecodeLayer:
    """One layer's weights and norms, described to csrc/decode_layer.c once."""

    def __init__(self, qkv: WeightSet, o: WeightSet, gate_up: WeightSet, down: WeightSet, norms: LayerNorms,
                 heads: int, kv_heads: int, head_dim: int):
        self.sets = (qkv, o, gate_up, down)
        self.norms = norms
        self.hidden, self.heads, self.kv_heads, self.head_dim = qkv.cols, heads, kv_heads, head_dim
        self.intermediate = gate_up.rows[0]
        _check_shapes(self)
        pointer = ctypes.pointer
        self.description = Layer(pointer(qkv.description), pointer(o.description), pointer(gate_up.description),
                             pointer(down.description), norms.input.data_ptr(), norms.post_attention.data_ptr(),
                             _pointer_or_null(norms.q), _pointer_or_null(norms.k), norms.eps, self.hidden, heads,
                             kv_heads, head_dim)
        self._by_reference = ctypes.byref(self.description)
        self._library = entry_points.library(OP)

    @staticmethod
    def available() -> bool:
        return entry_points.library(OP) is not None

    def attention_inputs(self, x: torch.Tensor, cos: torch.Tensor,
                         sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [rows, hidden], cos and sin [rows, head_dim] -> q [rows, heads, head_dim], k and v [rows, kv_heads,
        head_dim]"""
        rows = self._expect_rows("x", x, self.hidden)
        expect_tensor(OP, "cos", cos, (rows, self.head_dim))
        expect_tensor(OP, "sin", sin, (rows, self.head_dim))
        q = x.new_empty(rows, self.heads, self.head_dim)
        k, v = x.new_empty(rows, self.kv_heads, self.head_dim), x.new_empty(rows, self.kv_heads, self.head_dim)
        scratch = x.new_empty(rows, self.hidden)
        _succeeded(self._library.swarm_decode_attention_in(self._by_reference, x.data_ptr(), rows, cos.data_ptr(),
                                                           sin.data_ptr(), scratch.data_ptr(), q.data_ptr(),
                                                           k.data_ptr(), v.data_ptr(), torch.get_num_threads()))
        return q, k, v

    def mlp_inputs(self, x: torch.Tensor, attended: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [rows, hidden] (the layer's input), attended [rows, heads * head_dim] -> h = x + o_proj(attended),
        gate and up of h's RMSNorm [rows, intermediate]"""
        rows = self._expect_rows("x", x, self.hidden)
        expect_tensor(OP, "attended", attended, (rows, self.heads * self.head_dim))
        h, scratch = x.new_empty(rows, self.hidden), x.new_empty(rows, self.hidden)
        gate, up = x.new_empty(rows, self.intermediate), x.new_empty(rows, self.intermediate)
        _succeeded(self._library.swarm_decode_mlp_in(self._by_reference, x.data_ptr(), attended.data_ptr(), rows,
                                                     scratch.data_ptr(), h.data_ptr(), gate.data_ptr(), up.data_ptr(),
                                                     torch.get_num_threads()))
        return h, gate, up

    def mlp_output(self, h: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        """h [rows, hidden], act = silu(gate) * up [rows, intermediate] -> h + down_proj(act)"""
        rows = self._expect_rows("h", h, self.hidden)
        expect_tensor(OP, "act", act, (rows, self.intermediate))
        out = h.new_empty(rows, self.hidden)
        _succeeded(self._library.swarm_decode_mlp_out(self._by_reference, h.data_ptr(), act.data_ptr(), rows,
                                                      out.data_ptr(), torch.get_num_threads()))
        return out

    @staticmethod
    def _expect_rows(name: str, tensor: torch.Tensor, width: int) -> int:
        expect_rank(OP, name, tensor, 2)
        if tensor.shape[1] != width:
            raise refusal(OP, name, f"has {tensor.shape[1]} columns, the layer {width}")
        return tensor.shape[0]


def _check_shapes(layer: DecodeLayer) -> None:
    """Refuses weights and norms that do not make one layer: the C code trusts every size."""
    qkv, o, gate_up, down = layer.sets
    q_width, kv_width = layer.heads * layer.head_dim, layer.kv_heads * layer.head_dim
    expected = {"qkv": (qkv, layer.hidden, [q_width, kv_width, kv_width]), "o": (o, q_width, [layer.hidden]),
                "gate_up": (gate_up, layer.hidden, [layer.intermediate] * 2), "down": (down, layer.intermediate,
                                                                                       [layer.hidden])}
    for name, (weights, cols, rows) in expected.items():
        if weights.cols != cols or weights.rows != rows:
            raise refusal(OP, name, f"must be {rows} rows of {cols} columns, got {weights.rows} of {weights.cols}")
    if not 0 < layer.head_dim <= MAX_HEAD_DIM or layer.head_dim % 2:
        raise refusal(OP, "head_dim", f"must be even and at most {MAX_HEAD_DIM}, got {layer.head_dim}")
    norms = layer.norms
    expect_tensor(OP, "input norm", norms.input, (layer.hidden,))
    expect_tensor(OP, "post-attention norm", norms.post_attention, (layer.hidden,))
    if (norms.q is None) != (norms.k is None):
        raise refusal(OP, "q and k norms", "must both be given or neither")
    for name, weight in (("q norm", norms.q), ("k norm", norms.k)):
        if weight is not None:
            expect_tensor(OP, name, weight, (layer.head_dim,))


def _pointer_or_null(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()


def _succeeded(result: int) -> None:
    """A call's result: 0, or the reason it stopped (a head wider than the C code takes is refused before)."""
    if result:
        raise MemoryError("a decode layer's C call could not allocate its scratch memory")
