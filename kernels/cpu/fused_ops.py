"""RMSNorm and the rotary embedding as one C call each (kernels/cpu/csrc/fused_ops.c), for float32 CPU
tensors; anything else returns None and the caller keeps its PyTorch code."""
from __future__ import annotations

import ctypes
import functools

import torch

from kernels.cpu import native


@functools.cache
def _library() -> ctypes.CDLL | None:
    ptr, i64, f32, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
    return native.declared("fused_ops", {"swarm_rms_norm": ([ptr, ptr, i64, i64, f32, ptr, i32], None),
                                         "swarm_rotary": ([ptr, i64, i64, i64, ptr, ptr, ptr, i32], None)})


def _native(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors) and _library() is not None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """weight * x / sqrt(mean(x^2, last dim) + eps), or None where the C kernel does not apply."""
    if not _native(x, weight) or not weight.is_contiguous():
        return None
    x = x.contiguous()
    out = torch.empty_like(x)
    dim = x.shape[-1]
    _library().swarm_rms_norm(x.data_ptr(), weight.data_ptr(), x.numel() // dim, dim, eps, out.data_ptr(),
                              torch.get_num_threads())
    return out


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """x [tokens, heads, dim] rotated by cos, sin [tokens, dim] (rotate-half form), or None."""
    if not _native(x, cos, sin) or x.shape[-1] % 2:
        return None
    x, cos, sin = x.contiguous(), cos.contiguous(), sin.contiguous()
    out = torch.empty_like(x)
    tokens, heads, dim = x.shape
    _library().swarm_rotary(x.data_ptr(), tokens, heads, dim, cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
                            torch.get_num_threads())
    return out
