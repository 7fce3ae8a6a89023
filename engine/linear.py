"""The model's linear layers, one module class per kind of weight.

The model is built with `Linear` everywhere; loading (engine.loading.build) then swaps in the other
kinds where the device and the file allow, the way gpt-fast's quantize.py does:

    Linear            the float weight; F.linear (a few CPU rows: weight @ x.T, a BLAS choice)
    PackedLinear      the float32 CPU weight in oneDNN's blocked layout, multiplied by oneDNN
    QuantizedLinear   a few rows straight from the file's quantized blocks (kernels.cpu.quant_matmul);
                      more rows through the Linear or PackedLinear it stands in for
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kernels.cpu import onednn_linear, quant_matmul
from kernels.cpu.quant_matmul import QuantizedWeight

FEW_ROWS = 64


class Linear(nn.Linear):
    """nn.Linear, except that on a CPU a few rows are computed as weight @ x.T: CPU BLAS then picks a
    kernel that streams the weight faster (SmolLM2, 8 rows, all layers: 67 -> 50 ms per step; lm_head
    alone 19 -> 8.6 ms)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] > FEW_ROWS or x.device.type != "cpu" or x.dim() != 2:
            return F.linear(x, self.weight, self.bias)
        if self.bias is None:
            return (self.weight @ x.T).T.contiguous()
        return torch.addmm(self.bias[:, None], self.weight, x.T).T.contiguous()


class PackedLinear(nn.Module):
    """A Linear whose float32 CPU weight is reordered once into oneDNN's layout, laid out for steps of
    about `rows` rows; the packed copy replaces the plain one (kernels.cpu.onednn_linear)."""

    def __init__(self, linear: Linear, rows: int):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(onednn_linear.pack(linear.weight, rows), requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return onednn_linear.linear(x, self.weight, self.bias)


class QuantizedLinear(nn.Module):
    """Steps of a few float32 CPU rows (decode) multiply the file's quantized blocks; every other
    call goes to `dense`, the Linear or PackedLinear it stands in for, which keeps the float weight
    (prefill is compute-bound, and BLAS is faster there)."""

    def __init__(self, quantized: QuantizedWeight, dense: Linear | PackedLinear):
        super().__init__()
        assert quantized.shape == (dense.out_features, dense.in_features), "the blocks are another weight's"
        self.in_features, self.out_features = dense.in_features, dense.out_features
        self.quantized = quantized
        self.dense = dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if quant_matmul.usable(x):
            return quant_matmul.quant_matmul(x, self.quantized, self.dense.bias)
        return self.dense(x)


DENSE = (Linear, PackedLinear)
MakeLinear = Callable[[str, Linear | PackedLinear], nn.Module | None]


def swap_linears(model: nn.Module, make: MakeLinear) -> list[str]:
    """Replaces each dense linear layer (Linear or PackedLinear) of `model` by `make(name, layer)`,
    where that is not None; `name` is the layer's dotted path ("model.layers.0.mlp.down_proj").
    The names of the layers replaced."""
    swapped = []
    for parent_name, parent in list(model.named_modules()):
        for child_name, child in list(parent.named_children()):
            if not isinstance(child, DENSE):
                continue
            name = f"{parent_name}.{child_name}" if parent_name else child_name
            replacement = make(name, child)
            if replacement is not None:
                setattr(parent, child_name, replacement)
                swapped.append(name)
    return swapped
