"""Both halves of cascade decode attention in C, on a CPU:
- the private (paged) half reads keys and values in place from the paged cache, where the fused
  SDPA path first gathers them into a padded batch and masks the padding (kernels/cpu/csrc/paged_decode.c);
- the shared-prefix half scores every row that shares the trunk against it in register tiles,
  spread over the threads by chunks of keys (kernels/cpu/csrc/prefix_attention.c).
See `swarm bench-decode`. Other dtypes and shapes go to the SDPA path (kernels.cpu.sdpa_attention).
The C functions run as the ops swarm::paged_decode, swarm::prefix_attention, swarm::rows_attention and
swarm::merge_attention (kernels.cpu.ops).
"""
from __future__ import annotations

import ctypes

import torch

from kernels.cpu import entry_points, ops, sdpa_attention
from kernels.reference import cascade_attention


def available() -> bool:
    return all(entry_points.library(source) is not None
               for source in ("paged_decode", "prefix_attention", "rows_attention"))


def _takes_c(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the C kernels take these: float32 on a CPU, heads a multiple of 8 wide."""
    return q.dtype == k.dtype == v.dtype == torch.float32 and q.device.type == "cpu" and q.shape[-1] % 8 == 0


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     library: ctypes.CDLL | None = None):
    """Contract of kernels.reference.cascade_attention.prefix_attention; float32 CPU tensors only, others go
    to the SDPA path. library: tests pass other builds of the kernel."""
    if not (_takes_c(q, k, v) and len(k) > 0):
        return sdpa_attention.prefix_attention(q, k, v, scale)
    return ops.prefix_attention(q.contiguous(), k.contiguous(), v.contiguous(), scale, library=library)


def rows_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                   library: ctypes.CDLL | None = None):
    """Prefill rows q [tokens, heads, dim] over one span of keys k, v [keys, kv_heads, dim]
    -> out (float32) [tokens, heads, dim], lse [tokens, heads]. causal: the tokens are the span's
    last ones, each seeing the keys up to its own (sdpa_attention.causal_tail_with_lse's
    contract); otherwise every token sees every key (sdpa_attention.prefix_attention's).
    float32 CPU tensors only, others go to the SDPA path. library: tests pass other builds."""
    if not (_takes_c(q, k, v) and len(k) >= len(q) * causal and len(k) > 0):
        return sdpa_attention.rows_attention(q, k, v, scale, causal)
    return ops.rows_attention(q.contiguous(), k.contiguous(), v.contiguous(), scale, causal, library=library)


def paged_decode_with_lse(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, lengths: torch.Tensor, scale: float,
                          library: ctypes.CDLL | None = None):
    """Contract of kernels.reference.cascade_attention.paged_decode_with_lse; float32 CPU tensors only,
    others go to the SDPA path. library: tests pass other builds of the kernel."""
    if not (_takes_c(q, k_cache, v_cache) and k_cache.is_contiguous() and v_cache.is_contiguous()):
        return sdpa_attention.paged_decode_with_lse(q, k_cache, v_cache, block_tables, lengths, scale)
    tables = block_tables.to(torch.int64).contiguous()
    return ops.paged_decode(q.contiguous(), k_cache, v_cache, tables, lengths.to(torch.int64).contiguous(), scale,
                            library=library)


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """Contract of kernels.reference.cascade_attention.merge_attention, in one C loop instead of a dozen small
    torch ops; float32 CPU tensors only, others go to the torch version."""
    tensors = (out_a, lse_a, out_b, lse_b)
    if not (all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
            and out_a.shape == out_b.shape and lse_a.shape == lse_b.shape == out_a.shape[:-1]):
        return cascade_attention.merge_attention(*tensors)
    return ops.merge_attention(*(t.contiguous() for t in tensors))
