"""A WeightSet, the quantized weights of one x described to the kernel once, against quant_matmul(_many) of the
same weights: the same bits, the same refusals, and the op where torch is watching. With bfloat16 panels
(engine.packed_weights): the prompt kernel's bits, and its oracle's."""
import pytest
import torch

from kernels.cpu import bf16_matmul, quant_matmul
from kernels.cpu.weight_set import WeightSet
from kernels.errors import KernelError
from kernels.reference.bf16_matmul import bf16_matmul as bf16_oracle
from kernels.reference.quant_matmul import DequantScratch
from tests.helpers import portable_kernels as portable
from tests.helpers.random_blocks import gguf_values, random_weight

pytestmark = pytest.mark.skipif(not quant_matmul.available(), reason="no C compiler for the kernel")


def layer_weights():
    """q, k and v of one x in the formats a Q4_K_M file mixes, two with biases"""
    shapes = (("Q4_1", 70), ("Q6_K", 9), ("Q8_0", 33))
    weights = [random_weight(format, rows, 1536, seed=rows) for format, rows in shapes]
    return weights, [torch.randn(70), None, torch.randn(33)]


@pytest.mark.parametrize("rows", [1, 5, 64, 70])
def test_a_set_gives_the_bits_of_each_weight_alone_and_of_quant_matmul_many(rows):
    weights, biases = layer_weights()
    x = torch.randn(rows, 1536, generator=torch.Generator().manual_seed(rows))
    got = WeightSet(weights, biases)(x)
    assert [out.shape for out in got] == [(rows, 70), (rows, 9), (rows, 33)]
    assert all(torch.equal(a, b) for a, b in zip(got, quant_matmul.quant_matmul_many(x, weights, biases)))
    assert all(torch.equal(a, quant_matmul.quant_matmul(x, w, b)) for a, w, b in zip(got, weights, biases))


def test_a_set_of_one_weight_is_quant_matmul():
    weight = random_weight("Q4_K", 37, 256, seed=0)
    x = torch.randn(3, 256)
    (got,) = WeightSet([weight], [None])(x)
    assert torch.equal(got, quant_matmul.quant_matmul(x, weight))


def test_the_portable_build_of_the_set_gives_the_native_bits(tmp_path):
    weights, biases = layer_weights()
    x = torch.randn(13, 1536)
    plain = WeightSet(weights, biases, portable.portable_library("quant_matmul", tmp_path))(x)
    assert all(torch.equal(a, b) for a, b in zip(plain, WeightSet(weights, biases)(x)))


def test_a_weight_the_kernel_cannot_read_is_refused_when_the_set_is_made():
    weights, biases = layer_weights()
    with pytest.raises(KernelError, match=r"swarm::quant_matmul_many: bias must have shape \[9\]"):
        WeightSet(weights, [biases[0], torch.randn(5), biases[2]])


@pytest.mark.parametrize("x,message", [(torch.randn(2, 1535), r"x has 1535 columns, the weight 1536"),
                                       (torch.randn(2, 1536).double(), r"x must be torch.float32"),
                                       (torch.randn(1536, 2).T, r"x must be contiguous")])
def test_an_x_the_kernel_would_misread_is_refused(x, message):
    weights, biases = layer_weights()
    with pytest.raises(KernelError, match=rf"swarm::quant_matmul_many: {message}"):
        WeightSet(weights, biases)(x)


def test_under_the_profiler_a_set_runs_as_the_op_with_the_same_bits():
    weights, biases = layer_weights()
    weight_set, x = WeightSet(weights, biases), torch.randn(4, 1536)
    direct = weight_set(x)
    with torch.profiler.profile() as profiler:
        profiled = weight_set(x)
    assert "swarm::quant_matmul_many" in {event.name for event in profiler.events()}
    assert all(torch.equal(a, b) for a, b in zip(profiled, direct))


def test_under_the_profiler_a_set_of_one_weight_runs_as_quant_matmul():
    weight = random_weight("Q4_1", 37, 320, seed=0)
    x = torch.randn(1, 320)
    with torch.profiler.profile() as profiler:
        (profiled,) = WeightSet([weight], [None])(x)
    assert "swarm::quant_matmul" in {event.name for event in profiler.events()}
    assert torch.equal(profiled, quant_matmul.quant_matmul(x, weight))


def packed_layer():
    """q, k and v of one x with their bfloat16 panels (kernels.cpu.bf16_matmul.pack_quantized)"""
    weights, biases = layer_weights()
    return weights, biases, [bf16_matmul.pack_quantized(weight) for weight in weights]


@pytest.mark.parametrize("rows", [1, 6, 8, 13, 64])
def test_a_packed_set_gives_every_row_the_bits_of_the_prompt_kernel_and_its_oracle(rows):
    weights, biases, panels = packed_layer()
    x = torch.randn(rows, 1536, generator=torch.Generator().manual_seed(rows))
    got = WeightSet(weights, biases, bf16=True, panels=panels)(x)
    scratch = DequantScratch()
    for out, weight, bias in zip(got, weights, biases):
        assert torch.equal(out, bf16_matmul.quantized_linear(x, weight, bias, scratch))
        assert torch.equal(out, bf16_oracle(x, gguf_values(weight), bias))


def test_a_packed_rows_bits_do_not_depend_on_its_batch():
    weights, biases, panels = packed_layer()
    packed = WeightSet(weights, biases, bf16=True, panels=panels)
    x = torch.randn(9, 1536, generator=torch.Generator().manual_seed(0))
    together = packed(x)
    for row in (0, 4, 8):
        alone = packed(x[row:row + 1].contiguous())
        assert all(torch.equal(a[row], b[0]) for a, b in zip(together, alone))


def test_a_packed_set_through_the_portable_build_gives_the_native_bits(tmp_path):
    weights, biases, panels = packed_layer()
    x = torch.randn(5, 1536)
    plain = WeightSet(weights, biases, portable.portable_library("quant_matmul", tmp_path), bf16=True, panels=panels)
    assert all(torch.equal(a, b) for a, b in zip(plain(x), WeightSet(weights, biases, bf16=True, panels=panels)(x)))


def test_a_packed_set_goes_through_the_packed_op_where_torch_is_watching():
    weights, biases, panels = packed_layer()
    packed = WeightSet(weights, biases, bf16=True, panels=panels)
    x = torch.randn(3, 1536)
    with torch.profiler.profile() as watched:
        got = packed(x)
    assert any(event.name == "swarm::bf16_matmul" for event in watched.events())
    assert all(torch.equal(a, b) for a, b in zip(got, packed(x)))


@pytest.mark.parametrize("bad", ["float32 products", "another shape", "int64"])
def test_panels_the_kernel_would_misread_are_refused(bad):
    weights, biases, panels = packed_layer()
    if bad == "another shape":
        panels[1] = bf16_matmul.pack_quantized(weights[0])
    if bad == "int64":
        panels[2] = panels[2].long()
    with pytest.raises(KernelError, match=r"swarm::quant_matmul_many: panels must be each weight's bfloat16 panels"):
        WeightSet(weights, biases, bf16=bad != "float32 products", panels=panels)
