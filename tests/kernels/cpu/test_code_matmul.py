"""The decode kernel of code panels (csrc/code_matmul.c) against its oracle (kernels.reference.code_matmul): the
same bits for every format and row count, in every build and through weight sets, a row's bits its own; and the
panels it refuses."""
import pytest
import torch

from kernels.cpu import code_matmul
from kernels.cpu.weight_set import WeightSet
from kernels.errors import KernelError
from kernels.reference.code_matmul import code_matmul as oracle
from tests.helpers import portable_kernels as portable
from tests.helpers.quant_weights import any_blocks, gguf_values, weight_of

pytestmark = pytest.mark.skipif(not code_matmul.available(), reason="no C compiler for the kernel")
ROW_COUNTS = [1, 2, 3, 4, 5, 8, 13, 64]   # each tile shape of the kernel, and past a pass of 8 rows


@pytest.mark.parametrize("format", code_matmul.FORMATS)
def test_every_row_count_gets_the_oracles_bits(format):
    """37 rows: a last panel of 5; 512 columns: 16 sub-blocks, two Q4_K super-blocks."""
    weight, _ = weight_of(format, cols=512)
    panels = code_matmul.pack(weight)
    bias = torch.randn(37, generator=torch.Generator().manual_seed(1))
    for rows in ROW_COUNTS:
        x = torch.randn(rows, 512, generator=torch.Generator().manual_seed(rows))
        assert torch.equal(code_matmul.matmul(x, panels, format, 37, bias), oracle(x, weight, bias)), rows
        assert torch.equal(code_matmul.matmul(x, panels, format, 37), oracle(x, weight)), rows


@pytest.mark.parametrize("format", code_matmul.FORMATS)
def test_blocks_of_any_bytes_get_the_oracles_bits_and_stay_near_float32(format):
    """Scales zero, subnormal, negative, tiny or huge; x large: sums flush and round as vdpbf16ps's."""
    weight = any_blocks(format, rows=21, cols=256 if format == "Q4_K" else 96, seed=5)
    x = torch.randn(6, weight.cols, generator=torch.Generator().manual_seed(6)) * 1e3
    got = code_matmul.matmul(x, code_matmul.pack(weight), format, 21)
    assert torch.equal(got.view(torch.int32), oracle(x, weight).view(torch.int32))
    exact = x.double() @ gguf_values(weight).double().T
    assert ((got.double() - exact).abs() <= 1e-2 * exact.abs().max() + 1e-30).all()   # bfloat16 x: 2^-9 apart


def test_a_rows_bits_do_not_depend_on_its_batch_or_the_threads():
    weight, _ = weight_of("Q4_1", rows=100, cols=1024)
    panels = code_matmul.pack(weight)
    x = torch.randn(11, 1024, generator=torch.Generator().manual_seed(0))
    together = code_matmul.matmul(x, panels, "Q4_1", 100)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        for row in (0, 5, 10):
            assert torch.equal(code_matmul.matmul(x[row:row + 1], panels, "Q4_1", 100)[0], together[row])
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("format", ["Q4_K", "Q8_0"])
def test_the_portable_build_gives_the_native_bits(format):
    weight, _ = weight_of(format, cols=512)
    panels = code_matmul.pack(weight)
    x = torch.randn(5, 512)
    plain = portable.portable_library("code_matmul")
    assert not code_matmul.native(plain)
    assert torch.equal(code_matmul.pack(weight, plain), panels)
    assert torch.equal(code_matmul.matmul(x, panels, format, 37, library=plain),
                       code_matmul.matmul(x, panels, format, 37))


def code_set():
    """q, k and v of one x in three formats, each with its code panels"""
    weights = [weight_of(format, rows=rows, cols=640, seed=rows)[0]
               for format, rows in (("Q4_0", 48), ("Q8_0", 16), ("Q4_1", 9))]
    biases = [torch.randn(48), None, torch.randn(9)]
    return weights, biases, [code_matmul.pack(weight) for weight in weights]


@pytest.mark.parametrize("rows", [1, 8, 13])
def test_a_set_of_code_panels_gives_each_weight_its_own_bits(rows):
    weights, biases, panels = code_set()
    x = torch.randn(rows, 640, generator=torch.Generator().manual_seed(rows))
    got = WeightSet(weights, biases, bf16=True, code_panels=panels)(x)
    for out, weight, bias in zip(got, weights, biases):
        assert torch.equal(out, oracle(x, weight, bias))


def test_a_set_through_the_portable_build_gives_the_native_bits():
    weights, biases, panels = code_set()
    x = torch.randn(3, 640)
    plain = WeightSet(weights, biases, portable.portable_library("quant_matmul"), bf16=True, code_panels=panels)(x)
    native = WeightSet(weights, biases, bf16=True, code_panels=panels)(x)
    assert all(torch.equal(a, b) for a, b in zip(plain, native))


def test_where_torch_is_watching_a_set_goes_through_the_op_with_the_same_bits():
    weights, biases, panels = code_set()
    codes = WeightSet(weights, biases, bf16=True, code_panels=panels)
    x = torch.randn(2, 640)
    with torch.profiler.profile() as watched:
        got = codes(x)
    assert any(event.name == "swarm::code_matmul" for event in watched.events())
    assert all(torch.equal(a, b) for a, b in zip(got, codes(x)))


@pytest.mark.parametrize("bad", ["float32 products", "another weight's", "int32"])
def test_panels_the_kernel_would_misread_are_refused(bad):
    weights, biases, panels = code_set()
    if bad == "another weight's":
        panels[2] = panels[0]
    if bad == "int32":
        panels[0] = panels[0].view(torch.int32)
    message = "code_panels need bfloat16 or integer products" if bad == "float32 products" else "panels must"
    with pytest.raises(KernelError, match=rf"swarm::(quant_matmul_many|code_matmul): {message}"):
        WeightSet(weights, biases, bf16=bad != "float32 products", code_panels=panels)


def test_a_format_without_integer_codes_a_sub_block_is_refused_when_packed():
    weight, _ = weight_of("Q6_K", cols=256)
    assert not code_matmul.packable(weight)
    with pytest.raises(KernelError, match=r"swarm::code_pack: weight must be Q4_0, Q4_1, Q4_K, Q8_0"):
        code_matmul.pack(weight)
