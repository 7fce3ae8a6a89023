"""The quantized decode kernel against the gguf package: its own quantizer makes the blocks, its own
dequantizer gives the float32 weights the products are checked against (in float64)."""
import os
import subprocess
import sys
from pathlib import Path

import gguf.quants
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q

from kernels.cpu import native, quant_matmul
from kernels.cpu.quant_matmul import dequantize, from_gguf_blocks
from tests.helpers import portable_kernels as portable

pytestmark = pytest.mark.skipif(not quant_matmul.available(), reason="no C compiler for the kernel")
TYPES = [Q.Q4_0, Q.Q4_1, Q.Q8_0]
ROOT = Path(__file__).parents[3]


def gguf_weight(qtype, rows=96, cols=320, seed=0):
    values = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    raw = gguf.quants.quantize(values, qtype)
    return from_gguf_blocks(raw, qtype), torch.from_numpy(gguf.quants.dequantize(raw, qtype))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_blocks_dequantize_to_exactly_the_gguf_values(qtype):
    weight, reference = gguf_weight(qtype)
    assert weight.shape == tuple(reference.shape)
    assert torch.equal(dequantize(weight), reference)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("rows", [1, 5, 8, 13, 64, 70])
@pytest.mark.parametrize("cols", [320, 1600], ids=["one-span", "three-spans"])   # the kernel reads K in spans
def test_product_equals_the_dequantized_matmul(qtype, rows, cols):
    weight, reference = gguf_weight(qtype, cols=cols)
    x = torch.randn(rows, reference.shape[1])
    bias = torch.randn(reference.shape[0])
    expected = x.double() @ reference.double().T + bias.double()
    torch.testing.assert_close(quant_matmul.quant_matmul(x, weight, bias).double(), expected, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
@pytest.mark.parametrize("cols", [320, 1600], ids=["one-span", "three-spans"])
def test_a_rows_result_does_not_depend_on_its_batch(qtype, cols):
    weight, reference = gguf_weight(qtype, cols=cols)
    x = torch.randn(29, reference.shape[1])
    together = quant_matmul.quant_matmul(x, weight)
    alone = torch.cat([quant_matmul.quant_matmul(x[i:i + 1], weight) for i in range(len(x))])
    assert torch.equal(together, alone)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(quant_matmul.quant_matmul(x, weight), together)
    finally:
        torch.set_num_threads(threads)


def test_the_portable_build_equals_the_dequantized_matmul(tmp_path):
    library = portable.portable_library("quant_matmul", tmp_path)
    for qtype in TYPES:
        weight, reference = gguf_weight(qtype, cols=1600)
        x, bias = torch.randn(13, 1600), torch.randn(reference.shape[0])
        out = quant_matmul.quant_matmul(x, weight, bias, library)
        expected = x.double() @ reference.double().T + bias.double()
        torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-4)


def test_the_avx2_build_gives_the_native_builds_bits(tmp_path):
    """Where the native build is AVX-512, it takes two columns at once, each the AVX2 code's steps
    lane for lane; an odd column count leaves one alone."""
    library = portable.avx2_library("quant_matmul", tmp_path)
    for qtype in TYPES:
        for columns, depth, rows in [(96, 1600, 13), (37, 320, 8), (1, 64, 3), (200, 576, 70)]:
            weight, _ = gguf_weight(qtype, rows=columns, cols=depth, seed=columns)
            x, bias = torch.randn(rows, depth), torch.randn(columns)
            assert torch.equal(quant_matmul.quant_matmul(x, weight, bias, library),
                               quant_matmul.quant_matmul(x, weight, bias)), (qtype, columns)


def test_reordered_rows_follow_the_weight():
    weight, reference = gguf_weight(Q.Q4_1)
    order = torch.randperm(reference.shape[0])
    assert torch.equal(dequantize(weight.rows(order)), reference[order])


def test_only_few_float32_cpu_rows_take_the_kernel():
    assert quant_matmul.usable(torch.zeros(64, 32))
    assert not quant_matmul.usable(torch.zeros(65, 32))
    assert not quant_matmul.usable(torch.zeros(8, 32, dtype=torch.bfloat16))
    assert not quant_matmul.usable(torch.zeros(2, 8, 32))


def test_other_block_types_are_left_to_pytorch():
    raw = gguf.quants.quantize(np.ones((4, 64), np.float32), Q.Q5_0)
    assert from_gguf_blocks(raw, Q.Q5_0) is None


def test_mismatched_width_is_refused():
    weight, _ = gguf_weight(Q.Q8_0)
    with pytest.raises(ValueError, match="columns"):
        quant_matmul.quant_matmul(torch.zeros(2, 64), weight)


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    monkeypatch.setenv("SWARM_CACHE_DIR", str(tmp_path))
    native.load.cache_clear()
    yield tmp_path
    native.load.cache_clear()


def test_the_library_is_built_once_into_the_cache(fresh_build):
    assert native.load("quant_matmul") is not None
    built = list((fresh_build / "kernels").iterdir())
    assert [p.suffix for p in built] == [".so"]
    stamp = built[0].stat().st_mtime_ns
    native.load.cache_clear()
    assert native.load("quant_matmul") is not None
    assert built[0].stat().st_mtime_ns == stamp and list((fresh_build / "kernels").iterdir()) == built


def test_without_a_compiler_it_warns_and_stays_off(fresh_build, monkeypatch):
    monkeypatch.setenv("PATH", str(fresh_build))
    monkeypatch.delenv("CC", raising=False)
    with pytest.warns(UserWarning, match="no C compiler found"):
        assert native.load("quant_matmul") is None


def test_a_failing_compiler_warns_and_leaves_nothing_behind(fresh_build, monkeypatch):
    monkeypatch.setenv("CC", "false")
    with pytest.warns(UserWarning, match="could not build the quant_matmul kernel"):
        assert native.load("quant_matmul") is None
    assert list((fresh_build / "kernels").iterdir()) == []


def test_an_unwritable_cache_warns_and_stays_off(fresh_build, monkeypatch):
    blocker = fresh_build / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("SWARM_CACHE_DIR", str(blocker))
    with pytest.warns(UserWarning, match="cannot write to .*set SWARM_CACHE_DIR"):
        assert native.load("quant_matmul") is None


def test_a_broken_cached_library_is_rebuilt(fresh_build):
    assert native.load("quant_matmul") is not None
    [built] = (fresh_build / "kernels").iterdir()
    built.unlink()   # a new file: truncating the one this process has mapped would crash it (SIGBUS)
    built.write_bytes(b"cut short")
    # a new process: this one keeps the library it loaded under that name
    code = "from kernels.cpu import native; print(native.load('quant_matmul') is not None)"
    done = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True,
                          env={**os.environ, "SWARM_CACHE_DIR": str(fresh_build)}, cwd=ROOT)
    assert done.stdout.strip() == "True", done.stderr
    assert built.read_bytes()[:4] == b"\x7fELF"
