"""Both halves of cascade decode attention in C, on a CPU:
- the private (paged) half reads keys and values in place from the paged cache, where the fused
  SDPA path first gathers them into a padded batch and masks the padding (kernels/cpu/csrc/paged_decode.c);
- the shared-prefix half scores every row that shares the trunk against it in register tiles,
  spread over the threads by chunks of keys (kernels/cpu/csrc/prefix_attention.c).
See `swarm bench-decode`. Other dtypes and shapes go to the SDPA path (kernels.cpu.sdpa_attention).
"""
from __future__ import annotations

import ctypes
import functools

import torch

from kernels.cpu import native, sdpa_attention
from kernels.reference import cascade_attention

_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64
PAGED_SIGNATURES = {   # kernels/cpu/csrc/paged_decode.c
    "swarm_paged_decode": ([_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _i64, _ptr, _i64, _ptr, ctypes.c_float, _ptr,
                            _ptr, ctypes.c_int], ctypes.c_int)}


@functools.cache
def _library() -> ctypes.CDLL | None:
    return native.declared("paged_decode", PAGED_SIGNATURES)


PREFIX_SIGNATURES = {   # kernels/cpu/csrc/prefix_attention.c
    "swarm_prefix_attention": ([_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _i64, ctypes.c_float, _ptr, _ptr,
                                ctypes.c_int], ctypes.c_int),
    "swarm_merge_attention": ([_ptr, _ptr, _ptr, _ptr, _i64, _i64, _ptr, _ptr], None)}


ROWS_SIGNATURES = {   # kernels/cpu/csrc/rows_attention.c
    "swarm_rows_attention": ([_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _i64, ctypes.c_int, ctypes.c_float, _ptr, _ptr,
                              ctypes.c_int], ctypes.c_int)}


@functools.cache
def _prefix_library() -> ctypes.CDLL | None:
    return native.declared("prefix_attention", PREFIX_SIGNATURES)


@functools.cache
def _rows_library() -> ctypes.CDLL | None:
    return native.declared("rows_attention", ROWS_SIGNATURES)


def available() -> bool:
    return _library() is not None and _prefix_library() is not None and _rows_library() is not None


def _takes_c(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the C kernels take these: float32 on a CPU, heads a multiple of 8 wide."""
    return q.dtype == k.dtype == v.dtype == torch.float32 and q.device.type == "cpu" and q.shape[-1] % 8 == 0


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     library: ctypes.CDLL | None = None):
    """Contract of kernels.reference.cascade_attention.prefix_attention; float32 CPU tensors only, others go
    to the SDPA path. library: tests pass other builds of the kernel."""
    batch, heads, dim = q.shape
    if not (_takes_c(q, k, v) and len(k) > 0):
        return sdpa_attention.prefix_attention(q, k, v, scale)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty(batch, heads, dim)
    lse = torch.empty(batch, heads)
    failed = (library or _prefix_library()).swarm_prefix_attention(
        q.data_ptr(), batch, heads, k.shape[1], dim, k.data_ptr(), v.data_ptr(), k.shape[0], scale,
        out.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    if failed:
        raise MemoryError("shared-prefix attention could not allocate its scratch memory")
    return out, lse


def rows_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                   library: ctypes.CDLL | None = None):
    """Prefill rows q [tokens, heads, dim] over one span of keys k, v [keys, kv_heads, dim]
    -> out (float32) [tokens, heads, dim], lse [tokens, heads]. causal: the tokens are the span's
    last ones, each seeing the keys up to its own (sdpa_attention.causal_tail_with_lse's
    contract); otherwise every token sees every key (sdpa_attention.prefix_attention's).
    float32 CPU tensors only, others go to the SDPA path. library: tests pass other builds."""
    tokens, heads, dim = q.shape
    if not (_takes_c(q, k, v) and len(k) >= tokens * causal and len(k) > 0):
        return sdpa_attention.rows_attention(q, k, v, scale, causal)
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = torch.empty(tokens, heads, dim)
    lse = torch.empty(tokens, heads)
    failed = (library or _rows_library()).swarm_rows_attention(
        q.data_ptr(), tokens, heads, k.shape[1], dim, k.data_ptr(), v.data_ptr(), k.shape[0], int(causal), scale,
        out.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    if failed:
        raise MemoryError("prefill attention could not allocate its scratch memory")
    return out, lse


def paged_decode_with_lse(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, lengths: torch.Tensor, scale: float,
                          library: ctypes.CDLL | None = None):
    """Contract of kernels.reference.cascade_attention.paged_decode_with_lse; float32 CPU tensors only,
    others go to the SDPA path. library: tests pass other builds of the kernel."""
    batch, heads, dim = q.shape
    if not (_takes_c(q, k_cache, v_cache) and k_cache.is_contiguous() and v_cache.is_contiguous()):
        return sdpa_attention.paged_decode_with_lse(q, k_cache, v_cache, block_tables, lengths, scale)
    q = q.contiguous()
    tables = block_tables.to(torch.int64).contiguous()
    lengths = lengths.to(torch.int64).contiguous()
    out = torch.empty(batch, heads, dim)
    lse = torch.empty(batch, heads)
    failed = (library or _library()).swarm_paged_decode(
        q.data_ptr(), batch, heads, k_cache.shape[2], dim, k_cache.data_ptr(), v_cache.data_ptr(),
        k_cache.shape[1], tables.data_ptr(), tables.shape[1], lengths.data_ptr(), scale,
        out.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    if failed:
        raise MemoryError("paged decode attention could not allocate its scores")
    return out, lse


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """Contract of kernels.reference.cascade_attention.merge_attention, in one C loop instead of a dozen small
    torch ops; float32 CPU tensors only, others go to the torch version."""
    tensors = (out_a, lse_a, out_b, lse_b)
    if not (all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
            and out_a.shape == out_b.shape and lse_a.shape == lse_b.shape == out_a.shape[:-1]):
        return cascade_attention.merge_attention(*tensors)
    out_a, lse_a, out_b, lse_b = (t.contiguous() for t in tensors)
    out, lse = torch.empty_like(out_a), torch.empty_like(lse_a)
    _prefix_library().swarm_merge_attention(out_a.data_ptr(), lse_a.data_ptr(), out_b.data_ptr(), lse_b.data_ptr(),
                                            lse_a.numel(), out_a.shape[-1], out.data_ptr(), lse.data_ptr())
    return out, lse
