"""Matmuls from code panels in integer products (csrc/code_prompt.c, whose top gives the sums), for prompt rows and
(through weight sets: kernels.cpu.weight_set's int8) decode rows: x's rows quantized as GGUF's Q8_0 quantizes a
tensor, multiplied by the weight's integer codes in int32 on AVX512-VNNI, as llama.cpp multiplies its quantized
weights. The weights are kernels.cpu.code_matmul's panels, packed once.

    linear_many(x, panels, formats, rows, biases)   [x [M, cols] @ W.T + b for each weight], x quantized once,
                                                    a row's bits its own
    oracle: x and W as gguf.quants dequantizes them, multiplied in float64 (tests/kernels/cpu/test_code_prompt.py)

Where the build has no AVX512-VNNI the same C code runs plain (`native()` is False): the same bits, far slower, for
tests; `dtype: auto` takes this path only where the machine probe timed it native and fast. Where torch is watching
a call goes through the op swarm::code_prompt_many.
"""
from __future__ import annotations

import ctypes

import torch
from torch.library import custom_op

from kernels.cpu import code_matmul, entry_points, ops
from kernels.cpu.checks import expect_optional, expect_rank, expect_tensor, refusal

SOURCE = "code_prompt"
OP = "code_prompt_many"
_ptr, _i64, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int


def available() -> bool:
    return entry_points.library(SOURCE) is not None


def native(library: ctypes.CDLL | None = None) -> bool:
    """Whether the build multiplies on AVX512-VNNI (library: another build, for tests)."""
    library = library or entry_points.library(SOURCE)
    return library is not None and library.swarm_code_prompt_native() == 1


def outputs(x: torch.Tensor, panels: list[torch.Tensor], codes: list[int], rows: list[int],
            biases: list[torch.Tensor | None]) -> list[torch.Tensor]:
    """codes: the weights' GGML type codes (entry_points.QUANT_FORMATS)"""
    expect_rank(OP, "x", x, 2)
    expect_tensor(OP, "x", x, (x.shape[0], x.shape[1]), torch.float32)
    if x.shape[1] % 32:
        raise refusal(OP, "x", f"has {x.shape[1]} columns: code panels need a multiple of 32")
    if not len(panels) == len(codes) == len(rows) == len(biases):
        raise refusal(OP, "panels", "formats, rows and biases must have one entry per weight")
    for panels_of, code, count, bias in zip(panels, codes, rows, biases):
        code_matmul.expect_panels(panels_of, entry_points.FORMAT_OF_CODE.get(code, str(code)), count, x.shape[1])
        expect_optional(OP, "bias", bias, (count,))
    return [torch.empty(x.shape[0], count, dtype=torch.float32) for count in rows]


def many_c(library: ctypes.CDLL, x: torch.Tensor, panels: list[torch.Tensor], codes: list[int], rows: list[int],
           biases: list[torch.Tensor | None]) -> list[torch.Tensor]:
    outs = outputs(x, panels, codes, rows, biases)
    count = len(panels)
    if library.swarm_code_prompt_many(
            x.data_ptr(), x.shape[0], x.shape[1], count, (_ptr * count)(*(p.data_ptr() for p in panels)),
            (_int * count)(*codes), (_i64 * count)(*rows),
            (_ptr * count)(*(None if b is None else b.data_ptr() for b in biases)),
            (_ptr * count)(*(out.data_ptr() for out in outs)), torch.get_num_threads()):
        raise MemoryError("code_prompt: out of memory for x's quantized rows")
    return outs


@custom_op("swarm::code_prompt_many", mutates_args=())
def _code_prompt_many(x: torch.Tensor, panels: list[torch.Tensor], codes: list[int], rows: list[int],
                      biases: list[torch.Tensor | None]) -> list[torch.Tensor]:
    return many_c(ops.built(SOURCE), x, panels, codes, rows, biases)


_code_prompt_many.register_fake(outputs)
_kernel = ops.Kernel(_code_prompt_many, many_c, SOURCE)


def linear_many(x: torch.Tensor, panels: list[torch.Tensor], formats: list[str], rows: list[int],
                biases: list[torch.Tensor | None], library: ctypes.CDLL | None = None) -> list[torch.Tensor]:
    """[x [..., cols] float32 @ W.T + bias] for weights packed by code_matmul.pack, x quantized once."""
    cols = x.shape[-1]
    codes = [entry_points.QUANT_FORMATS[format][0] for format in formats]
    outs = _kernel(x.reshape(-1, cols).contiguous(), list(panels), codes, list(rows), list(biases), library=library)
    return [out.reshape(*x.shape[:-1], count) for out, count in zip(outs, rows)]


def linear(x: torch.Tensor, panels: torch.Tensor, format: str, rows: int, bias: torch.Tensor | None = None,
           library: ctypes.CDLL | None = None) -> torch.Tensor:
    return linear_many(x, [panels], [format], [rows], [bias], library)[0]
