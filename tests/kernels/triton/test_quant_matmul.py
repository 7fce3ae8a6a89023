"""The Triton matmuls from GGUF blocks against an oracle none of us wrote: gguf's own dequantizer
(gguf.quants.dequantize) and a float64 matmul, with fresh random blocks per case (gguf's quantizer
where it has one, random bytes with sane fp16 scales for the K-quants).

Without a GPU they run under TRITON_INTERPRET=1 on CPU tensors; with one, compiled on CUDA tensors.
"""
import pytest
import torch

pytest.importorskip("triton")

from kernels.errors import KernelError  # noqa: E402
from kernels.triton import quant_matmul as qm  # noqa: E402
from tests.helpers.random_blocks import gguf_values, random_weight  # noqa: E402

# tests/kernels/conftest.py sets TRITON_INTERPRET=1 where there is no GPU
DEVICE = "cpu" if qm.INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                reason="TRITON_INTERPRET=0 needs a GPU")

FORMATS = list(qm.KERNEL_FORMATS)
K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")
COLS = {"Q4_K": 512, "Q5_K": 256, "Q6_K": 512} | {f: 96 for f in FORMATS if f not in K_QUANTS} | {"F16": 64}
ROWS = 37                   # rows of W (N): not a multiple of any tile
# Unit roundoffs. Every kernel sums K exact-or-rounded float32 products (+ the bias) in some order,
# which is off by at most (K + 2) u32 * sum |x w| (the classic bound for any summation order);
# the output's rounding to x's dtype adds u_out * |result|. The prefill kernel also rounds each
# weight to x's dtype before tl.dot (u_w * sum |x w|). The x values themselves are the oracle's.
# bfloat16 allows a whole ulp, not half: the interpreter truncates float32 to bfloat16.
U32 = 2.0 ** -24
UNIT = {torch.float32: 0.0, torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -7}
_case_seed = iter(range(10_000))


def fresh_weight(format: str, cols: int, rows: int = ROWS):
    """(a weight of random blocks on DEVICE, gguf's values of it in float64)."""
    weight = random_weight(format, rows, cols, next(_case_seed))
    return weight.to(DEVICE), gguf_values(weight).double()


def fresh(*shape, dtype=torch.float32):
    gen = torch.Generator().manual_seed(next(_case_seed))
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


def assert_matches_oracle(out, x, values, bias=None, weights_rounded=False):
    """out against x @ values.T + bias in float64, within the bound in the comment at UNIT."""
    x64 = x.double().cpu()
    bias64 = torch.zeros(values.shape[0], dtype=torch.float64) if bias is None else bias.double().cpu()
    exact = x64 @ values.T + bias64
    magnitude = x64.abs() @ values.abs().T + bias64.abs()
    u_out, u_w = UNIT[x.dtype], UNIT[x.dtype] if weights_rounded else 0.0
    summed = ((x.shape[1] + 2) * U32 + u_w) * magnitude
    allowed = 1.01 * (summed * (1 + u_out) + u_out * exact.abs()) + 2.0 ** -24
    error = (out.double().cpu() - exact).abs()
    assert out.dtype == x.dtype and out.shape == exact.shape
    worst = (error / allowed).max().item()
    assert worst <= 1, f"error {worst:.2f} x the allowed bound"


@pytest.mark.parametrize("format", FORMATS)
def test_dequantize_gives_ggufs_values_exactly(format):
    weight, values = fresh_weight(format, COLS[format])
    assert torch.equal(qm.dequantize(weight).cpu().double(), values)


@pytest.mark.parametrize("format", ["Q6_K", "Q4_1", "F16"])
def test_dequantize_into_a_scratch_rounds_each_value_once(format):
    weight, values = fresh_weight(format, COLS[format])
    scratch = torch.full(weight.shape, float("nan"), dtype=torch.float16, device=DEVICE)
    assert qm.dequantize(weight, out=scratch) is scratch
    assert torch.equal(scratch.cpu(), values.float().half())      # float32 values, rounded once to fp16
    with pytest.raises(KernelError, match="expected floats"):
        qm.dequantize(weight, out=scratch[1:])


@pytest.mark.parametrize("rows", [1, 3, 16])
@pytest.mark.parametrize("format", FORMATS)
def test_decode_matches_the_oracle(format, rows):
    weight, values = fresh_weight(format, COLS[format])
    x, bias = fresh(rows, COLS[format]), (fresh(ROWS) if rows > 1 else None)
    out = qm.quant_matmul(x, weight, bias)
    assert_matches_oracle(out, x, values, bias)


@pytest.mark.parametrize("rows", [17, 40])
@pytest.mark.parametrize("format", FORMATS)
def test_prefill_matches_the_oracle(format, rows):
    weight, values = fresh_weight(format, COLS[format])
    x, bias = fresh(rows, COLS[format]), fresh(ROWS)
    assert_matches_oracle(qm.quant_matmul(x, weight, bias), x, values, bias)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("format", ["Q4_K", "Q6_K", "Q5_1"])
def test_16_bit_x_gives_16_bit_results_within_their_rounding(format, dtype):
    weight, values = fresh_weight(format, COLS[format], rows=64)
    bias = fresh(64, dtype=dtype)
    for rows in (5, 33):
        x = fresh(rows, COLS[format], dtype=dtype)
        out = qm.quant_matmul(x, weight, bias)
        assert_matches_oracle(out, x, values, bias, weights_rounded=rows > qm.DECODE_ROWS)


def test_a_rows_result_depends_neither_on_its_neighbours_nor_on_the_batch_size():
    weight, _ = fresh_weight("Q4_K", 512, rows=64)
    x = fresh(16, 512)
    with_others = x.clone()
    with_others[1:] = fresh(15, 512)
    full = qm.quant_matmul(x, weight)
    assert torch.equal(qm.quant_matmul(with_others, weight)[0], full[0])
    # the interpreter's tl.dot is numpy's matmul, whose BLAS picks its summation order by the row count
    # on some CPUs (OpenBLAS on this AMD EPYC: 1-3 rows differ from 16 in the last bits): exact on a GPU only
    for rows in (1, 2, 3):
        part = qm.quant_matmul(x[:rows], weight)
        if qm.INTERPRETED:
            torch.testing.assert_close(part, full[:rows], rtol=1e-5, atol=1e-4, msg=f"{rows} rows")
        else:
            assert torch.equal(part, full[:rows]), f"{rows} rows"


def test_decode_split_across_programs_matches_the_oracle_and_repeats_exactly():
    weight, values = fresh_weight("Q5_K", 512)
    x, bias = fresh(3, 512), fresh(ROWS)
    out = qm.decode_matmul(x, weight, bias, num_splits=3)
    assert_matches_oracle(out, x, values, bias)
    assert torch.equal(qm.decode_matmul(x, weight, bias, num_splits=3), out)


def test_either_kernel_takes_strided_x_and_any_row_count():
    weight, values = fresh_weight("Q4_0", 256)
    wide = fresh(20, 512)
    x = wide[:, ::2]
    for out in (qm.decode_matmul(x[:7], weight), qm.prefill_matmul(x[:7], weight), qm.prefill_matmul(x, weight)):
        assert_matches_oracle(out, x[:out.shape[0]], values)
    assert qm.quant_matmul(x[:0], weight).shape == (0, ROWS)


@pytest.mark.parametrize("format", ["F16", "BF16", "F32"])
def test_float_weights_are_a_plain_matmul(format):
    weight, values = fresh_weight(format, 64)
    x = fresh(3, 64)
    assert_matches_oracle(qm.quant_matmul(x, weight), x, values)


def test_supports_names_the_block_formats_and_the_floats():
    assert all(qm.supports(f) for f in FORMATS + ["F32", "F16", "BF16"])
    assert not qm.supports("Q2_K") and not qm.supports("IQ4_XS")


@pytest.mark.parametrize("bad, message", [
    (dict(x=torch.zeros(2, 64)), "takes \\[rows, 96\\]"),
    (dict(x=torch.zeros(2, 96, dtype=torch.int32)), "float16, bfloat16 or float32"),
    (dict(bias=torch.zeros(5)), "expected floats \\[37\\]"),
])
def test_inputs_a_caller_got_wrong_are_named(bad, message):
    weight, _ = fresh_weight("Q8_0", 96)
    args = dict(x=torch.zeros(2, 96), bias=None) | bad
    with pytest.raises(KernelError, match=message):
        qm.quant_matmul(args["x"].to(DEVICE), weight, None if args["bias"] is None else args["bias"].to(DEVICE))


def test_the_decode_kernel_refuses_more_rows_than_it_takes():
    weight, _ = fresh_weight("Q8_0", 96)
    with pytest.raises(KernelError, match="at most 16"):
        qm.decode_matmul(fresh(qm.DECODE_ROWS + 1, 96), weight)


def test_the_bench_times_every_kernel_on_tiny_shapes():
    from kernels.triton.quant_bench import bench

    timings = bench(tiny=True)
    assert {t.kernel for t in timings} == {"decode", "prefill", "dense"}
    assert all(t.microseconds > 0 and t.gigabytes_per_second > 0 for t in timings)
