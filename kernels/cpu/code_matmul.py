"""Decode matmuls from quantized weights kept as code panels (csrc/code_matmul.c, whose top gives the layout and
the sums): a Q4_0, Q4_1, Q4_K or Q8_0 weight's integer codes repacked once, 16 weight rows side by side, with each
sub-block's scale and offset, and multiplied without expanding a value to bfloat16.

    pack(weight)                        blocks ──▶ panels uint8 [ceil(rows / 16), cols / 32, cell bytes]
    matmul(x, panels, format, rows, b)  x [M, cols] @ W.T + b, a row's bits its own
                                        (oracle: kernels.reference.code_matmul)

A weight set (kernels.cpu.weight_set) given the panels multiplies all of them in one call; where torch is watching
a call goes through the op swarm::code_matmul instead.
"""
from __future__ import annotations

import ctypes

import torch
from torch.library import custom_op

from kernels.cpu import entry_points, ops
from kernels.cpu.checks import expect_optional, expect_rank, expect_tensor, refusal
from kernels.reference.quant_blocks import QuantizedTensor

FORMATS = ("Q4_0", "Q4_1", "Q4_K", "Q8_0")
SOURCE = "code_matmul"
OP = "code_matmul"


def available() -> bool:
    return entry_points.library(SOURCE) is not None


def native(library: ctypes.CDLL | None = None) -> bool:
    """Whether the build multiplies on AVX512-BF16 (library: another build, for tests)."""
    library = library or entry_points.library(SOURCE)
    return library is not None and library.swarm_code_native() == 1


def packable(weight: QuantizedTensor) -> bool:
    return weight.format in FORMATS and weight.cols % 32 == 0


def panels_shape(format: str, rows: int, cols: int) -> tuple[int, int, int]:
    return (rows + 15) // 16, cols // 32, ops.built(SOURCE).swarm_code_cell_bytes(_code(format))


def _code(format: str) -> int:
    return entry_points.QUANT_FORMATS[format][0]


def pack(weight: QuantizedTensor, library: ctypes.CDLL | None = None) -> torch.Tensor:
    """The weight's code panels (panels_shape), made once."""
    if not packable(weight):
        raise refusal("code_pack", "weight", f"must be {', '.join(FORMATS)} with a multiple of 32 columns, "
                                             f"not {weight.format} with {weight.cols}")
    library = library or ops.built(SOURCE)
    rows, cols = weight.shape
    panels = torch.empty(panels_shape(weight.format, rows, cols), dtype=torch.uint8)
    library.swarm_code_pack(weight.blocks.contiguous().data_ptr(), _code(weight.format), rows, cols,
                            panels.data_ptr(), torch.get_num_threads())
    return panels


def expect_panels(panels: torch.Tensor, format: str, rows: int, cols: int) -> None:
    if format not in FORMATS:
        raise refusal(OP, "format", f"must be one of {', '.join(FORMATS)}, not {format}")
    expect_tensor(OP, "panels", panels, panels_shape(format, rows, cols), torch.uint8)


def matmul_outputs(x: torch.Tensor, panels: torch.Tensor, format: str, rows: int,
                   bias: torch.Tensor | None) -> torch.Tensor:
    expect_rank(OP, "x", x, 2)
    expect_tensor(OP, "x", x, (x.shape[0], x.shape[1]), torch.float32)
    expect_panels(panels, format, rows, x.shape[1])
    expect_optional(OP, "bias", bias, (rows,))
    return torch.empty(x.shape[0], rows, dtype=torch.float32)


def matmul_c(library: ctypes.CDLL, x: torch.Tensor, panels: torch.Tensor, format: str, rows: int,
             bias: torch.Tensor | None) -> torch.Tensor:
    out = matmul_outputs(x, panels, format, rows, bias)
    if library.swarm_code_matmul(x.data_ptr(), x.shape[0], x.shape[1], panels.data_ptr(), _code(format), rows,
                                 None if bias is None else bias.data_ptr(), out.data_ptr(), torch.get_num_threads()):
        raise MemoryError("code_matmul: out of memory for x's rounded rows")
    return out


@custom_op("swarm::code_matmul", mutates_args=())
def _code_matmul(x: torch.Tensor, panels: torch.Tensor, format: str, rows: int,
                 bias: torch.Tensor | None) -> torch.Tensor:
    return matmul_c(ops.built(SOURCE), x, panels, format, rows, bias)


_code_matmul.register_fake(matmul_outputs)
_kernel = ops.Kernel(_code_matmul, matmul_c, SOURCE)


def matmul(x: torch.Tensor, panels: torch.Tensor, format: str, rows: int, bias: torch.Tensor | None = None,
           library: ctypes.CDLL | None = None) -> torch.Tensor:
    """x [..., cols] float32 @ W.T + bias for a weight of `rows` rows in `format` packed by pack."""
    cols = x.shape[-1]
    out = _kernel(x.reshape(-1, cols).contiguous(), panels, format, rows, bias, library=library)
    return out.reshape(*x.shape[:-1], rows)
