"""The C kernels' functions (kernels/cpu/csrc/*.c) as ctypes sees them, in this one table: without their
argument types ctypes passes every integer as a C int and cannot pass floats."""
from __future__ import annotations

import ctypes

_ptr, _i64, _f32, _int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int
SIGNATURES: dict[str, dict[str, tuple[list, object]]] = {   # source -> function -> (argument types, result)
    "fused_ops": {
        "swarm_rms_norm": ([_ptr, _ptr, _i64, _i64, _f32, _ptr, _int], None),
        "swarm_rotary": ([_ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _int], None),
        "swarm_silu_mul": ([_ptr, _ptr, _i64, _ptr, _int], None)},
    "quant_matmul": {
        "swarm_quant_matmul": ([_ptr, _i64, _i64, _ptr, _int, _i64, _ptr, _ptr, _int], None),
        "swarm_quant_matmul_many": ([_ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _int], None),
        "swarm_quant_matmul_set": ([_ptr, _ptr, _i64, _ptr, _int], _int),
        "swarm_quant_dequantize": ([_ptr, _int, _i64, _i64, _ptr, _int], None)},
    "quant_matmul_bf16": {
        "swarm_quant_matmul_many_bf16": ([_ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _int], _int),
        "swarm_quant_matmul_bf16_native": ([], _int)},
    "code_matmul": {
        "swarm_code_native": ([], _int),
        "swarm_code_cell_bytes": ([_int], _i64),
        "swarm_code_pack": ([_ptr, _int, _i64, _i64, _ptr, _int], None),
        "swarm_code_matmul": ([_ptr, _i64, _i64, _ptr, _int, _i64, _ptr, _ptr, _int], _int)},
    "code_prompt": {
        "swarm_code_prompt_native": ([], _int),
        "swarm_code_prompt_many": ([_ptr, _i64, _i64, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _int], _int)},
    "decode_layer": {
        "swarm_decode_attention_in": ([_ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _int], _int),
        "swarm_decode_mlp_in": ([_ptr, _ptr, _ptr, _i64, _ptr, _ptr, _ptr, _ptr, _int], _int),
        "swarm_decode_mlp_out": ([_ptr, _ptr, _ptr, _i64, _ptr, _int], _int)},
    "decode_stack": {
        "swarm_decode_stack_run": ([_ptr, _ptr, _ptr, _int], _int)},
    "bf16_matmul": {
        "swarm_bf16_native": ([], _int),
        "swarm_bf16_round_rows": ([_ptr, _i64, _i64, _ptr, _int], None),
        "swarm_bf16_pack_weight": ([_ptr, _i64, _i64, _ptr, _int], None),
        "swarm_bf16_pack_quant": ([_ptr, _int, _i64, _i64, _i64, _ptr, _int], None),
        "swarm_bf16_matmul": ([_ptr, _i64, _i64, _ptr, _i64, _ptr, _ptr, _i64, _int], None)},
    "paged_decode": {
        "swarm_paged_decode": ([_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _i64, _ptr, _i64, _ptr, _ptr, _ptr, _i64,
                                _f32, _int, _int, _ptr, _ptr, _int], _int),
        "swarm_write_kv": ([_ptr, _ptr, _ptr, _ptr, _ptr, _i64, _i64, _int], None)},
    "prefix_attention": {
        "swarm_prefix_attention": ([_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _i64, _f32, _ptr, _ptr, _int], _int),
        "swarm_prefix_partials": ([_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _i64, _f32, _int, _int, _ptr, _ptr,
                                   _i64, _int], _int),
        "swarm_prefix_chunk": ([], _i64),
        "swarm_merge_attention": ([_ptr, _ptr, _ptr, _ptr, _i64, _i64, _ptr, _ptr], None)},
    "rows_attention": {
        "swarm_rows_attention_bf16_native": ([], _int),
        "swarm_rows_attention_int8_native": ([], _int),
        "swarm_rows_attention_chunk": ([], _i64),
        "swarm_rows_attention": ([_ptr, _i64, _i64, _i64, _i64, _ptr, _ptr, _i64, _int, _int, _int, _f32, _ptr,
                                  _ptr, _ptr, _ptr, _int], _int)},
}


def declare(lib: ctypes.CDLL, functions: dict[str, tuple[list, object]]) -> ctypes.CDLL:
    """lib with each of these functions' (argument types, result type) declared: SIGNATURES[source] for a build
    of csrc/<source>.c."""
    for function, (argtypes, restype) in functions.items():
        getattr(lib, function).argtypes = argtypes
        getattr(lib, function).restype = restype
    return lib
