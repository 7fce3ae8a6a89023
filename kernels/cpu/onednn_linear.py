"""Float32 matmuls on a CPU through oneDNN, the library torch ships for its CPU kernels.

torch's own float32 GEMM (MKL) takes its AVX2 code on AMD CPUs; oneDNN uses the widest
instructions the CPU has. On a 2-core AMD EPYC with AVX-512, a SmolLM2 prefill matmul
(2,048 x 576 by 576 x 1,536) runs at about 520 GFLOP/s against MKL's 235, and at 262 with
oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2). Each output is still a float32 sum of float32
products, and from two rows up a row's result does not depend on the rows computed with it.

The weight is reordered once into oneDNN's blocked layout (`pack`); that copy replaces the
plain one, so memory does not grow.
"""
from __future__ import annotations

import functools

import torch


@functools.cache
def available() -> bool:
    """Whether this torch build has oneDNN's linear ops and they compute a product correctly."""
    if not torch.backends.mkldnn.is_available():
        return False
    try:
        weight = torch.arange(6, dtype=torch.float32).reshape(2, 3)
        out = linear(torch.ones(4, 3), pack(weight, 4), torch.ones(2))
    except (AttributeError, RuntimeError):
        return False
    return torch.equal(out, torch.tensor([[4.0, 13.0]] * 4))


def pack(weight: torch.Tensor, rows: int) -> torch.Tensor:
    """A float32 CPU weight [out, in] in oneDNN's layout, laid out for about `rows` rows a call."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), rows)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T + bias, for float32 x [..., in] on a CPU and a weight from `pack`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
