"""The quantized kernel against the gguf package. The blocks are a file's bytes: gguf's own quantizer makes them
(Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), or random bytes with sane fp16 scales do for the K-quants it cannot make; gguf's
dequantizer gives the float32 weights the products are checked against (in float64) and the expansion bit for bit."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kernels.cpu import native, quant_matmul
from kernels.errors import KernelError
from tests.helpers import portable_kernels as portable
from tests.helpers.quant_weights import FORMATS, K_QUANTS, any_blocks, gguf_values, weight_of

pytestmark = pytest.mark.skipif(not quant_matmul.available(), reason="no C compiler for the kernel")
# (format, K): K-quants hold 256-value blocks; 1600 and 1536 take the kernel's K axis in spans
DEPTHS = [(f, k) for f in FORMATS for k in ((256, 1536) if f in K_QUANTS else (96, 320, 1600))]
ROW_COUNTS = [1, 5, 8, 13, 64, 70]
ROOT = Path(__file__).parents[3]


def assert_within_float32_rounding(y: torch.Tensor, x: torch.Tensor, values: torch.Tensor, bias: torch.Tensor):
    """y against float64 x @ values.T + bias, within the bound of its float32 sums: each of 8 lanes a chain
    of K / 8 fused multiply-adds, 3 levels of adding lanes, then the bias."""
    exact = x.double() @ values.double().T + bias.double()
    magnitude = x.double().abs() @ values.double().abs().T + bias.double().abs()
    bound = (x.shape[1] / 8 + 4) * 2.0 ** -24 * 1.01 * magnitude
    worst = ((y.double() - exact).abs() - bound).max().item()
    assert worst <= 0, f"{len(x)} rows: off by {worst:.3g} more than float32 sums can be"


@pytest.mark.parametrize("format,cols", DEPTHS, ids=[f"{f}-{k}" for f, k in DEPTHS])
def test_product_equals_the_gguf_weights_matmul(format, cols):
    weight, values = weight_of(format, cols=cols)
    bias = torch.randn(37, generator=torch.Generator().manual_seed(1))
    for rows in ROW_COUNTS:
        x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(rows))
        assert_within_float32_rounding(quant_matmul.quant_matmul(x, weight, bias), x, values, bias)


@pytest.mark.parametrize("format", FORMATS)
def test_the_kernel_multiplies_by_exactly_the_gguf_values(format):
    """Rows of the identity pick single weights: every product is exact, every other term zero."""
    weight, values = weight_of(format, cols=256 if format in K_QUANTS else 320)
    picked = quant_matmul.quant_matmul(torch.eye(weight.cols), weight)
    assert torch.equal(picked, values.T)


@pytest.mark.parametrize("format", FORMATS)
def test_dequantize_gives_the_gguf_values_bit_for_bit(format):
    cols = 512 if format in K_QUANTS else 96
    weight = any_blocks(format, rows=45, cols=cols, seed=2)
    out = torch.full((36, cols), float("nan"))
    assert quant_matmul.dequantize(weight, (5, 41), out) is out
    assert torch.equal(out.view(torch.int32), gguf_values(weight)[5:41].view(torch.int32))


@pytest.mark.parametrize("format", FORMATS)
def test_a_rows_result_does_not_depend_on_its_batch(format):
    weight, _ = weight_of(format, cols=1536 if format in K_QUANTS else 1600)
    x = torch.randn(29, weight.cols, generator=torch.Generator().manual_seed(3))
    together = quant_matmul.quant_matmul(x, weight)
    alone = torch.cat([quant_matmul.quant_matmul(x[i:i + 1], weight) for i in range(len(x))])
    assert torch.equal(together, alone)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(quant_matmul.quant_matmul(x, weight), together)
    finally:
        torch.set_num_threads(threads)


def test_weights_taken_together_give_each_ones_bits():
    """q, k and v (or gate and up) in one call: each output is the call of its weight alone, whatever the
    formats side by side, the biases, the rows (past a pass of MAX_ROWS) and the threads."""
    weights = [weight_of(format, rows=rows, cols=1536, seed=rows)[0]
               for format, rows in (("Q4_K", 70), ("Q6_K", 9), ("Q8_0", 33), ("Q4_1", 1))]
    biases = [torch.randn(70), None, torch.randn(33), None]
    threads = torch.get_num_threads()
    for rows in (1, 5, 64, 70):
        x = torch.randn(rows, 1536, generator=torch.Generator().manual_seed(rows))
        alone = [quant_matmul.quant_matmul(x, weight, bias) for weight, bias in zip(weights, biases)]
        for count in (threads, 1):
            torch.set_num_threads(count)
            try:
                together = quant_matmul.quant_matmul_many(x, weights, biases)
            finally:
                torch.set_num_threads(threads)
            assert all(torch.equal(a, b) for a, b in zip(together, alone)), (rows, count)


BUILDS = {"portable": portable.portable_library, "avx2": portable.avx2_library,
          "native": portable.widest_library}


@pytest.mark.parametrize("build", list(BUILDS))
def test_every_build_gives_the_bits_of_the_one_loaded(build):
    """Where the native build is AVX-512, it takes two columns a vector, each the AVX2 code's steps lane for
    lane; an odd column count leaves one alone. The plain C code takes the same steps one lane at a time.
    The process loads the native or the AVX2 build (kernels/cpu/build_choice.py)."""
    library = BUILDS[build]("quant_matmul")
    for format in FORMATS:
        for columns, rows in [(37, 13), (1, 3), (20, 70)]:
            weight, _ = weight_of(format, rows=columns, cols=1536 if format in K_QUANTS else 1600, seed=columns)
            x, bias = torch.randn(rows, weight.cols), torch.randn(columns)
            assert torch.equal(quant_matmul.quant_matmul(x, weight, bias, library),
                               quant_matmul.quant_matmul(x, weight, bias)), (format, columns, rows)
        weight = any_blocks(format, rows=7, cols=256, seed=4)
        out = quant_matmul.dequantize(weight, (0, 7), torch.empty(7, 256), library)
        assert torch.equal(out.view(torch.int32), gguf_values(weight).view(torch.int32)), format


def test_a_mismatched_width_is_refused():
    weight, _ = weight_of("Q8_0")
    with pytest.raises(KernelError, match="x has 64 columns, the weight 320"):
        quant_matmul.quant_matmul(torch.zeros(2, 64), weight)
    with pytest.raises(KernelError, match=r"out must have shape \[4, 320\]"):
        quant_matmul.dequantize(weight, (0, 4), torch.empty(4, 64))


def test_the_kernel_reads_the_formats_a_q4_k_m_file_holds():
    assert all(quant_matmul.supports(format) for format in ("Q4_K", "Q6_K", "Q5_0", "Q8_0"))
    assert not any(quant_matmul.supports(format) for format in ("F16", "BF16", "Q2_K", "IQ4_XS"))


def test_only_few_float32_cpu_rows_take_the_kernel():
    assert quant_matmul.usable(torch.zeros(64, 32))
    assert not quant_matmul.usable(torch.zeros(65, 32))
    assert not quant_matmul.usable(torch.zeros(8, 32, dtype=torch.bfloat16))
    assert not quant_matmul.usable(torch.zeros(2, 8, 32))


# native.py's cache, on its smallest kernel (this one takes some seconds to compile)
@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))
    native.load.cache_clear()
    yield tmp_path
    native.load.cache_clear()


def test_the_library_is_built_once_into_the_cache(fresh_build):
    assert native.load("fused_ops") is not None
    built = list((fresh_build / "kernels").iterdir())
    assert [p.suffix for p in built] == [".so"]
    stamp = built[0].stat().st_mtime_ns
    native.load.cache_clear()
    assert native.load("fused_ops") is not None
    assert built[0].stat().st_mtime_ns == stamp and list((fresh_build / "kernels").iterdir()) == built


def test_without_a_compiler_it_warns_and_stays_off(fresh_build, monkeypatch):
    monkeypatch.setenv("PATH", str(fresh_build))
    monkeypatch.delenv("CC", raising=False)
    with pytest.warns(UserWarning, match="no C compiler found"):
        assert native.load("fused_ops") is None


def test_a_failing_compiler_warns_and_leaves_nothing_behind(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", "false")
    with pytest.warns(UserWarning, match="could not build the fused_ops kernel"):
        assert native.load("fused_ops") is None
    assert list((fresh_build / "kernels").iterdir()) == []


def test_an_unwritable_cache_warns_and_stays_off(fresh_build, monkeypatch):
    blocker = fresh_build / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SWARM_CACHE_DIR", str(blocker))
    with pytest.warns(UserWarning, match="cannot write to .*set SWARM_CACHE_DIR"):
        assert native.load("fused_ops") is None


def test_a_broken_cached_library_is_rebuilt(fresh_build):
    assert native.load("fused_ops") is not None
    [built] = (fresh_build / "kernels").iterdir()
    built.unlink()   # a new file: truncating the one this process has mapped would crash it (SIGBUS)
    built.write_bytes(b"cut short")
    # a new process: this one keeps the library it loaded under that name
    code = "from kernels.cpu import native; print(native.load('fused_ops') is not None)"
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True,
                          env={**os.environ, "SWARM_CACHE_DIR": str(fresh_build)}, cwd=ROOT)
    assert done.stdout.strip() == "True", done.stderr
    assert built.read_bytes()[:4] == b"\x7fELF"
