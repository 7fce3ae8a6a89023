"""RMSNorm, the rotary embedding and silu(gate) * up as one C call each (kernels/cpu/csrc/fused_ops.c, the ops
swarm::rms_norm, swarm::rotary and swarm::silu_mul), for float32 CPU tensors; anything else returns None and the
caller keeps its PyTorch code."""
from __future__ import annotations

import torch

from kernels.cpu import entry_points, ops


def _native(*tensors: torch.Tensor) -> bool:
    return (all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and entry_points.library("fused_ops") is not None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """weight * x / sqrt(mean(x^2, last dim) + eps), or None where the C kernel does not apply."""
    if not _native(x, weight) or not weight.is_contiguous():
        return None
    return ops.rms_norm(x.contiguous(), weight, eps)


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """x [tokens, heads, dim] rotated by cos, sin [tokens, dim] (rotate-half form), or None."""
    if not _native(x, cos, sin) or x.shape[-1] % 2:
        return None
    return ops.rotary(x.contiguous(), cos.contiguous(), sin.contiguous())


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor | None:
    """silu(gate) * up, or None. Every float32 CPU MLP takes it, a decode step's C layers too (csrc/layer_rows.h):
    a row's bits must not depend on which path its step took."""
    if not _native(gate, up) or gate.shape != up.shape:
        return None
    return ops.silu_mul(gate.contiguous(), up.contiguous())
