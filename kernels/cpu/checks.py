"""The checks at the C kernels' boundary: a C function trusts every pointer and size it is given, so a
tensor of the wrong dtype, shape or layout would be read out of bounds. Each check raises KernelError
naming the argument. They run on every call (a decode step makes hundreds), so the passing case is one
expression of attribute reads; only a refusal works out what is wrong."""
from __future__ import annotations

import torch

from kernels.errors import KernelError


def expect_tensor(op: str, name: str, tensor: torch.Tensor, shape: tuple[int, ...],
                  dtype: torch.dtype = torch.float32) -> None:
    """`tensor` is a contiguous CPU tensor of `dtype` and exactly `shape`."""
    if not (tensor.dtype == dtype and tensor.is_cpu and tensor.shape == shape and tensor.is_contiguous()):
        raise _refusal(op, name, tensor, dtype, tensor.shape == shape, f"shape {list(shape)}")


def expect_rank(op: str, name: str, tensor: torch.Tensor, rank: int, dtype: torch.dtype = torch.float32) -> None:
    """`tensor` is a contiguous CPU tensor of `dtype` with `rank` dimensions, of any size."""
    if not (tensor.dtype == dtype and tensor.is_cpu and tensor.dim() == rank and tensor.is_contiguous()):
        raise _refusal(op, name, tensor, dtype, tensor.dim() == rank, f"{rank} dimensions")


def expect_optional(op: str, name: str, tensor: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    """`expect_tensor` for a float32 argument the C function takes as NULL when absent."""
    if tensor is not None:
        expect_tensor(op, name, tensor, shape)


def kv_dtype(op: str, name: str, k: torch.Tensor, bf16_products: bool, flag: str = "bf16=True") -> torch.dtype:
    """The dtype keys and values must have: float32, or bfloat16 (a pool kept in bfloat16) where the products are
    bfloat16 (`flag` says how to ask for them), as those round float32 keys and values to it."""
    if k.dtype != torch.bfloat16:
        return torch.float32
    if not bf16_products:
        raise refusal(op, name, f"in bfloat16 is read by bfloat16 products only: pass {flag}")
    return torch.bfloat16


def refusal(op: str, name: str, problem: str) -> KernelError:
    """The error for a condition between arguments (a head count that divides another, a width that matches):
    raised as `if not ...: raise refusal(...)`, so that a passing call formats no message."""
    return KernelError(f"swarm::{op}: {name} {problem}")


def _refusal(op: str, name: str, tensor: torch.Tensor, dtype: torch.dtype, shaped: bool, shape: str) -> KernelError:
    if tensor.dtype != dtype:
        problem = f"must be {dtype}, got {tensor.dtype}"
    elif not tensor.is_cpu:
        problem = f"must be on the CPU, got {tensor.device}"
    elif not shaped:
        problem = f"must have {shape}, got {list(tensor.shape)}"
    else:
        problem = f"must be contiguous, got strides {tensor.stride()}"
    return refusal(op, name, problem)
