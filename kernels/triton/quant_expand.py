"""Expanding GGUF blocks to float32 inside a Triton program: `expand_tile` gives the weights of a tile
[BLOCK_N rows, BLOCK_K columns] straight from the file's bytes (layouts of ggml-common.h), and
`dequantize_kernel` writes whole weights with it (the exactness check, and a scratch fallback).

A tile is built as [BLOCK_N, groups, GROUP] and then flattened, so what a group of GROUP values
shares (the fp16 scale, a K-quant's sub-block scale and min) is loaded once a group, not once a value:

    columns  k0 ........................................ k0 + BLOCK_K
             | group 0 (GROUP values) | group 1 | ... |        GROUP = 16 for Q6_K, else 32
    bytes    row * row_bytes + (column // BLOCK_VALUES) * BLOCK_BYTES + offset inside the block

Bytes are loaded as bytes (a Q4_0 block is 18 bytes, so its fields are at best 2-byte aligned) and an
fp16 is two of them combined and bitcast; where Triton can prove alignment (row bytes a multiple of
16, which it specializes on, and 144- or 176-byte K-quant blocks) it merges a group's bytes into
vector loads by itself. The float32 operations follow gguf.quants in kind and order, and every
product is exact in float32 (at most 11 + 8 + 6 significant bits; so a fused multiply-add rounds
the same), hence each value is bit for bit gguf's.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def expand_tile(blocks_ptr, rows, row_ok, row_bytes, k0, cols,
                FORMAT: tl.constexpr, BLOCK_VALUES: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """float32 [BLOCK_N, BLOCK_K]: the weights of `rows` at columns k0 .. k0 + BLOCK_K, 0 where a row
    is not `row_ok` or a column is past `cols`. k0 and BLOCK_K are multiples of GROUP."""
    g = tl.arange(0, BLOCK_K // GROUP)[None, :, None]
    v = tl.arange(0, GROUP)[None, None, :]
    first = k0 + g * GROUP
    block = blocks_ptr + rows.to(tl.int64)[:, None, None] * row_bytes + (first // BLOCK_VALUES) * BLOCK_BYTES
    ok = row_ok[:, None, None] & (first < cols)
    j0 = first % BLOCK_VALUES
    if FORMAT == "Q8_0":
        values = _q8_0(block, ok, v)
    elif FORMAT == "Q4_0":
        values = _q4_0(block, ok, v)
    elif FORMAT == "Q4_1":
        values = _q4_1(block, ok, v)
    elif FORMAT == "Q5_0":
        values = _q5_0(block, ok, v)
    elif FORMAT == "Q5_1":
        values = _q5_1(block, ok, v)
    elif FORMAT == "Q4_K":
        values = _q4_k(block, ok, j0, v)
    elif FORMAT == "Q5_K":
        values = _q5_k(block, ok, j0, v)
    else:
        tl.static_assert(FORMAT == "Q6_K", "expand_tile has no code for this format")
        values = _q6_k(block, ok, j0, v)
    return tl.reshape(values, (BLOCK_N, BLOCK_K))


@triton.jit
def dequantize_kernel(blocks_ptr, out_ptr, n, cols, row_bytes, so_n, so_k,
                      FORMAT: tl.constexpr, BLOCK_VALUES: tl.constexpr, BLOCK_BYTES: tl.constexpr,
                      GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Grid (n tiles, k tiles): one tile of the weight, expanded and stored in out's dtype."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    k0 = tl.program_id(1) * BLOCK_K
    k = k0 + tl.arange(0, BLOCK_K)
    row_ok = rows < n
    values = expand_tile(blocks_ptr, rows, row_ok, row_bytes, k0, cols,
                         FORMAT, BLOCK_VALUES, BLOCK_BYTES, GROUP, BLOCK_N, BLOCK_K)
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * so_n + k[None, :] * so_k,
             values.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & (k < cols)[None, :])


@triton.jit
def _byte(ptr, ok):
    return tl.load(ptr, mask=ok, other=0).to(tl.int32)


@triton.jit
def _half(ptr, ok):
    """The little-endian fp16 at ptr, as float32."""
    low = tl.load(ptr, mask=ok, other=0).to(tl.uint16)
    high = tl.load(ptr + 1, mask=ok, other=0).to(tl.uint16)
    return (low | (high << 8)).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _nibble(qs_ptr, ok, v):
    """32-value blocks: value v is the low nibble of byte v for v < 16, the high one of byte v - 16."""
    return (_byte(qs_ptr + v % 16, ok) >> (v // 16 * 4)) & 0xF


@triton.jit
def _high_bit(qh_ptr, ok, v):
    """Q5_0 / Q5_1: bit v of the little-endian uint32 at qh_ptr."""
    return (_byte(qh_ptr + v // 8, ok) >> (v % 8)) & 1


@triton.jit
def _q8_0(block, ok, v):
    d = _half(block, ok)
    q = tl.load(block + 2 + v, mask=ok, other=0).to(tl.int8, bitcast=True).to(tl.float32)
    return q * d


@triton.jit
def _q4_0(block, ok, v):
    d = _half(block, ok)
    return d * (_nibble(block + 2, ok, v) - 8).to(tl.float32)


@triton.jit
def _q4_1(block, ok, v):
    d, m = _half(block, ok), _half(block + 2, ok)
    return d * _nibble(block + 4, ok, v).to(tl.float32) + m


@triton.jit
def _q5_0(block, ok, v):
    d = _half(block, ok)
    q = _nibble(block + 6, ok, v) | (_high_bit(block + 2, ok, v) << 4)
    return d * (q - 16).to(tl.float32)


@triton.jit
def _q5_1(block, ok, v):
    d, m = _half(block, ok), _half(block + 2, ok)
    q = _nibble(block + 8, ok, v) | (_high_bit(block + 4, ok, v) << 4)
    return d * q.to(tl.float32) + m


@triton.jit
def _k_scale_min(scales_ptr, ok, sub):
    """Q4_K / Q5_K: the 6-bit scale and min of sub-block `sub` (0..7), packed in 12 bytes:
    bytes 0-3 hold scales 0-3 (low 6 bits) and the high 2 bits of scales 4-7, bytes 4-7 the same for
    the mins, bytes 8-11 the low 4 bits of scales 4-7 (low nibble) and of mins 4-7 (high nibble)."""
    i = sub % 4
    a, b, c = _byte(scales_ptr + i, ok), _byte(scales_ptr + 4 + i, ok), _byte(scales_ptr + 8 + i, ok)
    low = sub < 4
    scale = tl.where(low, a & 0x3F, (c & 0xF) | ((a >> 6) << 4))
    min_ = tl.where(low, b & 0x3F, (c >> 4) | ((b >> 6) << 4))
    return scale.to(tl.float32), min_.to(tl.float32)


@triton.jit
def _k_low_nibble(qs_ptr, ok, j0, v):
    """Q4_K / Q5_K: each 32 bytes of qs hold two sub-blocks, the first in low nibbles."""
    return (_byte(qs_ptr + j0 // 64 * 32 + v, ok) >> (j0 // 32 % 2 * 4)) & 0xF


@triton.jit
def _q4_k(block, ok, j0, v):
    d, dmin = _half(block, ok), _half(block + 2, ok)
    scale, min_ = _k_scale_min(block + 4, ok, j0 // 32)
    q = _k_low_nibble(block + 16, ok, j0, v).to(tl.float32)
    return (d * scale) * q - dmin * min_


@triton.jit
def _q5_k(block, ok, j0, v):
    d, dmin = _half(block, ok), _half(block + 2, ok)
    scale, min_ = _k_scale_min(block + 4, ok, j0 // 32)
    high = (_byte(block + 16 + v, ok) >> (j0 // 32)) & 1
    q = (_k_low_nibble(block + 48, ok, j0, v) | (high << 4)).to(tl.float32)
    return (d * scale) * q - dmin * min_


@triton.jit
def _q6_k(block, ok, j0, v):
    """Value j: low 4 bits from ql (128 bytes, 64 a half of the block, low then high nibbles), high
    2 bits from qh (64 bytes, 32 a half, four 2-bit fields a byte), an int8 scale per 16 values."""
    j = j0 + v
    low = (_byte(block + j0 // 128 * 64 + j % 64, ok) >> (j0 // 64 % 2 * 4)) & 0xF
    high = (_byte(block + 128 + j0 // 128 * 32 + j % 32, ok) >> (j0 // 32 % 4 * 2)) & 0x3
    scale = tl.load(block + 192 + j0 // 16, mask=ok, other=0).to(tl.int8, bitcast=True).to(tl.float32)
    d = _half(block + 208, ok)
    return (d * scale) * ((low | (high << 4)) - 32).to(tl.float32)
