"""Fresh random weights in every kept GGUF format, and the float values gguf's own dequantizer gives
them: the oracle the dequantize and matmul tests of kernels/ compare against.

Formats gguf can quantize are quantized from random normal floats; K-quants, which gguf can only
dequantize, are random bytes with small finite fp16 scales (tiny_gguf.random_k_blocks).
"""
from __future__ import annotations

import gguf
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from kernels.reference.quant_blocks import KEPT_FORMATS, QuantizedTensor, block_layout
from tests.helpers.tiny_gguf import DEQUANTIZE_ONLY, random_k_blocks

# (format, cols) worth testing: 256 and 512 for all, 96 (not a whole super-block) where a block is smaller.
SHAPES = [(format, cols) for format in KEPT_FORMATS for cols in (256, 512)] + [
    (format, 96) for format in KEPT_FORMATS if block_layout(format)[0] <= 32]


def random_weight(format: str, rows: int, cols: int, seed: int) -> QuantizedTensor:
    """A [rows, cols] weight of fresh random blocks in `format`."""
    rng = np.random.default_rng(seed)
    qtype = Q[format]
    if qtype in DEQUANTIZE_ONLY:
        raw = random_k_blocks(rows, cols, qtype, rng)
    else:
        values = rng.standard_normal((rows, cols)).astype(np.float32)
        raw = np.ascontiguousarray(gguf.quants.quantize(values, qtype)).view(np.uint8)
    return QuantizedTensor(torch.from_numpy(raw.copy()), format, cols)


def gguf_values(weight: QuantizedTensor) -> torch.Tensor:
    """float32 [rows, cols]: gguf.quants.dequantize on the weight's bytes."""
    raw = weight.blocks.cpu().numpy()
    return torch.from_numpy(gguf.quants.dequantize(raw, Q[weight.format]).astype(np.float32, copy=True))
