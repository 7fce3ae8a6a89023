"""QuantizedLinear and QuantizedEmbedding against gguf's own dequantizer followed by float math:
every block format, at row counts that take the C decode kernel and the scratch path."""
import pytest
import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as Q

from engine.quantized_layers import QuantizedEmbedding, QuantizedLinear
from kernels.cpu import quant_matmul
from kernels.reference.quant_blocks import QuantizedTensor
from kernels.reference.quant_matmul import DequantScratch
from tests.helpers.random_blocks import gguf_values, random_weight

FORMATS = [Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K]
ROW_COUNTS = [1, 7, quant_matmul.MAX_ROWS, quant_matmul.MAX_ROWS + 1, 130]


def weight(qtype: Q, rows: int = 40, cols: int = 512) -> tuple[QuantizedTensor, torch.Tensor]:
    """Fresh blocks and the float32 values gguf's dequantizer gives them."""
    blocks = random_weight(qtype.name, rows, cols, seed=0)
    return blocks, gguf_values(blocks)


@pytest.mark.parametrize("qtype", FORMATS, ids=lambda q: q.name)
@pytest.mark.parametrize("count", ROW_COUNTS)
def test_quantized_linear_multiplies_like_the_dequantized_weight(qtype, count):
    blocks, values = weight(qtype)
    bias = torch.randn(values.shape[0], generator=torch.Generator().manual_seed(2))
    layer = QuantizedLinear(blocks, bias, DequantScratch())
    x = torch.randn(count, values.shape[1], generator=torch.Generator().manual_seed(count))
    expected = (x.double() @ values.double().T + bias.double()).float()
    scale = values.abs().max().item() * x.abs().max().item()   # K-quant random blocks are large
    with torch.no_grad():
        torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5 * scale)


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_K], ids=lambda q: q.name)
def test_bfloat16_rows_multiply_through_the_scratch_in_bfloat16(qtype):
    blocks, values = weight(qtype)
    layer = QuantizedLinear(blocks, None, DequantScratch())
    x = torch.randn(5, values.shape[1], generator=torch.Generator().manual_seed(5)).to(torch.bfloat16)
    with torch.no_grad():
        out = layer(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, F.linear(x, values.to(torch.bfloat16)), rtol=2e-2, atol=2e-2 * values.abs().max())


@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q6_K], ids=lambda q: q.name)
def test_quantized_embedding_looks_up_the_dequantized_rows(qtype):
    blocks, values = weight(qtype)
    ids = torch.tensor([[3, 0, 39], [3, 3, 17]])
    embedded = QuantizedEmbedding(blocks, torch.float32)(ids)
    assert torch.equal(embedded, values[ids])
