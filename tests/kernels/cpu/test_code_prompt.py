"""The prompt kernel of code panels in integer products (csrc/code_prompt.c) against gguf's own quantizer: x
quantized by gguf.quants as Q8_0 and the weight dequantized by it, multiplied in float64; a row's bits its own, the
same in every build; and what it refuses."""
import gguf
import pytest
import torch

from kernels.cpu import code_matmul, code_prompt
from kernels.cpu.weight_set import WeightSet
from kernels.errors import KernelError
from tests.helpers import portable_kernels as portable
from tests.helpers.quant_weights import any_blocks, gguf_values, weight_of

pytestmark = pytest.mark.skipif(not code_prompt.available(), reason="no C compiler for the kernel")
ROW_COUNTS = [1, 2, 3, 5, 6, 7, 13, 96, 97, 200]   # each step shape, and past a task's 96 rows
Q8_0 = gguf.GGMLQuantizationType.Q8_0


def gguf_oracle(x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x as gguf quantizes and dequantizes it to Q8_0, times gguf's values of the weight, in float64."""
    rows = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(x.numpy(), Q8_0), Q8_0))
    exact = rows.double() @ gguf_values(weight).double().T
    return exact if bias is None else exact + bias.double()


def assert_near(got: torch.Tensor, exact: torch.Tensor) -> None:
    """float32 sums of exact integer products: within a few float32 roundings of the largest term"""
    assert ((got.double() - exact).abs() <= 1e-5 * exact.abs().max() + 1e-30).all()


@pytest.mark.parametrize("format", code_matmul.FORMATS)
def test_every_row_count_gets_ggufs_quantized_products(format):
    """37 outputs: a last panel of 5, an odd panel; 512 columns: 16 sub-blocks, two Q4_K super-blocks."""
    weight, _ = weight_of(format, cols=512)
    panels = code_matmul.pack(weight)
    bias = torch.randn(37, generator=torch.Generator().manual_seed(1))
    x = torch.randn(max(ROW_COUNTS), 512, generator=torch.Generator().manual_seed(2))
    together = code_prompt.linear(x, panels, format, 37, bias)
    assert_near(together, gguf_oracle(x, weight, bias))
    for rows in ROW_COUNTS:
        assert torch.equal(code_prompt.linear(x[-rows:], panels, format, 37, bias), together[-rows:]), rows
    assert_near(code_prompt.linear(x[:5], panels, format, 37), gguf_oracle(x[:5], weight))


@pytest.mark.parametrize("format", code_matmul.FORMATS)
def test_blocks_of_any_bytes_and_rows_of_any_size_get_ggufs_products(format):
    """Scales zero, subnormal, negative, tiny or huge; rows with a zero sub-block, a tiny one and a huge one."""
    weight = any_blocks(format, rows=21, cols=256 if format == "Q4_K" else 96, seed=5)
    x = torch.randn(6, weight.cols, generator=torch.Generator().manual_seed(6)) * 1e3
    x[1, :32] = 0.0
    x[2, 32:64] *= 1e-9
    got = code_prompt.linear(x, code_matmul.pack(weight), format, 21)
    assert_near(got, gguf_oracle(x, weight))


def test_several_weights_in_one_call_get_each_ones_own_bits():
    weights = [weight_of(format, rows=rows, cols=256)[0] for format, rows in (("Q4_1", 40), ("Q8_0", 16),
                                                                               ("Q4_K", 70))]
    panels = [code_matmul.pack(weight) for weight in weights]
    x = torch.randn(9, 256, generator=torch.Generator().manual_seed(3))
    formats, rows = [w.format for w in weights], [w.shape[0] for w in weights]
    biases = [None, torch.randn(16), None]
    outs = code_prompt.linear_many(x, panels, formats, rows, biases)
    for out, p, format, count, bias in zip(outs, panels, formats, rows, biases):
        assert torch.equal(out, code_prompt.linear(x, p, format, count, bias))


def test_a_rows_bits_do_not_depend_on_the_threads():
    weight, _ = weight_of("Q4_1", rows=100, cols=1024)
    panels = code_matmul.pack(weight)
    x = torch.randn(50, 1024, generator=torch.Generator().manual_seed(0))
    together = code_prompt.linear(x, panels, "Q4_1", 100)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(code_prompt.linear(x, panels, "Q4_1", 100), together)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("format", code_matmul.FORMATS)
def test_the_portable_build_gives_the_native_bits(format):
    weight, _ = weight_of(format, cols=512)
    panels = code_matmul.pack(weight)
    x = torch.randn(8, 512, generator=torch.Generator().manual_seed(4))
    plain = portable.portable_library("code_prompt")
    assert not code_prompt.native(plain)
    assert torch.equal(code_prompt.linear(x, panels, format, 37, library=plain),
                       code_prompt.linear(x, panels, format, 37))


def test_a_build_without_f16c_rounds_the_scales_to_float16_as_f16c_does():
    """Rows of every size of scale, from float16's subnormals past its largest finite value; the plain build
    without F16C rounds with frexpf and nearbyintf."""
    import ctypes

    from kernels.cpu import native
    from kernels.cpu.signatures import SIGNATURES, declare
    path = native.library_path("code_prompt", ("-O2", "-mno-avx2", "-mno-fma", "-mno-f16c"))
    if path is None:
        pytest.skip("no C compiler")
    plain = declare(ctypes.CDLL(str(path)), SIGNATURES["code_prompt"])
    weight, _ = weight_of("Q8_0", cols=256)
    panels = code_matmul.pack(weight)
    x = torch.randn(12, 256, generator=torch.Generator().manual_seed(8))
    x *= torch.logspace(-9, 7, 12)[:, None]   # max |x| / 127 from float16's subnormals to past 65504 (inf: nan)
    torch.testing.assert_close(code_prompt.linear(x, panels, "Q8_0", 37, library=plain),
                               code_prompt.linear(x, panels, "Q8_0", 37), rtol=0, atol=0, equal_nan=True)


def test_under_the_profiler_a_call_goes_through_the_op():
    weight, _ = weight_of("Q4_0", cols=256)
    panels = code_matmul.pack(weight)
    x = torch.randn(3, 256)
    with torch.profiler.profile() as profile:
        got = code_prompt.linear(x, panels, "Q4_0", 37)
    assert "swarm::code_prompt_many" in {event.name for event in profile.events()}
    assert torch.equal(got, code_prompt.linear(x, panels, "Q4_0", 37))


def test_panels_of_another_shape_and_columns_not_a_multiple_of_32_are_refused():
    weight, _ = weight_of("Q4_1", cols=256)
    panels = code_matmul.pack(weight)
    with pytest.raises(KernelError, match="panels"):
        code_prompt.linear(torch.randn(2, 256), panels, "Q4_1", 60)
    with pytest.raises(KernelError, match="multiple of 32"):
        code_prompt.linear(torch.randn(2, 250), panels, "Q4_1", 37)


@pytest.mark.parametrize("rows", [1, 2, 3, 8, 9])   # a decode step's rows, from the cells; past them, laid out
def test_a_weight_set_in_integer_products_gives_each_weight_the_kernels_bits(rows):
    weights = [weight_of(format, rows=count, cols=640, seed=count)[0] for format, count in (("Q4_0", 48),
                                                                                            ("Q8_0", 16),
                                                                                            ("Q4_1", 9))]
    biases = [torch.randn(48), None, torch.randn(9)]
    panels = [code_matmul.pack(weight) for weight in weights]
    x = torch.randn(rows, 640, generator=torch.Generator().manual_seed(rows))
    int8 = WeightSet(weights, biases, code_panels=panels, int8=True)
    got = int8(x)
    for out, weight, p, bias in zip(got, weights, panels, biases):
        assert torch.equal(out, code_prompt.linear(x, p, weight.format, weight.shape[0], bias))
        assert_near(out, gguf_oracle(x, weight, bias))
    with torch.profiler.profile() as watched:
        assert all(torch.equal(a, b) for a, b in zip(int8(x), got))
    assert "swarm::code_prompt_many" in {event.name for event in watched.events()}


def test_a_weight_set_in_integer_products_needs_code_panels():
    weight, _ = weight_of("Q4_1", cols=256)
    with pytest.raises(KernelError, match="int8"):
        WeightSet([weight], [None], int8=True)
