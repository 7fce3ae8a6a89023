"""Decode-step matmuls straight from a GGUF file's quantized blocks (Q4_0, Q4_1, Q8_0).

A decode step multiplies a few rows by every weight of the model, so on a CPU its time is the
time to read the weights from memory. Read as Q4_1 they are a sixth of the float32 bytes. The
kernel (quant_matmul.c) dequantizes each 32-value block in registers to exactly the float32
values the gguf package gives, and multiplies there; the float32 copy stays for prefill, where
BLAS is compute-bound and faster.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGMLQuantizationType

from kernels.cpu import entry_points, ops

BLOCK = entry_points.QUANT_BLOCK   # values per quantized block, as the file stores them
MAX_ROWS = 64


@dataclass(frozen=True, slots=True)
class QuantizedWeight:
    """A [rows, cols] weight as 4- or 8-bit codes with a float32 scale and offset per 32-value block."""

    bits: int
    codes: torch.Tensor            # uint8 [rows, cols / 32 * (16 or 32)]
    scale: torch.Tensor            # float32 [rows, cols / 32]
    offset: torch.Tensor | None    # float32 [rows, cols / 32]; None for Q8_0

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape[0], self.scale.shape[1] * BLOCK

    @property
    def nbytes(self) -> int:
        tensors = (self.codes, self.scale, self.offset)
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)

    def rows(self, order: torch.Tensor) -> QuantizedWeight:
        """The same weight with its rows reordered."""
        offset = None if self.offset is None else self.offset[order].contiguous()
        return QuantizedWeight(self.bits, self.codes[order].contiguous(), self.scale[order].contiguous(), offset)


SUPPORTED = (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q8_0)


def from_gguf_blocks(raw: np.ndarray, qtype: GGMLQuantizationType) -> QuantizedWeight | None:
    """raw: uint8 [rows, blocks * block_bytes] as stored in the file; None for other block types."""
    if qtype not in SUPPORTED:
        return None
    rows = raw.shape[0]
    bits = 8 if qtype == GGMLQuantizationType.Q8_0 else 4
    header = 4 if qtype == GGMLQuantizationType.Q4_1 else 2
    blocks = raw.reshape(rows, -1, header + BLOCK * bits // 8)
    scale = np.ascontiguousarray(blocks[:, :, 0:2]).view(np.float16).astype(np.float32)[..., 0]
    codes = np.ascontiguousarray(blocks[:, :, header:]).reshape(rows, -1)
    if qtype == GGMLQuantizationType.Q4_1:
        offset = np.ascontiguousarray(blocks[:, :, 2:4]).view(np.float16).astype(np.float32)[..., 0]
    elif qtype == GGMLQuantizationType.Q4_0:
        offset = -8 * scale  # d * (q - 8) == d * q - 8 d exactly: both products fit float32
    else:
        offset = None
    return QuantizedWeight(bits, torch.from_numpy(codes), torch.from_numpy(scale),
                           None if offset is None else torch.from_numpy(offset))


def dequantize(weight: QuantizedWeight) -> torch.Tensor:
    """The float32 [rows, cols] values the kernel multiplies by (the reference for tests)."""
    rows, cols = weight.shape
    codes = weight.codes.view(rows, -1, BLOCK * weight.bits // 8)
    if weight.bits == 4:
        codes = torch.cat((codes & 0x0F, codes >> 4), dim=-1)
    else:
        codes = codes.view(torch.int8)
    values = weight.scale[..., None] * codes.float()
    if weight.offset is not None:
        values = values + weight.offset[..., None]
    return values.reshape(rows, cols)


def available() -> bool:
    return entry_points.library("quant_matmul") is not None


def usable(x: torch.Tensor) -> bool:
    """Whether `x @ weight.T` can take the kernel: a few float32 rows on a CPU."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and x.dim() == 2 and x.shape[0] <= MAX_ROWS


def quant_matmul(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None,
                 library: ctypes.CDLL | None = None) -> torch.Tensor:
    """x @ dequantize(weight).T + bias for float32 x [rows, cols] on a CPU (the op swarm::quant_matmul).
    library: another build of the kernel (tests pass its portable build)."""
    return ops.quant_matmul(x.contiguous(), weight.codes, weight.scale, weight.offset, weight.bits, bias,
                            library=library)
