"""The kernel sets one attention forward runs on: the PyTorch reference (the oracle), the CPU kernels
(torch's fused CPU attention, and swarm's C kernels) and Triton. Each is data, not a loop: the same
forward (engine.attention.cascade) runs over any of them.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kernels.cpu import cascade_prefill, native_attention, sdpa_attention
from kernels.reference import cascade_attention, paged_attention


@dataclass(frozen=True, slots=True)
class AttentionKernels:
    """One implementation of each piece (contracts: kernels.reference.cascade_attention)."""

    name: str
    write_kv: Callable[..., None]
    paged_decode_with_lse: Callable
    prefix_attention: Callable
    merge_attention: Callable
    prefill: Callable = paged_attention.prefill_attention   # every new token, causal over its paged context
    cascade_prefill: Callable | None = None   # prompts continuing one cached trunk read it together; None: not
    prefill_rows: Callable | None = None   # the CPU prefills' rows kernel (native_attention.RowsKernel); None: SDPA
    prefill_rows_bf16: Callable | None = None   # the same in bfloat16 products, for steps in bfloat16; None: none
    prefill_rows_int8: Callable | None = None   # the same in integer products, for steps in integers; None: none
    trunk_chunks: Callable | None = None   # a trunk's chunks' partials for paged_decode_with_lse's `given`, so that
                                           # a row gets the bits of its whole context read alone; None: merged by lse
    decode_chunk: Callable[[], int] | None = None   # the keys of those chunks: a shared trunk is cut at a multiple
    decode_bf16: bool = False   # paged_decode_with_lse and trunk_chunks take bf16=True: bfloat16 products
    bf16_pool: bool = False     # a pool in bfloat16 is read by every piece's bfloat16 products, and write_kv rounds
                                # into it as they round float32 keys and values: the same bits in half the bytes


REFERENCE_KERNELS = AttentionKernels("torch", paged_attention.write_kv, cascade_attention.paged_decode_with_lse,
                                     cascade_attention.prefix_attention, cascade_attention.merge_attention)
SDPA_KERNELS = AttentionKernels("sdpa", paged_attention.write_kv, sdpa_attention.paged_decode_with_lse,
                                sdpa_attention.prefix_attention, cascade_attention.merge_attention,
                                cascade_prefill=cascade_prefill.prefill_attention)
NATIVE_KERNELS = AttentionKernels("native", native_attention.write_kv, native_attention.paged_decode_with_lse,
                                  native_attention.prefix_attention, native_attention.merge_attention,
                                  cascade_prefill=cascade_prefill.prefill_attention,
                                  prefill_rows=native_attention.RowsKernel(),
                                  prefill_rows_bf16=native_attention.RowsKernel(bf16=True),
                                  prefill_rows_int8=native_attention.RowsKernel(int8=True),
                                  trunk_chunks=native_attention.trunk_chunks,
                                  decode_chunk=native_attention.decode_chunk, decode_bf16=True, bf16_pool=True)


def triton_kernels() -> AttentionKernels:
    """Built on demand: kernels.triton reads TRITON_INTERPRET as it defines its kernels, and imports triton."""
    from kernels.triton import attention as triton_attention
    from kernels.triton import prefill as triton_prefill

    return AttentionKernels("triton", triton_attention.write_kv, triton_attention.paged_decode_with_lse,
                            triton_attention.prefix_attention, triton_attention.merge_attention,
                            prefill=triton_prefill.prefill_attention,
                            cascade_prefill=triton_prefill.cascade_prefill_attention)
