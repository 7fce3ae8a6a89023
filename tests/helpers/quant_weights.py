"""Quantized weights for the kernels' tests: a file's blocks, made by gguf's own quantizer (Q8_0, Q4_0, Q4_1, Q5_0,
Q5_1) or of random bytes with sane fp16 scales for the K-quants it cannot make, with gguf's float32 values of them;
and blocks of any bytes, their fp16 fields at the edges."""
import functools

import gguf.quants
import numpy as np
import torch
from gguf import GGMLQuantizationType as Q

from kernels.cpu import quant_matmul
from kernels.reference.quant_blocks import QuantizedTensor, block_layout
from tests.helpers.tiny_gguf import K_SCALE_OFFSETS, random_k_blocks

FORMATS = quant_matmul.FORMATS
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")


@functools.cache
def weight_of(format: str, rows: int = 37, cols: int = 320, seed: int = 0) -> tuple[QuantizedTensor, torch.Tensor]:
    """A weight's blocks and gguf's float32 values of them."""
    rng = np.random.default_rng(seed)
    if format in K_QUANTS:
        raw = random_k_blocks(rows, cols, Q[format], rng)
    else:
        raw = gguf.quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), Q[format])
    values = torch.from_numpy(gguf.quants.dequantize(raw, Q[format]))
    return QuantizedTensor(torch.from_numpy(raw), format, cols), values


def fp16_fields(format: str) -> tuple[int, ...]:
    """Byte offsets of a block's fp16 scale and offset (ggml-common.h)."""
    return tuple(K_SCALE_OFFSETS[Q[format]]) if format in K_QUANTS else (0, 2) if format in ("Q4_1", "Q5_1") else (0,)


def any_blocks(format: str, rows: int, cols: int, seed: int) -> QuantizedTensor:
    """Random bytes, each fp16 field zero, subnormal, negative, tiny or large (no inf or nan)."""
    rng = np.random.default_rng(seed)
    values, nbytes = block_layout(format)
    blocks = rng.integers(0, 256, size=(rows * cols // values, nbytes), dtype=np.uint8)
    specials = np.array([0.0, -0.0, 3e-8, -2e-6, 1e-3, -0.5, 7.0, 65504.0, -65504.0], np.float16)
    for offset in fp16_fields(format):
        blocks[:, offset:offset + 2] = rng.choice(specials, len(blocks)).view(np.uint8).reshape(-1, 2)
    return QuantizedTensor(torch.from_numpy(blocks.reshape(rows, -1)), format, cols)


def gguf_values(weight: QuantizedTensor) -> torch.Tensor:
    return torch.from_numpy(gguf.quants.dequantize(weight.blocks.numpy(), Q[weight.format]))
