"""The GPU path of decode attention: Triton launchers with the signatures and return conventions
of `kernels.reference.paged_attention.write_kv` and the functions of `kernels.reference.cascade_attention`.

Long contexts are split across programs so a small batch still fills the GPU; the splits'
partial (out, lse) are merged by log-sum-exp in `reduce_splits_kernel`:

    keys  [ split 0 | split 1 | ... ]   each split_len tokens, a multiple of TILE_N
            out_0,     out_1,            -> out = sum_i out_i e^(lse_i - lse),
            lse_0      lse_1                lse = log sum_i e^lse_i

Under TRITON_INTERPRET=1 the kernels run on CPU tensors (slowly): that is how they are tested.
"""
from __future__ import annotations

import functools

import torch
import triton

from kernels.triton import interpreted
from kernels.triton.decode import merge_kernel, paged_decode_kernel, prefix_kernel, reduce_splits_kernel
from kernels.triton.kv_write import write_kv

__all__ = ["write_kv", "paged_decode_with_lse", "prefix_attention", "merge_attention"]

TILE_N = 64                 # keys per step of the online softmax
MIN_DOT = 16                # smallest tl.dot dimension on GPUs
MAX_BLOCK_M = 64            # prefix query rows (rows x group) per program
MIN_SPLIT_TOKENS = 256      # never split a context into pieces shorter than this
LOG2E = 1.4426950408889634
INTERPRETED = interpreted()   # read once, as Triton reads it when this module defines its kernels


def paged_decode_with_lse(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, lengths: torch.Tensor, scale: float, *,
                          num_splits: int | None = None):
    """Each query attends to the first `lengths[i]` tokens of its own block table.

    Returns out [batch, heads, dim] (float32) and lse [batch, heads]; a row with length 0
    gets lse = -inf and out = 0, so merging ignores it.
    """
    batch, heads, dim = q.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = _check_shapes(q, k_cache, kv_heads, block_size)
    split_len, splits = _splits(block_tables.shape[1] * block_size, batch * kv_heads, q.device, num_splits)
    part_out, part_lse = _partials(batch, heads, splits, dim, q.device)
    if batch == 0:
        return part_out[:, :, 0], part_lse[:, :, 0]
    paged_decode_kernel[(batch, kv_heads, splits)](
        q, k_cache, v_cache, block_tables, lengths, part_out, part_lse,
        scale * LOG2E, split_len, heads, dim, *q.stride(), *k_cache.stride(), *v_cache.stride(),
        *block_tables.stride(),
        GROUP=group, GROUP_P=max(MIN_DOT, triton.next_power_of_2(group)), DIM_P=_dim_p(dim),
        BLOCK_SIZE=block_size, TILE_N=TILE_N, UPCAST=INTERPRETED)
    return _reduce(part_out, part_lse)


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, *,
                     num_splits: int | None = None):
    """Every query attends to all of one shared prefix (no mask).

    q: [batch, heads, dim]; k, v: [prefix_len, kv_heads, dim].
    Returns out [batch, heads, dim] (float32) and lse [batch, heads].
    """
    batch, heads, dim = q.shape
    prefix_len, kv_heads = k.shape[0], k.shape[1]
    assert v.shape == k.shape and k.shape[2] == dim, f"prefix K {tuple(k.shape)}, V {tuple(v.shape)}, q dim {dim}"
    group = _check_group(heads, kv_heads)
    block_m = min(MAX_BLOCK_M, max(MIN_DOT, triton.next_power_of_2(batch * group)))
    m_tiles = triton.cdiv(batch * group, block_m)
    split_len, splits = _splits(prefix_len, kv_heads * m_tiles, q.device, num_splits)
    part_out, part_lse = _partials(batch, heads, splits, dim, q.device)
    if batch == 0 or prefix_len == 0:
        part_lse.fill_(float("-inf"))
        return part_out.zero_()[:, :, 0], part_lse[:, :, 0]
    prefix_kernel[(kv_heads, m_tiles, splits)](
        q, k, v, part_out, part_lse,
        scale * LOG2E, split_len, prefix_len, batch, heads, dim, *q.stride(), *k.stride(), *v.stride(),
        GROUP=group, BLOCK_M=block_m, DIM_P=_dim_p(dim), TILE_N=TILE_N, UPCAST=INTERPRETED)
    return _reduce(part_out, part_lse)


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """Combine two softmax pieces over disjoint key sets, in float32."""
    assert out_a.shape == out_b.shape and lse_a.shape == lse_b.shape == out_a.shape[:-1]
    dim = out_a.shape[-1]
    out = torch.empty(out_a.shape, dtype=torch.float32, device=out_a.device)
    lse = torch.empty(lse_a.shape, dtype=torch.float32, device=out_a.device)
    count = lse.numel()
    if count == 0:
        return out, lse
    block_r = 16
    merge_kernel[(triton.cdiv(count, block_r),)](
        out_a.contiguous(), lse_a.contiguous(), out_b.contiguous(), lse_b.contiguous(), out, lse, count, dim,
        BLOCK_R=block_r, DIM_P=_dim_p(dim))
    return out, lse


def _check_shapes(q, k_cache, kv_heads, block_size) -> int:
    assert block_size & (block_size - 1) == 0, f"block_size {block_size} is not a power of two"
    assert k_cache.shape[3] == q.shape[2], f"head_dim {q.shape[2]} against a pool of {k_cache.shape[3]}"
    return _check_group(q.shape[1], kv_heads)


def _check_group(heads: int, kv_heads: int) -> int:
    assert heads % kv_heads == 0, f"{heads} query heads do not split over {kv_heads} KV heads"
    return heads // kv_heads


def _dim_p(dim: int) -> int:
    return max(MIN_DOT, triton.next_power_of_2(dim))


def _partials(batch, heads, splits, dim, device):
    out = torch.empty(batch, heads, splits, dim, dtype=torch.float32, device=device)
    lse = torch.empty(batch, heads, splits, dtype=torch.float32, device=device)
    return out, lse


def _reduce(part_out: torch.Tensor, part_lse: torch.Tensor):
    batch, heads, splits, dim = part_out.shape
    if splits == 1:
        return part_out[:, :, 0], part_lse[:, :, 0]
    out = torch.empty(batch, heads, dim, dtype=torch.float32, device=part_out.device)
    lse = torch.empty(batch, heads, dtype=torch.float32, device=part_out.device)
    reduce_splits_kernel[(batch * heads,)](part_out, part_lse, out, lse, splits, dim,
                                           SPLITS_P=triton.next_power_of_2(splits), DIM_P=_dim_p(dim))
    return out, lse


def _splits(max_tokens: int, programs: int, device: torch.device, num_splits: int | None) -> tuple[int, int]:
    """(split_len, splits) covering max_tokens; by default enough programs for two per SM."""
    max_tokens = max(max_tokens, 1)
    if num_splits is None:
        wanted = triton.cdiv(2 * _multiprocessors(device), max(programs, 1))
        num_splits = max(1, min(wanted, max_tokens // MIN_SPLIT_TOKENS))
    split_len = triton.cdiv(triton.cdiv(max_tokens, num_splits), TILE_N) * TILE_N
    return split_len, triton.cdiv(max_tokens, split_len)


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type != "cuda":
        return 1
    return torch.cuda.get_device_properties(device).multi_processor_count
