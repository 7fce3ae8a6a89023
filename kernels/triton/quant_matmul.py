"""The GPU matmul of a weight kept in its GGUF block format, x @ W.T + bias without ever holding W
in floats, and the expansion of a whole weight:

    quant_matmul     picks the kernel by the rows of x (M):
    decode_matmul      M <= DECODE_ROWS: float32 multiply-adds on the expanded blocks
                       (kernels.triton.quant_decode), W read once for all rows, K split across
                       programs when N alone leaves the GPU idle
    prefill_matmul     any M: tiles expanded to x's dtype into tl.dot (kernels.triton.quant_prefill)
    dequantize       W [N, K] in floats, into a reused scratch if given (kernels.triton.quant_expand)

F32, F16 and BF16 weights are a view of their bytes and torch's own matmul, in x's dtype.
Under TRITON_INTERPRET=1 the kernels run on CPU tensors (slowly): that is how they are tested.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
import triton

from kernels.errors import KernelError
from kernels.reference.quant_blocks import FLOAT_DTYPES, QuantizedTensor, block_layout
from kernels.triton import interpreted
from kernels.triton.quant_decode import decode_kernel, sum_splits_kernel
from kernels.triton.quant_expand import dequantize_kernel
from kernels.triton.quant_prefill import prefill_kernel

__all__ = ["DECODE_ROWS", "KERNEL_FORMATS", "supports", "quant_matmul", "decode_matmul", "prefill_matmul",
           "dequantize"]

DECODE_ROWS = 16            # most rows of x the decode kernel takes; more go to the prefill kernel
KERNEL_FORMATS = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# Tiles, chosen by the registers and instructions the kernels compile to for sm_90 and gfx1201
# (RDNA4): a decode step's float32 dot operands spill past 64 columns at 8 rows of x or more, and
# 1 or 2 rows leave room for twice DECODE_BLOCK_N rows of W (a third fewer instructions a weight);
# prefill tiles of Q6_K (210-byte blocks: byte loads) or of float32 x spill at 64 columns on gfx1201.
DECODE_BLOCK_N, DECODE_BLOCK_K = 32, 64
PREFILL_TILE = (64, 64, 64)         # (BLOCK_M, BLOCK_N, BLOCK_K)
PREFILL_TILE_NARROW = (32, 64, 32)  # float32 x; Q6_K takes its BLOCK_K
DEQUANTIZE_TILE = (32, 128)         # (BLOCK_N, BLOCK_K)
PROGRAMS_PER_SM = 4         # decode splits K until there are this many programs per multiprocessor
SUM_BLOCK = 1024
MIN_DOT = 16                # smallest tl.dot side worth a tensor-core tile
INTERPRETED = interpreted()   # read once, as Triton reads it when this module defines its kernels


def supports(format: str) -> bool:
    """Whether quant_matmul takes weights kept in `format` (a GGML type name such as "Q4_K")."""
    return format in KERNEL_FORMATS or format in FLOAT_DTYPES


def quant_matmul(x: torch.Tensor, weight: QuantizedTensor, bias: torch.Tensor | None = None, *,
                 num_splits: int | None = None) -> torch.Tensor:
    """x [M, K] (float16, bfloat16 or float32) @ W.T + bias -> [M, N] in x's dtype: the decode
    kernel for M <= DECODE_ROWS, the prefill kernel above (num_splits: see decode_matmul)."""
    _check(x, weight, bias)
    if weight.format in FLOAT_DTYPES:
        dense = weight.blocks.view(FLOAT_DTYPES[weight.format]).to(x.dtype)
        return F.linear(x, dense, None if bias is None else bias.to(x.dtype))
    if x.shape[0] <= DECODE_ROWS:
        return decode_matmul(x, weight, bias, num_splits=num_splits)
    return prefill_matmul(x, weight, bias)


def decode_matmul(x: torch.Tensor, weight: QuantizedTensor, bias: torch.Tensor | None = None, *,
                  num_splits: int | None = None) -> torch.Tensor:
    """quant_matmul on the decode kernel (float32 multiply-adds), for at most DECODE_ROWS rows.
    num_splits: how many programs share each output's K (default: enough to fill the GPU)."""
    _check_kernel_inputs(x, weight, bias)
    if x.shape[0] > DECODE_ROWS:
        raise KernelError(f"x: {x.shape[0]} rows; the decode kernel takes at most {DECODE_ROWS}")
    (m_rows, cols), n = x.shape, weight.shape[0]
    out = torch.empty(m_rows, n, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    bias = None if bias is None else bias.contiguous()
    rows_p = triton.next_power_of_2(m_rows)
    block_n = DECODE_BLOCK_N * (2 if rows_p <= 2 else 1)
    block_k = min(DECODE_BLOCK_K, triton.next_power_of_2(cols))
    n_tiles = triton.cdiv(n, block_n)
    split_len, splits = _splits(n, triton.cdiv(cols, block_k), block_k, x.device, num_splits)
    target = out if splits == 1 else torch.empty(splits, m_rows, n, dtype=torch.float32, device=x.device)
    decode_kernel[(n_tiles, splits)](
        x, weight.blocks, bias, target, m_rows, n, cols, weight.blocks.stride(0), split_len,
        *x.stride(), target.stride(0) if splits > 1 else 0, n,
        **_layout(weight.format), HAS_BIAS=bias is not None and splits == 1,
        ROWS=rows_p, BLOCK_N=block_n, BLOCK_K=block_k)
    if splits > 1:
        count = m_rows * n
        sum_splits_kernel[(triton.cdiv(count, SUM_BLOCK),)](
            target, bias, out, splits, count, n, HAS_BIAS=bias is not None, BLOCK=SUM_BLOCK)
    return out


def prefill_matmul(x: torch.Tensor, weight: QuantizedTensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """quant_matmul on the prefill kernel (tiles expanded to x's dtype into tl.dot), for any M."""
    _check_kernel_inputs(x, weight, bias)
    (m_rows, cols), n = x.shape, weight.shape[0]
    out = torch.empty(m_rows, n, dtype=x.dtype, device=x.device)
    if out.numel() == 0:
        return out
    bias = None if bias is None else bias.contiguous()
    block_m, block_n, block_k = _prefill_tile(x.dtype, weight.format)
    block_m = min(block_m, max(MIN_DOT, triton.next_power_of_2(m_rows)))
    m_tiles = triton.cdiv(m_rows, block_m)
    prefill_kernel[(m_tiles * triton.cdiv(n, block_n),)](
        x, weight.blocks, bias, out, m_rows, n, cols, weight.blocks.stride(0), m_tiles, *x.stride(), n,
        **_layout(weight.format), HAS_BIAS=bias is not None, UPCAST=INTERPRETED,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=min(block_k, triton.next_power_of_2(cols)))
    return out


def _prefill_tile(dtype: torch.dtype, format: str) -> tuple[int, int, int]:
    if dtype == torch.float32:
        return PREFILL_TILE_NARROW
    block_m, block_n, block_k = PREFILL_TILE
    return block_m, block_n, PREFILL_TILE_NARROW[2] if format == "Q6_K" else block_k


def dequantize(weight: QuantizedTensor, dtype: torch.dtype = torch.float32, *,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """The whole weight [N, K] in `dtype` (or into `out`, a reused scratch of any float dtype), each
    value exactly gguf.quants.dequantize's before that rounding: the fallback a dense matmul runs
    on, and the check that the kernels expand blocks exactly."""
    n, cols = weight.shape
    if out is None:
        out = torch.empty(n, cols, dtype=dtype, device=weight.device)
    if out.shape != (n, cols) or out.device != weight.device or not out.is_floating_point():
        raise KernelError(f"out: {out.dtype} {tuple(out.shape)} on {out.device}; expected floats [{n}, {cols}] "
                          f"on {weight.device}")
    if weight.format in FLOAT_DTYPES:
        return out.copy_(weight.blocks.view(FLOAT_DTYPES[weight.format]))
    _check_device(weight)
    if out.numel() == 0:
        return out
    block_n, block_k = DEQUANTIZE_TILE
    dequantize_kernel[(triton.cdiv(n, block_n), triton.cdiv(cols, block_k))](
        weight.blocks, out, n, cols, weight.blocks.stride(0), *out.stride(),
        **_layout(weight.format), BLOCK_N=block_n, BLOCK_K=block_k)
    return out


def _splits(n: int, k_steps: int, block_k: int, device: torch.device,
            num_splits: int | None) -> tuple[int, int]:
    """(split_len, splits): K cut into whole BLOCK_K steps, by default until the GPU is busy. It
    depends on N, K and the GPU, never on M, so every batch size sums a row's K in one order."""
    if num_splits is None:
        num_splits = triton.cdiv(PROGRAMS_PER_SM * _multiprocessors(device), triton.cdiv(n, DECODE_BLOCK_N))
    steps = triton.cdiv(k_steps, max(1, min(num_splits, k_steps)))
    return steps * block_k, triton.cdiv(k_steps, steps)


def _layout(format: str) -> dict:
    """The constexprs expand_tile needs for `format`."""
    values, nbytes = block_layout(format)
    return dict(FORMAT=format, BLOCK_VALUES=values, BLOCK_BYTES=nbytes, GROUP=16 if format == "Q6_K" else 32)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check(x: torch.Tensor, weight: QuantizedTensor, bias: torch.Tensor | None) -> None:
    n, cols = weight.shape
    if x.dim() != 2 or x.shape[1] != cols:
        raise KernelError(f"x: shape {tuple(x.shape)}, but a weight of {cols} columns takes [rows, {cols}]")
    if x.dtype not in X_DTYPES:
        raise KernelError(f"x: dtype {x.dtype}; the quantized matmul takes float16, bfloat16 or float32")
    if x.device != weight.device:
        raise KernelError(f"x: on {x.device}, but the weight's blocks are on {weight.device}; move one")
    if bias is not None and (bias.shape != (n,) or bias.device != x.device or not bias.is_floating_point()):
        raise KernelError(f"bias: {bias.dtype} {tuple(bias.shape)} on {bias.device}; expected floats [{n}] "
                          f"on {x.device}")


def _check_kernel_inputs(x: torch.Tensor, weight: QuantizedTensor, bias: torch.Tensor | None) -> None:
    if weight.format not in KERNEL_FORMATS:
        raise KernelError(f"weight: no Triton kernel for {weight.format}; call quant_matmul, which takes floats")
    _check(x, weight, bias)
    _check_device(weight)


def _check_device(weight: QuantizedTensor) -> None:
    if not INTERPRETED and weight.device.type != "cuda":
        raise KernelError(f"weight: on {weight.device}; the Triton kernels need GPU tensors "
                          "(or TRITON_INTERPRET=1 to run them on the CPU)")
