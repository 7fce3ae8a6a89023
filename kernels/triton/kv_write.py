"""Triton kernel that stores this step's new K/V into the paged pool (the GPU `write_kv`).

Flat slot s is block s // block_size, offset s % block_size of a pool shaped
[num_blocks, block_size, kv_heads, head_dim]; values are cast to the pool's dtype.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store new K/V ([tokens, kv_heads, head_dim]) at flat slots block_id * B + offset."""
    tokens, kv_heads, dim = k.shape
    block_size = k_cache.shape[1]
    assert block_size & (block_size - 1) == 0, f"block_size {block_size} is not a power of two"
    assert k_cache.shape[2:] == (kv_heads, dim) and v.shape == k.shape, "K/V shapes do not match the pool"
    if tokens == 0:
        return
    write_kv_kernel[(tokens,)](
        k, v, k_cache, v_cache, slot_mapping, kv_heads, dim,
        *k.stride(), *v.stride(), *k_cache.stride(), *v_cache.stride(),
        BLOCK_SIZE=block_size, HEADS_P=triton.next_power_of_2(kv_heads), DIM_P=triton.next_power_of_2(dim))


@triton.jit
def write_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slots_ptr, kv_heads, dim,
                    sk_t, sk_h, sk_d, sv_t, sv_h, sv_d,
                    skc_b, skc_s, skc_h, skc_d, svc_b, svc_s, svc_h, svc_d,
                    BLOCK_SIZE: tl.constexpr, HEADS_P: tl.constexpr, DIM_P: tl.constexpr):
    """One program per new token: its [kv_heads, dim] K and V into its flat slot."""
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t)
    h, d = tl.arange(0, HEADS_P)[:, None], tl.arange(0, DIM_P)[None, :]
    ok = (h < kv_heads) & (d < dim)
    block, offset = slot // BLOCK_SIZE, slot % BLOCK_SIZE
    k = tl.load(k_ptr + t * sk_t + h * sk_h + d * sk_d, mask=ok, other=0.0)
    v = tl.load(v_ptr + t * sv_t + h * sv_h + d * sv_d, mask=ok, other=0.0)
    tl.store(k_cache_ptr + block * skc_b + offset * skc_s + h * skc_h + d * skc_d,
             k.to(k_cache_ptr.dtype.element_ty), mask=ok)
    tl.store(v_cache_ptr + block * svc_b + offset * svc_s + h * svc_h + d * svc_d,
             v.to(v_cache_ptr.dtype.element_ty), mask=ok)
