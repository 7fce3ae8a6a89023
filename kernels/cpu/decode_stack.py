"""Every layer of a decode step in one C call (csrc/decode_stack.c): each layer's three calls (kernels.cpu.
decode_layer) around its cascade attention over the paged KV pool, which the layer-by-layer path runs from
Python (engine.attention.cascade) at about 130 µs a layer.

The layers, the KV caches and the softmax scale are described to the kernel once; a step passes its rows, their
rotary, their KV slots and the step's cascade plan (engine.attention.plan.DecodePlan). The C code runs the same
functions on the same operands in the same order as the layer-by-layer path, so the bits are the same.
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from kernels.cpu import entry_points
from kernels.cpu.checks import expect_rank, expect_tensor, kv_dtype, refusal
from kernels.cpu.decode_layer import DecodeLayer, Layer

OP = "decode_stack"
_ptr, _i64, _f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float


class _Stack(ctypes.Structure):
    _fields_ = [("layers", ctypes.POINTER(Layer)), ("k_caches", ctypes.POINTER(_ptr)),
                ("v_caches", ctypes.POINTER(_ptr)), ("count", _i64), ("block_size", _i64), ("scale", _f32),
                ("bf16_attention", ctypes.c_int), ("kv_bf16", ctypes.c_int)]


class _Prefix(ctypes.Structure):
    _fields_ = [("rows", _ptr), ("members", _ptr), ("blocks", _ptr), ("count", _i64), ("first_block", _i64),
                ("num_blocks", _i64)]


class _Batch(ctypes.Structure):
    _fields_ = [("cos", _ptr), ("sin", _ptr), ("slots", _ptr), ("tables", _ptr), ("lengths", _ptr),
                ("prefixes", ctypes.POINTER(_Prefix)), ("rows", _i64), ("width", _i64), ("prefix_count", _i64)]


@dataclass(frozen=True)
class Trunk:
    """A trunk some of the step's rows share: their rows (int64), which of them read it (bool, or None: all), its
    block ids (int64, or None: first_block, first_block + 1, ... for num_blocks blocks)."""

    rows: torch.Tensor
    members: torch.Tensor | None
    blocks: torch.Tensor | None
    first_block: int
    num_blocks: int


class DecodeStack:
    """The decoder's layers in order, each with its layer's (k_cache, v_cache): [blocks, block_size, kv_heads,
    head_dim] float32, or bfloat16 (read by bfloat16 products only: bf16_attention then). bf16_attention: the
    attention's products in bfloat16, as native_attention's bf16=True."""

    def __init__(self, layers: list[DecodeLayer], caches: list[tuple[torch.Tensor, torch.Tensor]], scale: float,
                 bf16_attention: bool = False):
        _check(layers, caches, bf16_attention)
        self.layers, self.caches = layers, caches
        self.head_dim, self.hidden = layers[0].head_dim, layers[0].hidden
        self.blocks, self.block_size = caches[0][0].shape[:2]
        count = len(layers)
        self._arrays = ((Layer * count)(*(layer.description for layer in layers)),
                        (_ptr * count)(*(k.data_ptr() for k, _ in caches)),
                        (_ptr * count)(*(v.data_ptr() for _, v in caches)))
        kv_bf16 = caches[0][0].dtype == torch.bfloat16
        self._stack = _Stack(*self._arrays, count, self.block_size, scale, int(bf16_attention), int(kv_bf16))
        self._by_reference = ctypes.byref(self._stack)
        self._library = entry_points.library(OP)

    @staticmethod
    def available() -> bool:
        return entry_points.library(OP) is not None

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor, tables: torch.Tensor,
            lengths: torch.Tensor, trunks: list[Trunk]) -> torch.Tensor:
        """The last layer's output for the step's rows x [rows, hidden] (float32), each row's new K/V written at
        its slot in every layer; cos, sin [rows, head_dim]; each row's private tail: tables [rows, width] block
        ids and lengths [rows] tokens, as paged decode attention reads them."""
        rows = self._check_step(x, cos, sin, slots, tables, lengths)
        prefixes = (_Prefix * max(1, len(trunks)))(*(self._prefix(trunk, rows) for trunk in trunks))
        batch = _Batch(cos.data_ptr(), sin.data_ptr(), slots.data_ptr(), tables.data_ptr(), lengths.data_ptr(),
                       prefixes, rows, tables.shape[1], len(trunks))
        out = x.clone()
        if self._library.swarm_decode_stack_run(self._by_reference, ctypes.byref(batch), out.data_ptr(),
                                                torch.get_num_threads()):
            raise MemoryError("the decode step's layers could not allocate their buffers")
        return out

    def _check_step(self, x, cos, sin, slots, tables, lengths) -> int:
        """Refuses what the kernel would read or write out of bounds: it trusts every size and index."""
        expect_rank(OP, "x", x, 2)
        rows = x.shape[0]
        if x.shape[1] != self.hidden or rows == 0:
            raise refusal(OP, "x", f"must be [rows >= 1, {self.hidden}], got {list(x.shape)}")
        expect_tensor(OP, "cos", cos, (rows, self.head_dim))
        expect_tensor(OP, "sin", sin, (rows, self.head_dim))
        expect_tensor(OP, "slots", slots, (rows,), torch.int64)
        expect_rank(OP, "tables", tables, 2, torch.int64)
        if tables.shape[0] != rows:
            raise refusal(OP, "tables", f"must have a row for each of x's {rows} rows, got {tables.shape[0]}")
        expect_tensor(OP, "lengths", lengths, (rows,), torch.int64)
        _expect_within("slots", slots, self.blocks * self.block_size)
        _expect_within("tables", tables, self.blocks)
        return rows

    def _prefix(self, trunk: Trunk, rows: int) -> _Prefix:
        count = trunk.rows.numel()
        expect_tensor(OP, "trunk rows", trunk.rows, (count,), torch.int64)
        _expect_within("trunk rows", trunk.rows, rows)
        if trunk.members is not None:
            expect_tensor(OP, "trunk members", trunk.members, (count,), torch.bool)
        if trunk.blocks is not None:
            expect_tensor(OP, "trunk blocks", trunk.blocks, (trunk.num_blocks,), torch.int64)
            _expect_within("trunk blocks", trunk.blocks, self.blocks)
        elif not (trunk.num_blocks > 0 and 0 <= trunk.first_block and trunk.first_block + trunk.num_blocks
                  <= self.blocks):
            raise refusal(OP, "trunk", f"blocks [{trunk.first_block}, {trunk.first_block + trunk.num_blocks}) are "
                                       f"not in the pool's {self.blocks}")
        return _Prefix(trunk.rows.data_ptr(), _pointer_or_null(trunk.members), _pointer_or_null(trunk.blocks), count,
                       trunk.first_block, trunk.num_blocks)


def _check(layers: list[DecodeLayer], caches: list[tuple[torch.Tensor, torch.Tensor]], bf16_attention: bool) -> None:
    if not layers or len(layers) != len(caches):
        raise refusal(OP, "layers", f"must be one or more, each with its caches: {len(layers)} for {len(caches)}")
    first = layers[0]
    shape = (first.hidden, first.heads, first.kv_heads, first.head_dim, first.intermediate)
    if any((layer.hidden, layer.heads, layer.kv_heads, layer.head_dim, layer.intermediate) != shape
           for layer in layers):
        raise refusal(OP, "layers", "must all have the same widths and heads")
    if first.head_dim % 8:
        raise refusal(OP, "head_dim", f"must be a multiple of 8 (the attention's lanes), got {first.head_dim}")
    k0 = caches[0][0]
    expect_rank(OP, "k_cache", k0, 4, kv_dtype(OP, "k_cache", k0, bf16_attention, "bf16_attention=True"))
    if k0.shape[2:] != (first.kv_heads, first.head_dim) or k0.shape[0] == 0:
        raise refusal(OP, "k_cache", f"must be [blocks, block_size, {first.kv_heads}, {first.head_dim}], "
                                     f"got {list(k0.shape)}")
    for k, v in caches:
        expect_tensor(OP, "k_cache", k, k0.shape, k0.dtype)
        expect_tensor(OP, "v_cache", v, k0.shape, k0.dtype)


def _expect_within(name: str, indices: torch.Tensor, end: int) -> None:
    if not indices.numel():
        return
    low, high = (int(bound) for bound in torch.aminmax(indices))
    if not (0 <= low and high < end):
        raise refusal(OP, name, f"must lie in [0, {end}), got [{low}, {high}]")


def _pointer_or_null(tensor: torch.Tensor | None) -> int | None:
    return None if tensor is None else tensor.data_ptr()
