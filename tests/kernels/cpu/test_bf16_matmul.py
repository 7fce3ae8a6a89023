"""kernels/cpu/bf16_matmul.py and csrc/bf16_matmul.c: the bits of the PyTorch oracle (kernels/reference/bf16_matmul.py)
in the AVX512-BF16 build and the plain one alike, whatever the shapes and the rows batched together; the oracle
itself against float64 sums of the same bfloat16 inputs; refusals of bad arguments."""
import pytest
import torch

from kernels.cpu import bf16_matmul, entry_points, ops
from kernels.errors import KernelError
from kernels.reference.bf16_matmul import bf16_matmul as oracle
from kernels.reference.quant_matmul import DequantScratch
from tests.helpers.portable_kernels import portable_library, widest_library
from tests.helpers.random_blocks import gguf_values, random_weight

pytestmark = pytest.mark.skipif(not bf16_matmul.available(), reason="no C compiler for the kernels")
SHAPES = [(1, 2, 1), (5, 33, 17), (6, 64, 64), (13, 70, 130), (97, 96, 200), (200, 576, 65)]   # (M, K, N)


def builds() -> dict:
    return {"native": widest_library("bf16_matmul"), "plain": portable_library("bf16_matmul")}


def random(*shape, seed: int, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def test_the_plain_build_is_plain_and_the_native_one_is_native_where_the_cpu_has_avx512_bf16():
    assert not bf16_matmul.native(builds()["plain"])
    from kernels.cpu import native
    assert bf16_matmul.native(builds()["native"]) == ("avx512_bf16" in native._cpu_flags().split())


@pytest.mark.parametrize("build", ["native", "plain"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("with_bias", [False, True])
def test_every_build_gives_the_oracles_bits(build, shape, with_bias):
    m, k, n = shape
    x, w = random(m, k, seed=m), random(n, k, seed=n)
    bias = random(n, seed=k) if with_bias else None
    assert torch.equal(bf16_matmul.linear(x, w, bias, library=builds()[build]), oracle(x, w, bias))


@pytest.mark.parametrize("build", ["native", "plain"])
def test_values_below_the_smallest_normal_are_flushed_as_the_instructions_flush_them(build):
    x = random(9, 40, seed=1, scale=1e-19)    # products and partial sums on both sides of 2^-126
    x[0, :8] = torch.tensor([1e-39, -1e-39, 5e-40, 2e-38, -3e-45, 1.2e-38, 1.1e-38, 0.0])
    w = random(20, 40, seed=2, scale=1e-18)
    got = bf16_matmul.linear(x, w, library=builds()[build])
    assert torch.equal(got, oracle(x, w))
    unflushed = x.bfloat16().float() @ w.bfloat16().float().T
    assert (got != 0).any() and not torch.equal(got, unflushed)


def test_a_rows_bits_do_not_depend_on_the_rows_beside_it():
    x, w = random(300, 576, seed=3), random(200, 576, seed=4)
    together = bf16_matmul.linear(x, w)
    for first, count in [(0, 1), (299, 1), (7, 5), (100, 96), (1, 298)]:
        assert torch.equal(bf16_matmul.linear(x[first:first + count], w), together[first:first + count])


def test_the_oracle_sums_the_bfloat16_products_in_float32():
    x, w = random(64, 1536, seed=5), random(96, 1536, seed=6)
    exact = x.bfloat16().double() @ w.bfloat16().double().T
    got = oracle(x, w).double()
    assert (got - exact).abs().max() <= 1e-5 * exact.abs().max()
    assert (got - x.double() @ w.double().T).abs().max() > 1e-3 * exact.abs().max()   # the rounding is there


@pytest.mark.parametrize("tile_bytes", [64 * 768 * 4, 100 * 768 * 4, 32 << 20])
@pytest.mark.parametrize("expanded_by", ["the C code", "a given expander"])
@pytest.mark.parametrize("format", ["Q4_1", "Q6_K", "Q8_0"])
def test_a_quantized_weight_in_tiles_gives_the_oracles_bits_on_its_values(tile_bytes, expanded_by, format):
    weight = random_weight(format, 200, 768, seed=7)
    x, bias = random(2, 50, 768, seed=8), random(200, seed=9)
    expand = None if expanded_by == "the C code" else (
        lambda w, rows, out: out.copy_(gguf_values(w)[rows[0]:rows[1]]))
    got = bf16_matmul.quantized_linear(x, weight, bias, DequantScratch(), expand, tile_bytes=tile_bytes)
    assert got.shape == (2, 50, 200)
    assert torch.equal(got.reshape(100, 200), oracle(x.reshape(100, 768), gguf_values(weight), bias))


def test_bad_arguments_are_refused_with_the_argument_named():
    x, w = random(4, 64, seed=10), random(32, 64, seed=11)
    pairs = ops.bf16_round_rows(x)
    panels = torch.empty(entry_points.bf16_panels_shape(32, 64), dtype=torch.int32)
    ops.bf16_pack_weight(w, panels)
    out = torch.empty(4, 40)
    with pytest.raises(KernelError, match="pairs"):
        ops.bf16_matmul(pairs.float(), panels, 32, None, out, 0)
    with pytest.raises(KernelError, match="panels"):
        ops.bf16_matmul(pairs, panels, 40, None, out, 0)
    with pytest.raises(KernelError, match="out"):
        ops.bf16_matmul(pairs, panels, 32, None, out, 9)
    with pytest.raises(KernelError, match="bias"):
        ops.bf16_matmul(pairs, panels, 32, torch.zeros(31), out, 0)
    with pytest.raises(KernelError, match="out"):
        ops.bf16_pack_weight(w, torch.empty(2, 32, 16))
    with pytest.raises(KernelError, match="format"):
        ops.bf16_pack_quant(torch.zeros(32, 36, dtype=torch.uint8), "Q3_K", 64, panels)
    ops.bf16_matmul(pairs, panels, 32, None, out, 8)
    assert torch.equal(out[:, 8:], oracle(x, w))
