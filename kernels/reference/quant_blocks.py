"""A weight kept in a GGUF block format (QuantizedTensor), and what each format's blocks hold.

A GGUF file stores a [rows, cols] matrix row by row; each row is a whole number of blocks, each block
`values` weights in `nbytes` bytes (Q4_K: 256 values in 144 bytes, 4.5 bits a weight). The engine keeps
those bytes as they are, one row of blocks per row of the weight, on whatever device it runs on, and
its kernels expand the blocks as they multiply. Rows are independent, so reordering rows reorders bytes.

    F32, F16, BF16          plain floats (a "block" of one value)
    Q8_0, Q4_0, Q4_1        32 values, an fp16 scale (and offset)
    Q5_0, Q5_1              32 values, 4 low bits + 1 high bit each
    Q4_K, Q5_K, Q6_K        256-value super-blocks of 8 or 16 sub-blocks with 6- or 8-bit scales
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# The formats the engine keeps as stored; a tensor in any other format is dequantized at load.
KEPT_FORMATS = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
FLOAT_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def block_layout(format: str) -> tuple[int, int]:
    """(values, bytes) of one block of `format`, a GGML type name such as "Q4_K"."""
    return GGML_QUANT_SIZES[GGMLQuantizationType[format]]


def row_bytes(format: str, cols: int) -> int:
    """Bytes one row of `cols` values takes in `format`."""
    values, nbytes = block_layout(format)
    assert cols % values == 0, f"a {format} row holds whole blocks of {values} values, not {cols}"
    return cols // values * nbytes


@dataclass(frozen=True, slots=True)
class QuantizedTensor:
    """A [rows, cols] weight as its file stores it: `blocks` is uint8 [rows, row_bytes(format, cols)]."""

    blocks: torch.Tensor
    format: str
    cols: int

    def __post_init__(self):
        assert self.format in KEPT_FORMATS, f"{self.format} is not a format the engine keeps"
        assert self.blocks.dtype == torch.uint8 and self.blocks.dim() == 2, "blocks: uint8 [rows, row bytes]"
        assert self.blocks.shape[1] == row_bytes(self.format, self.cols), "the blocks are another shape's"

    @classmethod
    def from_file_bytes(cls, raw: np.ndarray, format: str, cols: int) -> QuantizedTensor:
        """A copy of `raw` (uint8, any shape whose rows are the weight's rows, such as a view of a
        memory-mapped file) that owns its memory."""
        rows = raw.size // row_bytes(format, cols)
        return cls(torch.from_numpy(np.array(raw, dtype=np.uint8, copy=True).reshape(rows, -1)), format, cols)

    @property
    def shape(self) -> tuple[int, int]:
        return self.blocks.shape[0], self.cols

    @property
    def nbytes(self) -> int:
        return self.blocks.numel()

    @property
    def device(self) -> torch.device:
        return self.blocks.device

    def rows(self, order: torch.Tensor) -> QuantizedTensor:
        """The same weight with its rows in `order` (a permutation or any selection of row indices)."""
        return QuantizedTensor(self.blocks[order.to(self.blocks.device)].contiguous(), self.format, self.cols)

    def to(self, device: torch.device | str) -> QuantizedTensor:
        return QuantizedTensor(self.blocks.to(device).contiguous(), self.format, self.cols)
