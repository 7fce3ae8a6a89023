"""The model's float linear layers, and how loading swaps one kind of layer for another.

The model is built with `Linear` everywhere; loading (engine.loading.build) then swaps in the other
kinds where the device and the file allow, the way gpt-fast's quantize.py does:

    Linear            the float weight; F.linear (a few CPU rows: weight @ x.T, a BLAS choice)
    PackedLinear      the float32 CPU weight in oneDNN's blocked layout, multiplied by oneDNN
    QuantizedLinear   the weight kept in its file's block format (engine.quantized_layers)
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine import prompt_matmul
from kernels.cpu import onednn_linear

FEW_ROWS = 64


class Linear(nn.Linear):
    """nn.Linear, except that on a CPU a few rows are computed as weight @ x.T: CPU BLAS then picks a
    kernel that streams the weight faster (SmolLM2, 8 rows, all layers: 67 -> 50 ms per step; lm_head
    alone 19 -> 8.6 ms)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return prompt_matmul.with_step_precision(self._product, x)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
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
        return prompt_matmul.with_step_precision(onednn_linear.linear, x, self.weight, self.bias)


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
