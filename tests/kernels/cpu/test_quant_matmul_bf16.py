"""The quantized decode kernel in bfloat16 products (csrc/quant_matmul_bf16.c) against its oracle
(kernels.reference.bf16_matmul.lanes_matmul) on gguf's own values of the blocks: the same bits in every format, at
every row count, in every build; a row's bits never depend on its batch; weight sets and their C callers take it."""
import pytest
import torch

from kernels.cpu import quant_matmul
from kernels.cpu.weight_set import WeightSet
from kernels.reference.bf16_matmul import lanes_matmul
from tests.helpers import portable_kernels as portable
from tests.helpers.quant_weights import FORMATS, K_QUANTS, any_blocks, gguf_values, weight_of

ROW_COUNTS = [1, 5, 8, 13, 64, 70]   # 64 and 70: past a pass of the kernel
pytestmark = pytest.mark.skipif(not quant_matmul.available(), reason="no C compiler for the kernel")


def bf16_product(x, weight, bias=None, library=None):
    return quant_matmul.quant_matmul_many(x, [weight], [bias], library, bf16=True)[0]


@pytest.mark.parametrize("format", FORMATS)
def test_every_row_count_gets_the_oracles_bits(format):
    """1,536 and 1,600 columns: the K axis in more than one span of the kernel; 64 and 70 rows: past a pass."""
    weight, values = weight_of(format, cols=1536 if format in K_QUANTS else 1600)
    bias = torch.randn(37, generator=torch.Generator().manual_seed(1))
    for rows in ROW_COUNTS:
        x = torch.randn(rows, weight.cols, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(bf16_product(x, weight, bias), lanes_matmul(x, values, bias)), rows


@pytest.mark.parametrize("format", FORMATS)
def test_blocks_of_any_bytes_get_the_oracles_bits(format):
    """Scales zero, subnormal, negative, tiny or huge: the products flush and overflow as vdpbf16ps does."""
    weight = any_blocks(format, rows=21, cols=512 if format in K_QUANTS else 96, seed=5)
    x = torch.randn(6, weight.cols, generator=torch.Generator().manual_seed(6)) * 1e3
    assert torch.equal(bf16_product(x, weight).view(torch.int32),
                       lanes_matmul(x, gguf_values(weight)).view(torch.int32))


def test_a_rows_bits_do_not_depend_on_its_batch_or_the_threads():
    weight, _ = weight_of("Q4_1", rows=45, cols=1600, seed=2)
    x = torch.randn(29, weight.cols, generator=torch.Generator().manual_seed(3))
    together = bf16_product(x, weight)
    assert torch.equal(torch.cat([bf16_product(x[i:i + 1], weight) for i in range(len(x))]), together)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(bf16_product(x, weight), together)
    finally:
        torch.set_num_threads(threads)


def test_a_weight_set_in_bfloat16_gives_each_weights_bits_as_one_call_and_float32_its_own():
    weights = [weight_of(format, rows=rows, cols=1536, seed=rows)[0]
               for format, rows in (("Q4_K", 70), ("Q6_K", 9), ("Q8_0", 33), ("Q4_1", 1))]
    biases = [torch.randn(70), None, torch.randn(33), None]
    x = torch.randn(8, 1536, generator=torch.Generator().manual_seed(8))
    in_bf16, in_f32 = WeightSet(weights, biases, bf16=True)(x), WeightSet(weights, biases)(x)
    for weight, bias, got, float32 in zip(weights, biases, in_bf16, in_f32):
        assert torch.equal(got, bf16_product(x, weight, bias))
        assert torch.equal(float32, quant_matmul.quant_matmul(x, weight, bias))
        assert not torch.equal(got, float32)


@pytest.mark.parametrize("build", ["portable", "avx2"])
def test_every_build_gives_the_oracles_bits(build):
    """Without AVX512-BF16 the same steps run in plain C."""
    library = (portable.portable_library if build == "portable" else portable.avx2_library)("quant_matmul_bf16")
    assert not quant_matmul.bf16_native(library)
    for format in FORMATS:
        weight, values = weight_of(format, rows=9, cols=512 if format in K_QUANTS else 320, seed=9)
        x = torch.randn(3, weight.cols, generator=torch.Generator().manual_seed(9))
        assert torch.equal(bf16_product(x, weight, None, library), lanes_matmul(x, values)), format
