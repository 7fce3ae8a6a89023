"""The C kernels' entry points (kernels/cpu/csrc/*.c), called with tensors: one plain function per entry point
that checks its tensors (kernels.cpu.checks), allocates its outputs and calls the C function (its ctypes types:
kernels.cpu.signatures) with sizes read off the tensors.

Each function takes the loaded library first (`library(source)`; tests pass other builds of the same
source) and the tensors in the order of its torch op (kernels.cpu.ops). `<name>_outputs` checks the
arguments and returns the empty outputs: the op's fake implementation, for tracing, is that function.
"""
from __future__ import annotations

import ctypes
import functools

import torch
from gguf import GGMLQuantizationType

from kernels.cpu import native
from kernels.cpu.checks import expect_optional, expect_rank, expect_tensor, kv_dtype, refusal
from kernels.cpu.signatures import SIGNATURES, declare
from kernels.reference.quant_blocks import block_layout

_ptr, _i64, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
# The block formats quant_matmul.c reads: name -> (GGML type code, values a block, bytes a block)
QUANT_FORMATS = {name: (GGMLQuantizationType[name].value, *block_layout(name))
                 for name in ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")}
FORMAT_OF_CODE = {code: name for name, (code, _, _) in QUANT_FORMATS.items()}

Tensor = torch.Tensor


@functools.cache
def library(source: str) -> ctypes.CDLL | None:
    """csrc/<source>.c built and loaded with its functions declared; None where it cannot be built."""
    lib = native.load(source)
    return None if lib is None else declare(lib, SIGNATURES[source])


def rms_norm_outputs(x: Tensor, weight: Tensor) -> Tensor:
    expect_rank("rms_norm", "x", x, max(x.dim(), 1))   # any rank from 1 up
    if x.shape[-1] == 0:
        raise refusal("rms_norm", "x", "must have a last dimension of at least 1")
    expect_tensor("rms_norm", "weight", weight, (x.shape[-1],))
    return torch.empty_like(x)


def rms_norm(lib: ctypes.CDLL, x: Tensor, weight: Tensor, eps: float) -> Tensor:
    out = rms_norm_outputs(x, weight)
    dim = x.shape[-1]
    lib.swarm_rms_norm(x.data_ptr(), weight.data_ptr(), x.numel() // dim, dim, eps, out.data_ptr(),
                       torch.get_num_threads())
    return out


def silu_mul_outputs(gate: Tensor, up: Tensor) -> Tensor:
    expect_rank("silu_mul", "gate", gate, max(gate.dim(), 1))   # any rank from 1 up
    expect_tensor("silu_mul", "up", up, gate.shape)
    return torch.empty_like(gate)


def silu_mul(lib: ctypes.CDLL, gate: Tensor, up: Tensor) -> Tensor:
    out = silu_mul_outputs(gate, up)
    lib.swarm_silu_mul(gate.data_ptr(), up.data_ptr(), gate.numel(), out.data_ptr(), torch.get_num_threads())
    return out


def rotary_outputs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    expect_rank("rotary", "x", x, 3)
    tokens, _, dim = x.shape
    if dim % 2:
        raise refusal("rotary", "x", f"must have an even head width, got {dim}")
    expect_tensor("rotary", "cos", cos, (tokens, dim))
    expect_tensor("rotary", "sin", sin, (tokens, dim))
    return torch.empty_like(x)


def rotary(lib: ctypes.CDLL, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    out = rotary_outputs(x, cos, sin)
    tokens, heads, dim = x.shape
    lib.swarm_rotary(x.data_ptr(), tokens, heads, dim, cos.data_ptr(), sin.data_ptr(), out.data_ptr(),
                     torch.get_num_threads())
    return out


def quant_matmul_outputs(x: Tensor, blocks: Tensor, format: str, cols: int, bias: Tensor | None,
                         op: str = "quant_matmul") -> Tensor:
    rows = _expect_blocks(op, blocks, format, cols)
    expect_optional(op, "bias", bias, (rows,))
    expect_rank(op, "x", x, 2)
    if x.shape[1] != cols:
        raise refusal(op, "x", f"has {x.shape[1]} columns, the weight {cols}")
    return x.new_empty(x.shape[0], rows)


def quant_matmul(lib: ctypes.CDLL, x: Tensor, blocks: Tensor, format: str, cols: int, bias: Tensor | None) -> Tensor:
    out = quant_matmul_outputs(x, blocks, format, cols, bias)
    lib.swarm_quant_matmul(x.data_ptr(), x.shape[0], cols, blocks.data_ptr(), QUANT_FORMATS[format][0],
                           blocks.shape[0], _ptr_or_null(bias), out.data_ptr(), torch.get_num_threads())
    return out


def quant_matmul_many_outputs(x: Tensor, blocks: list[Tensor], codes: list[int], cols: int,
                              biases: list[Tensor | None], bf16: bool = False) -> list[Tensor]:
    """codes: each weight's format as its GGML type code (an op takes no list of names)"""
    if not len(blocks) == len(codes) == len(biases) > 0:
        raise refusal("quant_matmul_many", "blocks", f"holds {len(blocks)} weights: codes and biases need as many, "
                                                     f"got {len(codes)} and {len(biases)}")
    if unknown := set(codes) - set(FORMAT_OF_CODE):
        raise refusal("quant_matmul_many", "codes", f"holds {sorted(unknown)}, not a format the kernel reads")
    return [quant_matmul_outputs(x, weight, FORMAT_OF_CODE[code], cols, bias, "quant_matmul_many")
            for weight, code, bias in zip(blocks, codes, biases)]


def quant_matmul_many(lib: ctypes.CDLL, x: Tensor, blocks: list[Tensor], codes: list[int], cols: int,
                      biases: list[Tensor | None], bf16: bool = False) -> list[Tensor]:
    """[x @ W.T + bias for each weight's blocks, format code and bias], every weight's columns in one call; bf16:
    in bfloat16 products summed in float32, by a build of csrc/quant_matmul_bf16.c (_bf16_library)"""
    outs = quant_matmul_many_outputs(x, blocks, codes, cols, biases)
    count = len(blocks)
    call = _bf16_library(lib).swarm_quant_matmul_many_bf16 if bf16 else lib.swarm_quant_matmul_many
    failed = call(x.data_ptr(), x.shape[0], cols, count, (_ptr * count)(*(b.data_ptr() for b in blocks)),
                  (_int * count)(*codes), (_i64 * count)(*(b.shape[0] for b in blocks)),
                  (_ptr * count)(*(_ptr_or_null(b) for b in biases)), (_ptr * count)(*(out.data_ptr() for out in outs)),
                  torch.get_num_threads())
    if failed:
        raise MemoryError("the quantized matmul could not allocate x's bfloat16 pairs")
    return outs


def _bf16_library(lib: ctypes.CDLL) -> ctypes.CDLL:
    """lib where it is a build of csrc/quant_matmul_bf16.c (tests pass other builds: declare() put its functions in
    its __dict__), else the one the process loads."""
    return lib if "swarm_quant_matmul_many_bf16" in vars(lib) else library("quant_matmul_bf16")


def quant_dequantize_outputs(blocks: Tensor, format: str, cols: int, out: Tensor) -> None:
    rows = _expect_blocks("quant_dequantize", blocks, format, cols)
    expect_tensor("quant_dequantize", "out", out, (rows, cols))


def quant_dequantize(lib: ctypes.CDLL, blocks: Tensor, format: str, cols: int, out: Tensor) -> None:
    quant_dequantize_outputs(blocks, format, cols, out)
    lib.swarm_quant_dequantize(blocks.data_ptr(), QUANT_FORMATS[format][0], blocks.shape[0], cols, out.data_ptr(),
                               torch.get_num_threads())


def _expect_blocks(op: str, blocks: Tensor, format: str, cols: int) -> int:
    """blocks: uint8 [rows, the bytes of `cols` values of `format`], a format the kernel reads -> rows."""
    layout = QUANT_FORMATS.get(format)
    if layout is None:
        raise refusal(op, "format", f"must be one of {', '.join(QUANT_FORMATS)}, got {format!r}")
    _, values, nbytes = layout
    if cols <= 0 or cols % values:
        raise refusal(op, "cols", f"must be a positive multiple of {values} for {format}, got {cols}")
    expect_rank(op, "blocks", blocks, 2, torch.uint8)
    expect_tensor(op, "blocks", blocks, (blocks.shape[0], cols // values * nbytes), torch.uint8)
    return blocks.shape[0]


def bf16_round_rows_outputs(x: Tensor) -> Tensor:
    expect_rank("bf16_round_rows", "x", x, 2)
    return torch.empty(x.shape[0], (x.shape[1] + 1) // 2, dtype=torch.int32)


def bf16_round_rows(lib: ctypes.CDLL, x: Tensor) -> Tensor:
    """x [M, K] float32 as bfloat16 pairs [M, ceil(K / 2)] (csrc/bf16_matmul.c's layout)"""
    pairs = bf16_round_rows_outputs(x)
    lib.swarm_bf16_round_rows(x.data_ptr(), x.shape[0], x.shape[1], pairs.data_ptr(), torch.get_num_threads())
    return pairs


def bf16_pack_weight_outputs(w: Tensor, out: Tensor) -> None:
    expect_rank("bf16_pack_weight", "w", w, 2)
    expect_tensor("bf16_pack_weight", "out", out, bf16_panels_shape(*w.shape), torch.int32)


def bf16_panels_shape(rows: int, cols: int) -> tuple[int, int, int]:
    """The panels of a weight [rows, cols]: [ceil(rows / 16), ceil(cols / 2), 16] int32"""
    return (rows + 15) // 16, (cols + 1) // 2, 16


def bf16_pack_weight(lib: ctypes.CDLL, w: Tensor, out: Tensor) -> None:
    """w [N, K] float32 as bfloat16 panels into out (bf16_panels_shape)"""
    bf16_pack_weight_outputs(w, out)
    lib.swarm_bf16_pack_weight(w.data_ptr(), w.shape[0], w.shape[1], out.data_ptr(), torch.get_num_threads())


def bf16_pack_quant_outputs(blocks: Tensor, format: str, cols: int, out: Tensor) -> None:
    rows = _expect_blocks("bf16_pack_quant", blocks, format, cols)
    expect_tensor("bf16_pack_quant", "out", out, bf16_panels_shape(rows, cols), torch.int32)


def bf16_pack_quant(lib: ctypes.CDLL, blocks: Tensor, format: str, cols: int, out: Tensor) -> None:
    """A weight's blocks [rows, bytes] (a format quant_matmul.c reads) as bfloat16 panels into out, the values
    those of quant_dequantize"""
    bf16_pack_quant_outputs(blocks, format, cols, out)
    lib.swarm_bf16_pack_quant(blocks.data_ptr(), QUANT_FORMATS[format][0], blocks.shape[1], blocks.shape[0], cols,
                              out.data_ptr(), torch.get_num_threads())


def bf16_matmul_outputs(pairs: Tensor, panels: Tensor, rows: int, bias: Tensor | None, out: Tensor,
                        first: int) -> None:
    op = "bf16_matmul"
    expect_rank(op, "pairs", pairs, 2, torch.int32)
    expect_rank(op, "panels", panels, 3, torch.int32)
    if not (panels.shape[1] == pairs.shape[1] and panels.shape[2] == 16 and 0 < rows <= 16 * panels.shape[0]
            and rows > 16 * (panels.shape[0] - 1)):
        raise refusal(op, "panels", f"must be [ceil({rows} / 16), {pairs.shape[1]}, 16], got {list(panels.shape)}")
    expect_optional(op, "bias", bias, (rows,))
    expect_rank(op, "out", out, 2)
    if not (out.shape[0] == pairs.shape[0] and 0 <= first and first + rows <= out.shape[1]):
        raise refusal(op, "out", f"must have {pairs.shape[0]} rows and columns [{first}, {first + rows}), "
                                 f"got {list(out.shape)}")


def bf16_matmul(lib: ctypes.CDLL, pairs: Tensor, panels: Tensor, rows: int, bias: Tensor | None, out: Tensor,
                first: int) -> None:
    """out[:, first:first + rows] = the pairs' rows @ the panels' `rows` weight rows .T + bias"""
    bf16_matmul_outputs(pairs, panels, rows, bias, out, first)
    lib.swarm_bf16_matmul(pairs.data_ptr(), pairs.shape[0], pairs.shape[1], panels.data_ptr(), rows,
                          _ptr_or_null(bias), out.data_ptr() + 4 * first, out.shape[1], torch.get_num_threads())


def paged_decode_outputs(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, lengths: Tensor,
                         given: Tensor | None = None, given_chunks: Tensor | None = None,
                         bf16: bool = False) -> tuple[Tensor, Tensor]:
    expect_rank("paged_decode", "q", q, 3)
    batch, heads, dim = q.shape
    cache_dtype = kv_dtype("paged_decode", "k_cache", k_cache, bf16)
    expect_rank("paged_decode", "k_cache", k_cache, 4, cache_dtype)
    _expect_heads("paged_decode", q, "k_cache", k_cache.shape[2:])
    expect_tensor("paged_decode", "v_cache", v_cache, k_cache.shape, cache_dtype)
    expect_rank("paged_decode", "block_tables", block_tables, 2, torch.int64)
    if block_tables.shape[0] != batch:
        raise refusal("paged_decode", "block_tables", f"must have a row for each of q's {batch} rows, "
                                                      f"got {block_tables.shape[0]}")
    expect_tensor("paged_decode", "lengths", lengths, (batch,), torch.int64)
    if (given is None) != (given_chunks is None):
        raise refusal("paged_decode", "given", "and given_chunks come together")
    if given is not None:
        expect_rank("paged_decode", "given", given, 4)
        expect_tensor("paged_decode", "given", given, (batch, given.shape[1], heads, dim + 2))
        expect_tensor("paged_decode", "given_chunks", given_chunks, (batch,), torch.int64)
    return q.new_empty(batch, heads, dim), q.new_empty(batch, heads)


def paged_decode(lib: ctypes.CDLL, q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                 lengths: Tensor, scale: float, given: Tensor | None = None, given_chunks: Tensor | None = None,
                 bf16: bool = False) -> tuple[Tensor, Tensor]:
    """given [batch, width, heads, dim + 2]: the partials of whole chunks before each table (prefix_partials', in
    the same precision), given_chunks[b] of them for row b, merged before the row's own chunks. bf16: the products
    in bfloat16 summed in float32 (csrc/decode_bf16.h). The caches hold float32, or bfloat16 (with bf16)."""
    out, lse = paged_decode_outputs(q, k_cache, v_cache, block_tables, lengths, given, given_chunks, bf16)
    batch, heads, dim = q.shape
    width = 0 if given is None else given.shape[1]
    if given is not None and not bool(((given_chunks >= 0) & (given_chunks <= width)).all()):
        raise refusal("paged_decode", "given_chunks", f"must each lie in [0, {width}]")
    failed = lib.swarm_paged_decode(q.data_ptr(), batch, heads, k_cache.shape[2], dim, k_cache.data_ptr(),
                                    v_cache.data_ptr(), k_cache.shape[1], block_tables.data_ptr(),
                                    block_tables.shape[1], lengths.data_ptr(), _ptr_or_null(given),
                                    _ptr_or_null(given_chunks), width, scale, int(bf16), _is_bf16(k_cache),
                                    out.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    if failed:
        raise MemoryError("paged decode attention could not allocate its scores")
    return out, lse


def check_write_kv(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slots: Tensor) -> None:
    expect_rank("write_kv", "k_cache", k_cache, 4, kv_dtype("write_kv", "k_cache", k_cache, True))
    expect_tensor("write_kv", "v_cache", v_cache, k_cache.shape, k_cache.dtype)
    rows, kv_width = k.shape[0], k_cache.shape[2] * k_cache.shape[3]
    expect_tensor("write_kv", "k", k, (rows, *k_cache.shape[2:]))
    expect_tensor("write_kv", "v", v, k.shape)
    expect_tensor("write_kv", "slots", slots, (rows,), torch.int64)
    if kv_width % 2:
        raise refusal("write_kv", "k_cache", f"must have an even row of kv_heads x head_dim, got {kv_width}")
    slot_count = k_cache.shape[0] * k_cache.shape[1]
    if rows and not bool(((slots >= 0) & (slots < slot_count)).all()):
        raise refusal("write_kv", "slots", f"must each lie in [0, {slot_count})")


def write_kv(lib: ctypes.CDLL, k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slots: Tensor) -> None:
    """New tokens' K and V [rows, kv_heads, dim] (float32) into the caches [blocks, block_size, kv_heads, dim] at
    their flat slots: copied into float32 caches, rounded to bfloat16 into bfloat16 ones, as the bfloat16 products
    round float32 keys and values (csrc/bf16_tiles.h's bf16_bits)."""
    check_write_kv(k_cache, v_cache, k, v, slots)
    lib.swarm_write_kv(k_cache.data_ptr(), v_cache.data_ptr(), k.data_ptr(), v.data_ptr(), slots.data_ptr(),
                       k.shape[0], k_cache.shape[2] * k_cache.shape[3], _is_bf16(k_cache))


def prefix_attention_outputs(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    return _rows_outputs("prefix_attention", q, k, v)


def prefix_attention(lib: ctypes.CDLL, q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    out, lse = prefix_attention_outputs(q, k, v)
    batch, heads, dim = q.shape
    failed = lib.swarm_prefix_attention(q.data_ptr(), batch, heads, k.shape[1], dim, k.data_ptr(), v.data_ptr(),
                                        k.shape[0], scale, out.data_ptr(), lse.data_ptr(), torch.get_num_threads())
    if failed:
        raise MemoryError("shared-prefix attention could not allocate its scratch memory")
    return out, lse


def prefix_partials_outputs(q: Tensor, k: Tensor, v: Tensor, chunk: int, bf16: bool = False) -> Tensor:
    _expect_rows("prefix_partials", q, k, v, bf16)
    batch, heads, dim = q.shape
    return q.new_empty(batch, -(-k.shape[0] // chunk), heads, dim + 2)


def prefix_partials(lib: ctypes.CDLL, q: Tensor, k: Tensor, v: Tensor, scale: float, bf16: bool = False) -> Tensor:
    """Each row's attention over a trunk, left as its chunks' partials [batch, chunks, heads, dim + 2] (max, sum,
    unnormalised output) for paged_decode's given; the last chunk holds what is left of the keys. bf16: as
    paged_decode's, and so are k and v's dtypes."""
    partials = prefix_partials_outputs(q, k, v, lib.swarm_prefix_chunk(), bf16)
    batch, heads, dim = q.shape
    rows = torch.arange(batch, dtype=torch.int64)
    failed = lib.swarm_prefix_partials(q.data_ptr(), batch, heads, k.shape[1], dim, k.data_ptr(), v.data_ptr(),
                                       k.shape[0], scale, int(bf16), _is_bf16(k), partials.data_ptr(), rows.data_ptr(),
                                       partials.shape[1], torch.get_num_threads())
    if failed:
        raise MemoryError("shared-prefix attention could not allocate its scratch memory")
    return partials


def rows_attention_outputs(q: Tensor, k: Tensor, v: Tensor, causal: bool, bf16: bool = False) -> tuple[Tensor, Tensor]:
    outputs = _rows_outputs("rows_attention", q, k, v, bf16)
    if causal and k.shape[0] < q.shape[0]:
        raise refusal("rows_attention", "k", f"must hold at least as many keys as q has tokens when causal, "
                                             f"got {k.shape[0]} for {q.shape[0]}")
    return outputs


def rows_attention(lib: ctypes.CDLL, q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool,
                   bf16: bool = False, carry: Tensor | None = None, int8: bool = False) -> tuple[Tensor, Tensor]:
    """int8: the products in integers (csrc/rows_attention_i8.h), which read k and v in bfloat16 as well."""
    out, lse = rows_attention_outputs(q, k, v, causal, bf16 or int8)
    expect_optional("rows_attention", "carry", carry, running_shape(q))
    _call_rows_attention(lib, q, k, v, scale, causal, _products(bf16, int8), out.data_ptr(), lse.data_ptr(),
                         None if carry is None else carry.data_ptr(), None)
    return out, lse


def running_shape(q: Tensor) -> tuple[int, int, int]:
    """Each query row's running state over a span of keys: (max, sum, unnormalised output [dim])."""
    return q.shape[0], q.shape[1], q.shape[2] + 2


def rows_attention_running_outputs(q: Tensor, k: Tensor, v: Tensor, bf16: bool = False) -> Tensor:
    _expect_rows("rows_attention_running", q, k, v, bf16)
    return q.new_empty(running_shape(q))


def rows_attention_running(lib: ctypes.CDLL, q: Tensor, k: Tensor, v: Tensor, scale: float,
                           bf16: bool = False, int8: bool = False) -> Tensor:
    running = rows_attention_running_outputs(q, k, v, bf16 or int8)
    _call_rows_attention(lib, q, k, v, scale, False, _products(bf16, int8), None, None, None, running.data_ptr())
    return running


def _products(bf16: bool, int8: bool) -> int:
    """csrc/rows_attention.c's precision of products: 0 float32, 1 bfloat16, 2 integers."""
    return 2 if int8 else int(bf16)


def _call_rows_attention(lib, q, k, v, scale, causal, products, out, lse, carry_in, carry_out) -> None:
    tokens, heads, dim = q.shape
    failed = lib.swarm_rows_attention(q.data_ptr(), tokens, heads, k.shape[1], dim, k.data_ptr(), v.data_ptr(),
                                      k.shape[0], int(causal), products, _is_bf16(k), scale, out, lse, carry_in,
                                      carry_out, torch.get_num_threads())
    if failed:
        raise MemoryError("prefill attention could not allocate its scratch memory")


def merge_attention_outputs(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    expect_rank("merge_attention", "out_a", out_a, max(out_a.dim(), 1))   # any rank from 1 up
    expect_tensor("merge_attention", "lse_a", lse_a, out_a.shape[:-1])
    expect_tensor("merge_attention", "out_b", out_b, out_a.shape)
    expect_tensor("merge_attention", "lse_b", lse_b, out_a.shape[:-1])
    return torch.empty_like(out_a), torch.empty_like(lse_a)


def merge_attention(lib: ctypes.CDLL, out_a: Tensor, lse_a: Tensor, out_b: Tensor,
                    lse_b: Tensor) -> tuple[Tensor, Tensor]:
    out, lse = merge_attention_outputs(out_a, lse_a, out_b, lse_b)
    lib.swarm_merge_attention(out_a.data_ptr(), lse_a.data_ptr(), out_b.data_ptr(), lse_b.data_ptr(), lse_a.numel(),
                              out_a.shape[-1], out.data_ptr(), lse.data_ptr())
    return out, lse


def _rows_outputs(op: str, q: Tensor, k: Tensor, v: Tensor, bf16: bool = False) -> tuple[Tensor, Tensor]:
    """Rows q [rows, heads, dim] over one key set k, v [keys, kv_heads, dim] -> out, lse [rows, heads]."""
    _expect_rows(op, q, k, v, bf16)
    rows, heads, dim = q.shape
    return q.new_empty(rows, heads, dim), q.new_empty(rows, heads)


def _expect_rows(op: str, q: Tensor, k: Tensor, v: Tensor, bf16: bool = False) -> None:
    expect_rank(op, "q", q, 3)
    cache_dtype = kv_dtype(op, "k", k, bf16)
    expect_rank(op, "k", k, 3, cache_dtype)
    _expect_heads(op, q, "k", k.shape[1:])
    expect_tensor(op, "v", v, k.shape, cache_dtype)
    if k.shape[0] == 0:
        raise refusal(op, "k", "must hold at least one key")


def _expect_heads(op: str, q: Tensor, kv_name: str, kv_heads_and_dim: torch.Size) -> None:
    """q [.., heads, dim] against keys [.., kv_heads, dim]: query heads in groups of a KV head, dim a multiple of 8."""
    heads, dim = q.shape[1], q.shape[2]
    kv_heads, kv_dim = kv_heads_and_dim
    if kv_dim != dim:
        raise refusal(op, kv_name, f"must have q's head width {dim}, got {kv_dim}")
    if kv_heads == 0 or heads % kv_heads:
        raise refusal(op, "q", f"must have a multiple of the {kv_heads} KV heads, got {heads} heads")
    if dim % 8:
        raise refusal(op, "q", f"must have a head width that is a multiple of 8, got {dim}")


def _is_bf16(k: Tensor) -> int:
    return int(k.dtype == torch.bfloat16)


def _ptr_or_null(tensor: Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()
