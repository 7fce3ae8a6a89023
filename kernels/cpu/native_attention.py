"""Both halves of cascade decode attention in C, on a CPU:
- the private (paged) half reads keys and values in place from the paged cache, where the fused
  SDPA path first gathers them into a padded batch and masks the padding (kernels/cpu/csrc/paged_decode.c);
- the shared-prefix half scores every row that shares the trunk against it in register tiles,
  spread over the threads by chunks of keys (kernels/cpu/csrc/prefix_attention.c).
See `swarm bench-decode`. Other dtypes and shapes go to the SDPA path (kernels.cpu.sdpa_attention).
Prompt rows run through csrc/rows_attention.c (RowsKernel). The C functions run as the ops swarm::paged_decode,
swarm::prefix_attention, swarm::rows_attention, swarm::rows_attention_running and swarm::merge_attention
(kernels.cpu.ops).
"""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass

import torch

from kernels.cpu import entry_points, ops, sdpa_attention
from kernels.reference import cascade_attention, paged_attention


def available() -> bool:
    return all(entry_points.library(source) is not None
               for source in ("paged_decode", "prefix_attention", "rows_attention"))


def takes_c(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bf16: bool = False) -> bool:
    """Whether the C kernels take these: float32 on a CPU, heads a multiple of 8 wide; keys and values in bfloat16
    too where the products are bfloat16 (bf16)."""
    kv_dtypes = (torch.float32, torch.bfloat16) if bf16 else (torch.float32,)
    return (q.dtype == torch.float32 and k.dtype == v.dtype and k.dtype in kv_dtypes and q.device.type == "cpu"
            and q.shape[-1] % 8 == 0)


def write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Contract of kernels.reference.paged_attention.write_kv. A bfloat16 pool on a CPU takes float32 K and V rounded
    in C, as the bfloat16 products round float32 ones (bf16_bits): a row's attention gets the same bits from the
    pool in bfloat16 as from the pool in float32."""
    if k_cache.dtype == torch.bfloat16 and k.dtype == torch.float32 and k.device.type == "cpu":
        ops.write_kv(k_cache, v_cache, k.contiguous(), v.contiguous(), slot_mapping.to(torch.int64).contiguous())
        return
    paged_attention.write_kv(k_cache, v_cache, k, v, slot_mapping)


def prefix_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                     library: ctypes.CDLL | None = None):
    """Contract of kernels.reference.cascade_attention.prefix_attention; float32 CPU tensors only, others go
    to the SDPA path. library: tests pass other builds of the kernel."""
    if not (takes_c(q, k, v) and len(k) > 0):
        return sdpa_attention.prefix_attention(q, k, v, scale)
    return ops.prefix_attention(q.contiguous(), k.contiguous(), v.contiguous(), scale, library=library)


def rows_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool,
                   library: ctypes.CDLL | None = None, bf16: bool = False, int8: bool = False):
    """Prefill rows q [tokens, heads, dim] over one span of keys k, v [keys, kv_heads, dim]
    -> out (float32) [tokens, heads, dim], lse [tokens, heads]. causal: the tokens are the span's
    last ones, each seeing the keys up to its own (sdpa_attention.causal_tail_with_lse's
    contract); otherwise every token sees every key (sdpa_attention.prefix_attention's).
    bf16: both products in bfloat16 summed in float32 (csrc/rows_attention.c), the rest float32. int8: both in
    integers (csrc/rows_attention_i8.h; heads whose size is no multiple of 32 take bfloat16).
    float32 CPU tensors only (k and v in bfloat16 too, with bf16 or int8), others go to the SDPA path. library:
    tests pass other builds."""
    if not (takes_c(q, k, v, bf16 or int8) and len(k) >= len(q) * causal and len(k) > 0):
        return sdpa_attention.rows_attention(q, k, v, scale, causal)
    return ops.rows_attention(q.contiguous(), k.contiguous(), v.contiguous(), scale, causal, bf16, None, int8,
                              library=library)


@dataclass(frozen=True, slots=True)
class RowsKernel:
    """The C kernel for prompt rows in one precision of products (bf16: bfloat16 where this build multiplies them
    natively, float32 elsewhere; int8: integers where this build multiplies them natively, else as bf16).
    Called, rows_attention's contract. A prompt's keys split at a multiple of
    chunk_keys() give each row the same bits in two calls as in one: `running` over the keys before the split,
    every row seeing all of them, then `continued` from there (csrc/rows_attention.c's running states)."""

    bf16: bool = False
    int8: bool = False

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool):
        return rows_attention(q, k, v, scale, causal, bf16=self._bf16(), int8=self._int8())

    def splits(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
        """Whether `running` and `continued` take these rows over these caches' keys."""
        return takes_c(q, k_cache, v_cache, self._bf16() or self._int8())

    def running(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Each row's running state over all of k, v: [tokens, heads, dim + 2]."""
        return ops.rows_attention_running(q.contiguous(), k.contiguous(), v.contiguous(), scale, self._bf16(),
                                          self._int8())

    def continued(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, running: torch.Tensor):
        """out, lse of the rows q, the span's last ones, causal over the keys before (their `running` states)
        and k, v."""
        return ops.rows_attention(q.contiguous(), k.contiguous(), v.contiguous(), scale, True, self._bf16(),
                                  running.contiguous(), self._int8())

    def _bf16(self) -> bool:
        return (self.bf16 or self.int8) and bf16_products_native()

    def _int8(self) -> bool:
        return self.int8 and int8_products_native()


@functools.cache
def chunk_keys() -> int:
    """The keys of one chunk of rows_attention's: a split at a multiple of it keeps a row's bits."""
    return entry_points.library("rows_attention").swarm_rows_attention_chunk()


def rows_attention_bf16_native(library: ctypes.CDLL | None = None) -> bool:
    """Whether rows_attention's bfloat16 products run on AVX512-BF16 in this build (library: another build)."""
    library = library or entry_points.library("rows_attention")
    return library is not None and library.swarm_rows_attention_bf16_native() == 1


def rows_attention_int8_native(library: ctypes.CDLL | None = None) -> bool:
    """Whether rows_attention's integer products run on AVX512-VNNI in this build (library: another build)."""
    library = library or entry_points.library("rows_attention")
    return library is not None and library.swarm_rows_attention_int8_native() == 1


@functools.cache
def int8_products_native() -> bool:
    """Whether RowsKernel(int8=True) multiplies in integers in this process (else as bf16=True does)."""
    return rows_attention_int8_native()


@functools.cache
def bf16_products_native() -> bool:
    """Whether RowsKernel(bf16=True) multiplies in bfloat16 in this process: where the plain-C products would
    cost more than they save, it stays float32."""
    return rows_attention_bf16_native()


def paged_decode_with_lse(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                          block_tables: torch.Tensor, lengths: torch.Tensor, scale: float,
                          library: ctypes.CDLL | None = None, given: TrunkChunks | None = None, bf16: bool = False):
    """Contract of kernels.reference.cascade_attention.paged_decode_with_lse; float32 CPU tensors only,
    others go to the SDPA path. given: the chunks of a trunk before each row's table (trunk_chunks', in the same
    precision), merged with the row's own in one pass. bf16: both products in bfloat16 summed in float32
    (csrc/decode_bf16.h; its oracle: kernels.reference.decode_bf16); the caches may then hold bfloat16. library:
    tests pass other builds."""
    if not (takes_c(q, k_cache, v_cache, bf16) and k_cache.is_contiguous() and v_cache.is_contiguous()):
        if given is not None:
            raise ValueError("a trunk's chunks go with the C kernel's float32 CPU tensors")
        return sdpa_attention.paged_decode_with_lse(q, k_cache, v_cache, block_tables, lengths, scale)
    tables = block_tables.to(torch.int64).contiguous()
    partials, counts = (None, None) if given is None else (given.partials, given.counts)
    return ops.paged_decode(q.contiguous(), k_cache, v_cache, tables, lengths.to(torch.int64).contiguous(), scale,
                            partials, counts, bf16, library=library)


@dataclass(frozen=True, slots=True)
class TrunkChunks:
    """The partials (max, sum, unnormalised output) of each row's trunk chunks, [batch, chunks, heads, dim + 2], and
    how many of them each row takes ([batch]; 0 for a row that reads no trunk)."""
    partials: torch.Tensor
    counts: torch.Tensor


def decode_chunk() -> int:
    """The keys of one chunk of the decode kernels': a trunk cut at a multiple of it gives each row the bits of its
    whole context read by paged_decode_with_lse alone."""
    return entry_points.library("prefix_attention").swarm_prefix_chunk()


def trunk_chunks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
                 library: ctypes.CDLL | None = None, bf16: bool = False) -> torch.Tensor:
    """Rows q [batch, heads, dim] over a trunk k, v [keys, kv_heads, dim]: each chunk's partials [batch, chunks,
    heads, dim + 2], with the bits paged_decode_with_lse gives those chunks in the same precision (bf16). Where
    the trunk is whole chunks (decode_chunk()), a row's attention merged with these gets the bits of its whole
    context read alone."""
    return ops.prefix_partials(q.contiguous(), k.contiguous(), v.contiguous(), scale, bf16, library=library)


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor):
    """Contract of kernels.reference.cascade_attention.merge_attention, in one C loop instead of a dozen small
    torch ops; float32 CPU tensors only, others go to the torch version."""
    tensors = (out_a, lse_a, out_b, lse_b)
    if not (all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)
            and out_a.shape == out_b.shape and lse_a.shape == lse_b.shape == out_a.shape[:-1]):
        return cascade_attention.merge_attention(*tensors)
    return ops.merge_attention(*(t.contiguous() for t in tensors))
