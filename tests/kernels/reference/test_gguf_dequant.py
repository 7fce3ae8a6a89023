"""dequantize and dequantize_rows against gguf's own dequantizer, bit for bit, on fresh random blocks
of every kept format."""
import pytest
import torch

from kernels.reference import gguf_dequant
from kernels.reference.gguf_dequant import dequantize, dequantize_rows
from kernels.reference.quant_blocks import KEPT_FORMATS
from tests.helpers.random_blocks import SHAPES, gguf_values, random_weight

ROWS = 37   # odd, so no row count of a power of two hides a stride mistake
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BITS = {torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16}


def assert_same_bits(got: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal as bit patterns (so -0.0 is not 0.0), after checking dtype and shape."""
    assert got.dtype == expected.dtype and got.shape == expected.shape
    mismatched = (got.view(BITS[got.dtype]) != expected.view(BITS[expected.dtype])).sum().item()
    assert mismatched == 0, f"{mismatched} of {got.numel()} values differ"


@pytest.mark.parametrize("format, cols", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_values_are_gguf_bit_for_bit_and_its_cast_in_narrow_dtypes(format, cols, dtype):
    weight = random_weight(format, ROWS, cols, seed=cols)
    assert_same_bits(dequantize(weight, dtype=dtype), gguf_values(weight).to(dtype))


@pytest.mark.parametrize("format", KEPT_FORMATS)
def test_a_row_range_fills_a_strided_view_of_a_scratch_and_nothing_else(format, monkeypatch):
    monkeypatch.setattr(gguf_dequant, "CHUNK_VALUES", 4 * 256)  # 4-row chunks: 5 of them, the last partial
    weight = random_weight(format, ROWS, 256, seed=1)
    scratch = torch.full((30, 300), float("nan"), dtype=torch.bfloat16)
    view = scratch[3:3 + 17, 40:40 + 256]
    returned = dequantize(weight, rows=(9, 26), out=view)
    assert returned.data_ptr() == view.data_ptr()
    assert_same_bits(view, gguf_values(weight)[9:26].to(torch.bfloat16))
    untouched = torch.ones_like(scratch, dtype=torch.bool)
    untouched[3:20, 40:296] = False
    assert scratch[untouched].isnan().all()


def test_an_empty_row_range_is_an_empty_tensor():
    weight = random_weight("Q4_K", ROWS, 256, seed=2)
    assert dequantize(weight, rows=(5, 5)).shape == (0, 256)


@pytest.mark.parametrize("format", KEPT_FORMATS)
def test_rows_by_id_are_an_embedding_lookup(format):
    weight = random_weight(format, ROWS, 256, seed=3)
    ids = torch.tensor([[3, 36, 3], [0, 17, 17]])
    got = dequantize_rows(weight, ids, torch.float16)
    assert got.shape == (2, 3, 256)
    assert_same_bits(got, gguf_values(weight)[ids].to(torch.float16))
