"""Which decode-attention kernels run: Triton on a GPU, torch's fused CPU kernel on a CPU.

    SWARM_ATTENTION_BACKEND   unset/auto: Triton when the device is a GPU (CUDA or ROCm
                                          build of torch) and triton imports; on a CPU,
                                          native (or sdpa without a C compiler); else torch
                              native:     both halves of the cascade, and prefill, in C
                                          (kernels.cpu.native_attention); auto's choice on
                                          a CPU where a C compiler works
                              sdpa:       torch's fused CPU attention (kernels.cpu.sdpa_attention)
                              torch:      always the PyTorch reference path
                              triton:     always Triton; on CPU only with TRITON_INTERPRET=1
                                          (the interpreter, slow: for tests)

Prefill attention runs in C with native (kernels/cpu/csrc/rows_attention.c), elsewhere on torch's SDPA;
with native and sdpa, prompts that continue one cached trunk attend to it together
(kernels.cpu.cascade_prefill).
"""
from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.errors import SwarmError
from kernels.cpu import native_attention, sdpa_attention
from kernels.reference import cascade_attention, paged_attention

BACKEND_ENV = "SWARM_ATTENTION_BACKEND"
CHOICES = ("auto", "torch", "sdpa", "native", "triton")


class AttentionBackendError(SwarmError):
    """A SWARM_ATTENTION_BACKEND that cannot run here."""


@dataclass(frozen=True, slots=True)
class AttentionOps:
    """The decode-step kernels, one implementation set (see kernels.reference.cascade_attention)."""

    name: str
    write_kv: Callable[..., None]
    paged_decode_with_lse: Callable
    prefix_attention: Callable
    merge_attention: Callable
    cascade_prefill: bool = False   # prompts continuing one cached trunk read it together (CPU)
    prefill_rows: Callable | None = None   # prefill attention (native_attention.rows_attention); None: SDPA


TORCH_OPS = AttentionOps("torch", paged_attention.write_kv, cascade_attention.paged_decode_with_lse,
                         cascade_attention.prefix_attention, cascade_attention.merge_attention)
SDPA_OPS = AttentionOps("sdpa", paged_attention.write_kv, sdpa_attention.paged_decode_with_lse,
                        sdpa_attention.prefix_attention, cascade_attention.merge_attention, cascade_prefill=True)
NATIVE_OPS = AttentionOps("native", paged_attention.write_kv, native_attention.paged_decode_with_lse,
                          native_attention.prefix_attention, native_attention.merge_attention, cascade_prefill=True,
                          prefill_rows=native_attention.rows_attention)


def attention_ops(device: torch.device) -> AttentionOps:
    """The kernels for tensors on `device`, as SWARM_ATTENTION_BACKEND asks (read on each call)."""
    choice = os.environ.get(BACKEND_ENV, "").strip().lower() or "auto"
    return _ops_for(device.type, choice, _interpreting())


@functools.cache
def _ops_for(device_type: str, choice: str, interpreting: bool) -> AttentionOps:
    if choice not in CHOICES:
        raise AttentionBackendError(f"{BACKEND_ENV}={choice!r} is not a backend: use native, sdpa, torch or triton, "
                                    "or unset it")
    on_gpu = device_type == "cuda"
    if choice == "native" or (choice == "auto" and device_type == "cpu" and native_attention.available()):
        return _native_ops(device_type)
    if choice == "sdpa" or (choice == "auto" and device_type == "cpu"):
        return _sdpa_ops(device_type)
    if choice == "torch" or (choice == "auto" and not (on_gpu and _triton_installed())):
        return TORCH_OPS
    if not _triton_installed():
        raise AttentionBackendError(f"{BACKEND_ENV}=triton needs the triton package: pip install triton")
    if not (on_gpu or interpreting):
        raise AttentionBackendError(f"{BACKEND_ENV}=triton on {device_type} runs only under TRITON_INTERPRET=1 "
                                    f"(slow, for tests); unset {BACKEND_ENV} to use torch")
    return _triton_ops()


def _sdpa_ops(device_type: str) -> AttentionOps:
    if device_type != "cpu" or not sdpa_attention.available():
        raise AttentionBackendError(f"{BACKEND_ENV}=sdpa needs a CPU tensor and torch's fused CPU attention "
                                    f"(torch >= 2.3); unset {BACKEND_ENV} to pick a backend that runs here")
    return SDPA_OPS


def _native_ops(device_type: str) -> AttentionOps:
    if device_type != "cpu" or not native_attention.available() or not sdpa_attention.available():
        raise AttentionBackendError(f"{BACKEND_ENV}=native needs a CPU tensor, a C compiler (set CC) and torch's "
                                    f"fused CPU attention; unset {BACKEND_ENV} to pick a backend that runs here")
    return NATIVE_OPS


def _triton_ops() -> AttentionOps:
    # imported late: TRITON_INTERPRET is read when the kernels are defined
    from kernels.triton import attention as triton_attention

    return AttentionOps("triton", triton_attention.write_kv, triton_attention.paged_decode_with_lse,
                        triton_attention.prefix_attention, triton_attention.merge_attention)


def _triton_installed() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:   # not installed, or a build that does not load here
        return False
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")
