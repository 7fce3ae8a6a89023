"""The C kernels as torch ops: swarm::rms_norm, swarm::rotary, swarm::silu_mul, swarm::quant_matmul,
swarm::quant_matmul_many, swarm::quant_dequantize, swarm::bf16_round_rows, swarm::bf16_pack_weight,
swarm::bf16_pack_quant, swarm::bf16_matmul, swarm::paged_decode, swarm::prefix_attention, swarm::prefix_partials,
swarm::rows_attention, swarm::rows_attention_running, swarm::merge_attention and swarm::write_kv, each taking and
returning tensors (torch.library.custom_op; quant_dequantize and the bf16 packs and matmul write into their `out`,
write_kv into the caches). Their
arguments are checked at the boundary (kernels.cpu.entry_points), the profiler lists them, and each has a fake
implementation giving outputs of the right shape and dtype, so torch.compile and graph capture treat them as
opaque ops.

    kernels.cpu.fused_ops, quant_matmul, native_attention   (pick the C kernel or PyTorch)
            │ ops.<name>(tensors..., library=None)
            ▼
    Kernel ──── torch is watching (compiling, tracing, profiling) ──▶ swarm::<name> ──┐
            └── otherwise, and for a `library` of the tests ───────────────────────────┴▶ entry_points.<name>(lib, ...)

A decode step of SmolLM2-135M makes about 420 of these calls. Through the dispatcher every one costs some µs
more: with 8 agents on a 2,048-token trunk (2 threads) a step took 11-18 % longer than with plain ctypes calls;
the direct call, with the same checks, 3-7 % (the checks themselves, and asking whether torch is watching).
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch
from torch.library import custom_op

from kernels.cpu import entry_points

Tensor = torch.Tensor


# Whether torch must see a call as its op: torch.compile is tracing (its tracer reads _compiling() as True and
# cannot call the other two, so it comes first), a profiler is recording, or a dispatch mode (fake tensors,
# make_fx) is on. Looked up once: a decode step asks hundreds of times, its interpreter caches cold.
_compiling = torch.compiler.is_compiling
_profiling = torch._C._autograd._profiler_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack


def torch_is_watching() -> bool:
    """Whether a call must go through its op, for torch to see it."""
    return _compiling() or _profiling() or _dispatch_modes()


def built(source: str) -> ctypes.CDLL:
    library = entry_points.library(source)
    assert library is not None, f"the {source} kernel is not built here: its caller checks available() first"
    return library


class Kernel:
    """One C entry point: its torch op, and the plain function that op runs on the built `source`."""

    __slots__ = ("op", "call_c", "source", "_built")

    def __init__(self, op: Callable, call_c: Callable, source: str):
        self.op, self.call_c, self.source = op, call_c, source
        self._built: ctypes.CDLL | None = None

    def __call__(self, *args, library: ctypes.CDLL | None = None):
        """The op's result. library: another build of the source (tests), called directly."""
        if library is None:
            if torch_is_watching():
                return self.op(*args)
            library = self._built or self._build()
        return self.call_c(library, *args)

    def _build(self) -> ctypes.CDLL:
        self._built = built(self.source)
        return self._built


@custom_op("swarm::rms_norm", mutates_args=())
def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return entry_points.rms_norm(built("fused_ops"), x, weight, eps)


@custom_op("swarm::rotary", mutates_args=())
def _rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return entry_points.rotary(built("fused_ops"), x, cos, sin)


@custom_op("swarm::silu_mul", mutates_args=())
def _silu_mul(gate: Tensor, up: Tensor) -> Tensor:
    return entry_points.silu_mul(built("fused_ops"), gate, up)


@custom_op("swarm::quant_matmul", mutates_args=())
def _quant_matmul(x: Tensor, blocks: Tensor, format: str, cols: int, bias: Tensor | None) -> Tensor:
    return entry_points.quant_matmul(built("quant_matmul"), x, blocks, format, cols, bias)


@custom_op("swarm::quant_matmul_many", mutates_args=())
def _quant_matmul_many(x: Tensor, blocks: list[Tensor], codes: list[int], cols: int,
                       biases: list[Tensor | None], bf16: bool = False) -> list[Tensor]:
    return entry_points.quant_matmul_many(built("quant_matmul"), x, blocks, codes, cols, biases, bf16)


@custom_op("swarm::quant_dequantize", mutates_args=("out",))
def _quant_dequantize(blocks: Tensor, format: str, cols: int, out: Tensor) -> None:
    entry_points.quant_dequantize(built("quant_matmul"), blocks, format, cols, out)


@custom_op("swarm::bf16_round_rows", mutates_args=())
def _bf16_round_rows(x: Tensor) -> Tensor:
    return entry_points.bf16_round_rows(built("bf16_matmul"), x)


@custom_op("swarm::bf16_pack_weight", mutates_args=("out",))
def _bf16_pack_weight(w: Tensor, out: Tensor) -> None:
    entry_points.bf16_pack_weight(built("bf16_matmul"), w, out)


@custom_op("swarm::bf16_pack_quant", mutates_args=("out",))
def _bf16_pack_quant(blocks: Tensor, format: str, cols: int, out: Tensor) -> None:
    entry_points.bf16_pack_quant(built("bf16_matmul"), blocks, format, cols, out)


@custom_op("swarm::bf16_matmul", mutates_args=("out",))
def _bf16_matmul(pairs: Tensor, panels: Tensor, rows: int, bias: Tensor | None, out: Tensor, first: int) -> None:
    entry_points.bf16_matmul(built("bf16_matmul"), pairs, panels, rows, bias, out, first)


@custom_op("swarm::paged_decode", mutates_args=())
def _paged_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor, lengths: Tensor,
                  scale: float, given: Tensor | None = None, given_chunks: Tensor | None = None,
                  bf16: bool = False) -> tuple[Tensor, Tensor]:
    return entry_points.paged_decode(built("paged_decode"), q, k_cache, v_cache, block_tables, lengths, scale, given,
                                     given_chunks, bf16)


@custom_op("swarm::prefix_partials", mutates_args=())
def _prefix_partials(q: Tensor, k: Tensor, v: Tensor, scale: float, bf16: bool = False) -> Tensor:
    return entry_points.prefix_partials(built("prefix_attention"), q, k, v, scale, bf16)


@custom_op("swarm::prefix_attention", mutates_args=())
def _prefix_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> tuple[Tensor, Tensor]:
    return entry_points.prefix_attention(built("prefix_attention"), q, k, v, scale)


@custom_op("swarm::rows_attention", mutates_args=())
def _rows_attention(q: Tensor, k: Tensor, v: Tensor, scale: float, causal: bool, bf16: bool = False,
                    carry: Tensor | None = None, int8: bool = False) -> tuple[Tensor, Tensor]:
    return entry_points.rows_attention(built("rows_attention"), q, k, v, scale, causal, bf16, carry, int8)


@custom_op("swarm::rows_attention_running", mutates_args=())
def _rows_attention_running(q: Tensor, k: Tensor, v: Tensor, scale: float, bf16: bool = False,
                            int8: bool = False) -> Tensor:
    return entry_points.rows_attention_running(built("rows_attention"), q, k, v, scale, bf16, int8)


@custom_op("swarm::merge_attention", mutates_args=())
def _merge_attention(out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    return entry_points.merge_attention(built("prefix_attention"), out_a, lse_a, out_b, lse_b)


@custom_op("swarm::write_kv", mutates_args=("k_cache", "v_cache"))
def _write_kv(k_cache: Tensor, v_cache: Tensor, k: Tensor, v: Tensor, slots: Tensor) -> None:
    entry_points.write_kv(built("paged_decode"), k_cache, v_cache, k, v, slots)


_rms_norm.register_fake(lambda x, weight, eps: entry_points.rms_norm_outputs(x, weight))
_rotary.register_fake(entry_points.rotary_outputs)
_silu_mul.register_fake(entry_points.silu_mul_outputs)
_quant_matmul.register_fake(entry_points.quant_matmul_outputs)
_quant_matmul_many.register_fake(entry_points.quant_matmul_many_outputs)
_quant_dequantize.register_fake(entry_points.quant_dequantize_outputs)
_bf16_round_rows.register_fake(entry_points.bf16_round_rows_outputs)
_bf16_pack_weight.register_fake(entry_points.bf16_pack_weight_outputs)
_bf16_pack_quant.register_fake(entry_points.bf16_pack_quant_outputs)
_bf16_matmul.register_fake(entry_points.bf16_matmul_outputs)
_paged_decode.register_fake(lambda q, k_cache, v_cache, block_tables, lengths, scale, given=None, given_chunks=None,
                            bf16=False: entry_points.paged_decode_outputs(q, k_cache, v_cache, block_tables, lengths,
                                                                          given, given_chunks, bf16))
_prefix_partials.register_fake(lambda q, k, v, scale, bf16=False: entry_points.prefix_partials_outputs(
    q, k, v, built("prefix_attention").swarm_prefix_chunk(), bf16))
_prefix_attention.register_fake(lambda q, k, v, scale: entry_points.prefix_attention_outputs(q, k, v))
_rows_attention.register_fake(lambda q, k, v, scale, causal, bf16=False, carry=None, int8=False:
                              entry_points.rows_attention_outputs(q, k, v, causal, bf16 or int8))
_rows_attention_running.register_fake(lambda q, k, v, scale, bf16=False, int8=False:
                                      entry_points.rows_attention_running_outputs(q, k, v, bf16 or int8))
_merge_attention.register_fake(entry_points.merge_attention_outputs)
_write_kv.register_fake(entry_points.check_write_kv)

rms_norm = Kernel(_rms_norm, entry_points.rms_norm, "fused_ops")
rotary = Kernel(_rotary, entry_points.rotary, "fused_ops")
silu_mul = Kernel(_silu_mul, entry_points.silu_mul, "fused_ops")
quant_matmul = Kernel(_quant_matmul, entry_points.quant_matmul, "quant_matmul")
quant_matmul_many = Kernel(_quant_matmul_many, entry_points.quant_matmul_many, "quant_matmul")
quant_dequantize = Kernel(_quant_dequantize, entry_points.quant_dequantize, "quant_matmul")
bf16_round_rows = Kernel(_bf16_round_rows, entry_points.bf16_round_rows, "bf16_matmul")
bf16_pack_weight = Kernel(_bf16_pack_weight, entry_points.bf16_pack_weight, "bf16_matmul")
bf16_pack_quant = Kernel(_bf16_pack_quant, entry_points.bf16_pack_quant, "bf16_matmul")
bf16_matmul = Kernel(_bf16_matmul, entry_points.bf16_matmul, "bf16_matmul")
paged_decode = Kernel(_paged_decode, entry_points.paged_decode, "paged_decode")
prefix_attention = Kernel(_prefix_attention, entry_points.prefix_attention, "prefix_attention")
prefix_partials = Kernel(_prefix_partials, entry_points.prefix_partials, "prefix_attention")
rows_attention = Kernel(_rows_attention, entry_points.rows_attention, "rows_attention")
rows_attention_running = Kernel(_rows_attention_running, entry_points.rows_attention_running, "rows_attention")
merge_attention = Kernel(_merge_attention, entry_points.merge_attention, "prefix_attention")
write_kv = Kernel(_write_kv, entry_points.write_kv, "paged_decode")
