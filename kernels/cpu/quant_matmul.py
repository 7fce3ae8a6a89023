"""Matmuls straight from a GGUF file's quantized blocks on a CPU (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K,
Q6_K), and the expansion of a tile of such a weight to float32.

A decode step multiplies a few rows by every weight of the model, so on a CPU its time is the time to read
the weights from memory: read as Q4_K they are a seventh of the float32 bytes. The kernel (csrc/quant_matmul.c)
reads the blocks as the file stores them (a QuantizedTensor's), expands them in the L1 cache to exactly the
float32 values gguf.quants.dequantize gives, and multiplies there. Prefill, where a GEMM is compute-bound,
expands a tile of the weight at a time into a scratch (`dequantize`) and multiplies that with BLAS.
"""
from __future__ import annotations

import ctypes

import torch

from kernels.cpu import entry_points, ops
from kernels.reference.quant_blocks import QuantizedTensor

FORMATS = tuple(entry_points.QUANT_FORMATS)   # the block formats the kernel reads
MAX_ROWS = 64


def supports(format: str) -> bool:
    return format in entry_points.QUANT_FORMATS


def available() -> bool:
    return entry_points.library("quant_matmul") is not None


def bf16_native(library: ctypes.CDLL | None = None) -> bool:
    """Whether csrc/quant_matmul_bf16.c's build (library: another) takes bfloat16 products on AVX512-BF16, not in
    plain C."""
    library = library or entry_points.library("quant_matmul_bf16")
    return library is not None and library.swarm_quant_matmul_bf16_native() == 1


def usable(x: torch.Tensor) -> bool:
    """Whether `x @ weight.T` can take the kernel: a few float32 rows on a CPU."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.shape[0] <= MAX_ROWS


def quant_matmul(x: torch.Tensor, weight: QuantizedTensor, bias: torch.Tensor | None = None,
                 library: ctypes.CDLL | None = None) -> torch.Tensor:
    """x @ W.T + bias for float32 x [rows, cols] on a CPU, W the weight's gguf values (the op
    swarm::quant_matmul). library: another build of the kernel (tests pass its portable build)."""
    return ops.quant_matmul(x.contiguous(), weight.blocks, weight.format, weight.cols, bias, library=library)


def quant_matmul_many(x: torch.Tensor, weights: list[QuantizedTensor], biases: list[torch.Tensor | None],
                      library: ctypes.CDLL | None = None, bf16: bool = False) -> list[torch.Tensor]:
    """[quant_matmul(x, weight, bias) for each weight and bias], bit for bit, in one call: the threads wake once
    for all (a decode step's q, k and v projections; its gate and up). The weights take the same x, so they
    have its columns; their formats may differ (the op swarm::quant_matmul_many). bf16: in bfloat16 products
    summed in float32, in a fixed order for each output (oracle: kernels.reference.bf16_matmul.lanes_matmul)."""
    codes = [entry_points.QUANT_FORMATS[w.format][0] for w in weights]
    return ops.quant_matmul_many(x.contiguous(), [w.blocks for w in weights], codes, x.shape[1], biases, bf16,
                                 library=library)


def dequantize(weight: QuantizedTensor, rows: tuple[int, int], out: torch.Tensor,
               library: ctypes.CDLL | None = None) -> torch.Tensor:
    """Rows [r0, r1) of the weight as float32 into `out` (contiguous [r1 - r0, cols]), bit for bit the
    values of gguf.quants.dequantize, the threads taking rows (the op swarm::quant_dequantize)."""
    first, last = rows
    ops.quant_dequantize(weight.blocks[first:last], weight.format, weight.cols, out, library=library)
    return out
