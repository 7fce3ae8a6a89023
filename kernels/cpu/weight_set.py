"""Weights that take the same x (a decode step's q, k and v; its gate and up; or one weight), described to the
quantized matmul kernel once.

swarm::quant_matmul_many checks every weight's blocks and builds ctypes arrays of their pointers on each call:
for SmolLM2's q, k and v that was 23 µs a call around a kernel of 10-40 µs, about 2 ms of a 22 ms decode step.
A WeightSet checks the weights and builds the kernel's description of them (csrc/quant_matmul.c's
swarm_weight_set) once; a call checks x, allocates the outputs and passes the two. The arithmetic is the
kernel's, so the outputs are quant_matmul_many's bit for bit. While torch is watching (compiling, tracing,
profiling) a call goes through the op instead (swarm::quant_matmul for one weight), for torch to see it.
"""
from __future__ import annotations

import ctypes

import torch

from kernels.cpu import bf16_matmul, code_matmul, code_prompt, entry_points, ops
from kernels.cpu.checks import expect_rank, refusal
from kernels.reference.quant_blocks import QuantizedTensor

_ptr, _i64, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
OP = "quant_matmul_many"


class Description(ctypes.Structure):
    _fields_ = [("count", _i64), ("K", _i64), ("q", ctypes.POINTER(_ptr)), ("formats", ctypes.POINTER(_int)),
                ("N", ctypes.POINTER(_i64)), ("bias", ctypes.POINTER(_ptr)), ("bf16", _i64),
                ("panels", ctypes.POINTER(_ptr)), ("code_panels", ctypes.POINTER(_ptr)), ("int8", _i64)]


class WeightSet:
    """`set(x)` is quant_matmul_many(x, weights, biases): for each weight, x @ W.T + bias; with bf16, in bfloat16
    products summed in float32 (quant_matmul_many's bf16, csrc/quant_matmul.c's top). With bf16, `panels` (each
    weight's bfloat16 panels: the prompt kernel's sums) or `code_panels` (each weight's code panels:
    csrc/code_matmul.c's sums, ahead of panels) multiply instead of the blocks. With int8 (and code_panels), x's
    rows are quantized to int8 and multiply the codes in integer products (csrc/code_prompt.c's sums)."""

    def __init__(self, weights: list[QuantizedTensor], biases: list[torch.Tensor | None],
                 library: ctypes.CDLL | None = None, bf16: bool = False,
                 panels: list[torch.Tensor] | None = None, code_panels: list[torch.Tensor] | None = None,
                 int8: bool = False):
        self.blocks = [weight.blocks for weight in weights]
        self.codes = [entry_points.QUANT_FORMATS[weight.format][0] for weight in weights]
        self.biases = list(biases)
        self.cols = weights[0].cols
        self.rows = [weight.shape[0] for weight in weights]
        entry_points.quant_matmul_many_outputs(torch.empty(0, self.cols), self.blocks, self.codes, self.cols,
                                               self.biases)   # refuses what the kernel cannot read
        self._library = library
        count = len(weights)
        self._arrays = ((_ptr * count)(*(b.data_ptr() for b in self.blocks)), (_int * count)(*self.codes),
                        (_i64 * count)(*self.rows), (_ptr * count)(*(None if b is None else b.data_ptr()
                                                                     for b in self.biases)))
        self.bf16 = bf16
        self.panels = panels
        if panels is not None:
            expected = [entry_points.bf16_panels_shape(rows, self.cols) for rows in self.rows]
            if not bf16 or [tuple(p.shape) for p in panels] != [tuple(e) for e in expected] or any(
                    p.dtype != torch.int32 or not p.is_contiguous() for p in panels):
                raise refusal(OP, "panels", f"must be each weight's bfloat16 panels {expected} (int32), "
                                            "for bfloat16 products")
        packed = None if panels is None else (_ptr * count)(*(p.data_ptr() for p in panels))
        self.code_panels = code_panels
        self.int8 = int8
        if int8 and code_panels is None:
            raise refusal(OP, "int8", "needs code_panels")
        if code_panels is not None:
            if not (bf16 or int8):
                raise refusal(OP, "code_panels", "need bfloat16 or integer products")
            for panels_of, weight in zip(code_panels, weights):
                code_matmul.expect_panels(panels_of, weight.format, *weight.shape)
        code_array = None if code_panels is None else (_ptr * count)(*(p.data_ptr() for p in code_panels))
        self._packed = packed, code_array
        self.description = Description(count, self.cols, *self._arrays, int(bf16), packed,
                                       code_array, int(int8))   # swarm_weight_set
        self._by_reference = ctypes.byref(self.description)
        self._outputs = _ptr * count

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if self._library is None and ops.torch_is_watching():
            if self.int8:
                formats = [entry_points.FORMAT_OF_CODE[code] for code in self.codes]
                return code_prompt.linear_many(x, self.code_panels, formats, self.rows, self.biases)
            if self.code_panels is not None:
                return [code_matmul.matmul(x, panels, entry_points.FORMAT_OF_CODE[code], rows, bias)
                        for panels, code, rows, bias in zip(self.code_panels, self.codes, self.rows, self.biases)]
            if self.panels is not None:
                return [bf16_matmul.packed_linear(x, panels, rows, bias)
                        for panels, rows, bias in zip(self.panels, self.rows, self.biases)]
            if len(self.blocks) == 1 and not self.bf16:
                format = entry_points.FORMAT_OF_CODE[self.codes[0]]
                return [ops.quant_matmul(x, self.blocks[0], format, self.cols, self.biases[0])]
            return ops.quant_matmul_many(x, self.blocks, self.codes, self.cols, self.biases, self.bf16)
        expect_rank(OP, "x", x, 2)
        if x.shape[1] != self.cols:
            raise refusal(OP, "x", f"has {x.shape[1]} columns, the weight {self.cols}")
        rows = x.shape[0]
        outs = [torch.empty(rows, n, dtype=torch.float32) for n in self.rows]
        library = self._library or entry_points.library("quant_matmul")
        if library.swarm_quant_matmul_set(self._by_reference, x.data_ptr(), rows,
                                          self._outputs(*(out.data_ptr() for out in outs)), torch.get_num_threads()):
            raise MemoryError("the quantized matmul could not allocate x's bfloat16 pairs")
        return outs
