"""The code kernel's oracle reads a quantized weight's codes and scales so that a * code + c is gguf's own value
(gguf.quants.dequantize) in each format, exactly (as numbers: Q4_0's d * (8 - 8) is -0 where d < 0, d * 8 - 8 d
is +0)."""
import pytest
import torch

from kernels.reference.code_matmul import codes_and_scales
from tests.helpers.quant_weights import any_blocks, gguf_values, weight_of


@pytest.mark.parametrize("format", ["Q4_0", "Q4_1", "Q4_K", "Q8_0"])
def test_codes_and_scales_give_ggufs_values(format):
    for weight in (weight_of(format, cols=512)[0], any_blocks(format, rows=9, cols=256, seed=3)):
        codes, a, c = codes_and_scales(weight)
        low, high = (-128, 127) if format == "Q8_0" else (0, 15)
        assert codes.min() >= low and codes.max() <= high
        values = a.repeat_interleave(32, dim=1) * codes.float() + c.repeat_interleave(32, dim=1)
        assert torch.equal(values, gguf_values(weight))
