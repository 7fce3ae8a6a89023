"""dequant_matmul against float64 `x @ W.T + bias`, W from gguf's own dequantizer, with tiles that
split the weight unevenly, a scratch shared by two weights, and an lm_head too big to hold as floats."""
import pytest
import torch
from torch.overrides import TorchFunctionMode

from kernels.reference import gguf_dequant
from kernels.reference.quant_blocks import KEPT_FORMATS, QuantizedTensor, row_bytes
from kernels.reference.quant_matmul import DEFAULT_TILE_BYTES, DequantScratch, dequant_matmul
from tests.helpers.random_blocks import gguf_values, random_weight

ROWS, COLS = 37, 512
TILE_ROWS = 10   # 37 rows: tiles of 10, 10, 10 and a partial 7


def gamma(n: int, unit: float) -> float:
    """The bound on the relative error of any order of n float additions with unit roundoff `unit`
    (Higham, Accuracy and Stability of Numerical Algorithms, 3.1)."""
    return n * unit / (1 - n * unit)


# |got - exact| <= relative * (|x| @ |W|.T + |bias|), element-wise, for x and bias exact in x's dtype.
# float32: W is gguf's float32 values exactly, so only the COLS products' sum and the bias add round.
# bfloat16: W is rounded to bfloat16 in the scratch (one unit roundoff, 2^-8), the GEMM accumulates
# in float32, then the product and the bias add are rounded to bfloat16 (two more): 3 units, plus the
# float32 sum's gamma; 4 units cover that and the second-order terms.
RELATIVE = {torch.float32: gamma(COLS + 1, 2.0**-24), torch.bfloat16: 4 * 2.0**-8}


def assert_within_bound(got: torch.Tensor, x: torch.Tensor, weight: QuantizedTensor, bias: torch.Tensor | None):
    w = gguf_values(weight).double()
    exact = x.double() @ w.T
    magnitude = x.double().abs() @ w.abs().T
    if bias is not None:
        exact, magnitude = exact + bias.double(), magnitude + bias.double().abs()
    assert got.dtype == x.dtype and got.shape == exact.shape
    excess = (got.double() - exact).abs() - RELATIVE[x.dtype] * magnitude
    assert excess.max().item() <= 0, f"exceeds the error bound by up to {excess.max().item():.3g}"


def inputs(dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(2, 3, COLS, generator=gen).to(dtype), torch.randn(ROWS, generator=gen).to(dtype)


@pytest.mark.parametrize("format", KEPT_FORMATS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_tiled_product_is_the_float64_product_within_the_rounding_bound(format, dtype):
    weight = random_weight(format, ROWS, COLS, seed=4)
    x, bias = inputs(dtype, seed=5)
    scratch = DequantScratch()
    tile_bytes = TILE_ROWS * COLS * x.element_size()
    got = dequant_matmul(x, weight, bias, scratch=scratch, tile_bytes=tile_bytes)
    assert got.shape == (2, 3, ROWS)
    assert_within_bound(got, x, weight, bias)
    assert scratch.nbytes == tile_bytes


def test_a_scratch_serves_two_weights_and_no_result_aliases_it():
    scratch = DequantScratch()
    tile_bytes = TILE_ROWS * COLS * 4
    big, small = random_weight("Q4_K", ROWS, COLS, seed=6), random_weight("Q8_0", 11, 256, seed=7)
    x_big, _ = inputs(torch.float32, seed=8)
    x_small = torch.randn(4, 256, generator=torch.Generator().manual_seed(9))
    y_big = dequant_matmul(x_big, big, scratch=scratch, tile_bytes=tile_bytes)
    y_small = dequant_matmul(x_small, small, scratch=scratch, tile_bytes=tile_bytes)  # one tile: all 11 rows
    assert scratch.nbytes == tile_bytes   # the second weight fit in the buffer the first one grew
    assert_within_bound(y_big, x_big, big, None)
    assert_within_bound(y_small, x_small, small, None)


def test_a_given_expansion_fills_each_tile_of_the_partition():
    weight = random_weight("Q5_K", ROWS, COLS, seed=10)
    x, bias = inputs(torch.float32, seed=11)
    expanded = []

    def recording(weight, rows, out):
        expanded.append(rows)
        return gguf_dequant.dequantize(weight, rows, out=out)

    got = dequant_matmul(x, weight, bias, tile_bytes=TILE_ROWS * COLS * 4, dequantize=recording)
    assert expanded == [(0, 10), (10, 20), (20, 30), (30, 37)]
    assert_within_bound(got, x, weight, bias)


def test_the_scratch_keeps_one_buffer_per_dtype_grown_on_demand():
    scratch = DequantScratch()
    first = scratch.take(2, 3, torch.float32, torch.device("cpu"))
    assert scratch.take(3, 2, torch.float32, torch.device("cpu")).data_ptr() == first.data_ptr()
    assert scratch.take(4, 5, torch.float32, torch.device("cpu")).shape == (4, 5)
    scratch.take(1, 2, torch.bfloat16, torch.device("cpu"))
    assert scratch.nbytes == 4 * 5 * 4 + 1 * 2 * 2


class LargestFloatTensor(TorchFunctionMode):
    """Records the bytes of the largest floating-point tensor any torch call returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        if isinstance(result, torch.Tensor) and result.is_floating_point():
            self.largest = max(self.largest, result.numel() * result.element_size())
        return result


def test_an_8b_lm_head_is_multiplied_without_a_float_copy_of_it(monkeypatch):
    """On the meta device (shapes, no data): Qwen3-8B's 151,936 x 4,096 Q4_K lm_head would take
    1.2 GB as bfloat16; no tensor of the product is larger than the default tile."""
    # Meta shape functions are slow: 16 MB float32 chunks (below the tile still) keep this under 2 s.
    monkeypatch.setattr(gguf_dequant, "CHUNK_VALUES", 1 << 22)
    rows, cols = 151_936, 4_096
    blocks = torch.empty(rows, row_bytes("Q4_K", cols), dtype=torch.uint8, device="meta")
    weight = QuantizedTensor(blocks, "Q4_K", cols)
    x = torch.empty(1, cols, dtype=torch.bfloat16, device="meta")
    scratch = DequantScratch()
    with LargestFloatTensor() as watch:
        logits = dequant_matmul(x, weight, scratch=scratch)
    assert logits.shape == (1, rows)
    assert scratch.nbytes <= DEFAULT_TILE_BYTES
    assert watch.largest <= DEFAULT_TILE_BYTES, f"a {watch.largest / 2**20:.0f} MiB float tensor"
