"""Which attention kernels run: Triton on a GPU, the CPU kernels on a CPU.

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

Prefill attention runs in C with native (kernels/cpu/csrc/rows_attention.c), in Triton with triton
(kernels.triton.prefill), elsewhere on torch's SDPA; with native, sdpa and triton, prompts that continue
one cached trunk attend to it together (kernels.cpu.cascade_prefill, kernels.triton.prefill).
"""
from __future__ import annotations

import os

import torch

from engine.attention import kernel_sets
from engine.attention.base import AttentionBackend
from engine.attention.cascade import CascadeBackend
from engine.attention.kernel_sets import AttentionKernels
from engine.errors import SwarmError
from engine.kv.cache import KVCache
from kernels.cpu import native_attention, sdpa_attention
from kernels.triton import interpreted

BACKEND_ENV = "SWARM_ATTENTION_BACKEND"
CHOICES = ("auto", "torch", "sdpa", "native", "triton")


class AttentionBackendError(SwarmError):
    """A SWARM_ATTENTION_BACKEND that cannot run here."""


def select_backend(kv: KVCache, scale: float, choice: str | None = None) -> AttentionBackend:
    """The backend for the pool `kv`, on the kernels `choice` names (None: as SWARM_ATTENTION_BACKEND asks)."""
    return CascadeBackend(_kernels_for(kv.layers[0][0].device.type, _choice(choice)), kv, scale)


def pool_dtype(device: torch.device, dtype: torch.dtype, prompt_attention: str, decode_attention: str,
               choice: str | None = None) -> torch.dtype:
    """The KV pool's dtype for a model computing in `dtype`: bfloat16 on a CPU whose kernels (`choice`, as
    select_backend's) read the pool through bfloat16 products only, the prompts' and the decode rows' attention
    (engine.prompt_matmul's choose_attention and choose_decode_attention). Those products round every float32 key
    and value to bfloat16 as they read it, so the pool holds what they read in half the bytes (llama.cpp keeps
    16-bit KV too) and gives a row the same bits. `dtype` elsewhere."""
    read_bf16 = prompt_attention in ("bfloat16", "int8") and decode_attention == "bfloat16"
    if device.type != "cpu" or dtype != torch.float32 or not read_bf16:
        return dtype
    bf16 = _kernels_for(device.type, _choice(choice)).bf16_pool and native_attention.bf16_products_native()
    return torch.bfloat16 if bf16 else dtype


def _choice(choice: str | None) -> str:
    if choice is None:
        return os.environ.get(BACKEND_ENV, "").strip().lower() or "auto"
    return choice


def _kernels_for(device_type: str, choice: str) -> AttentionKernels:
    if choice not in CHOICES:
        raise AttentionBackendError(f"{BACKEND_ENV}={choice!r} is not a backend: use native, sdpa, torch or triton, "
                                    "or unset it")
    on_gpu = device_type == "cuda"
    if choice == "native" or (choice == "auto" and device_type == "cpu" and native_attention.available()):
        return _native_kernels(device_type)
    if choice == "sdpa" or (choice == "auto" and device_type == "cpu"):
        return _sdpa_kernels(device_type)
    if choice == "torch" or (choice == "auto" and not (on_gpu and _triton_installed())):
        return kernel_sets.REFERENCE_KERNELS
    if not _triton_installed():
        raise AttentionBackendError(f"{BACKEND_ENV}=triton needs the triton package: pip install triton")
    if not (on_gpu or interpreted()):
        raise AttentionBackendError(f"{BACKEND_ENV}=triton on {device_type} runs only under TRITON_INTERPRET=1 "
                                    f"(slow, for tests); unset {BACKEND_ENV} to use torch")
    return kernel_sets.triton_kernels()


def _sdpa_kernels(device_type: str) -> AttentionKernels:
    if device_type != "cpu" or not sdpa_attention.available():
        raise AttentionBackendError(f"{BACKEND_ENV}=sdpa needs a CPU tensor and torch's fused CPU attention "
                                    f"(torch >= 2.3); unset {BACKEND_ENV} to pick a backend that runs here")
    return kernel_sets.SDPA_KERNELS


def _native_kernels(device_type: str) -> AttentionKernels:
    if device_type != "cpu" or not native_attention.available() or not sdpa_attention.available():
        raise AttentionBackendError(f"{BACKEND_ENV}=native needs a CPU tensor, a C compiler (set CC) and torch's "
                                    f"fused CPU attention; unset {BACKEND_ENV} to pick a backend that runs here")
    return kernel_sets.NATIVE_KERNELS


def _triton_installed() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:   # not installed, or a build that does not load here
        return False
    return True
