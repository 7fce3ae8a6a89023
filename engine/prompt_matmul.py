"""The precision of prompt tokens' matmuls on a CPU: exact float32, bfloat16 products summed in float32, or
integer products of int8-quantized rows.

A prompt's matmuls are bound by arithmetic: thousands of rows against every weight. Where the CPU multiplies
bfloat16 on units of its own (AMX, AVX512-BF16), two paths round a float32 matmul's inputs to bfloat16 and keep
its sums and its output in float32:
    "bfloat16"          oneDNN's bf16 "fpmath mode" (torch.backends.mkldnn.matmul.fp32_precision = "bf16"),
                        for every linear layer; on AMX it sums in float32, on a Zen 4 it rounds its sums
    "bfloat16_kernel"   swarm's kernel (kernels/cpu/bf16_matmul.py: AVX512-BF16, sums as vdpbf16ps does), for
                        the quantized layers; float weights' layers and the attention stay float32 in this mode
and one path, on CPUs with AVX512-VNNI, rounds the rows to int8 as llama.cpp does:
    "int8_kernel"       swarm's integer products (kernels/cpu/code_prompt.py): each sub-block of 32 of a row
                        quantized as GGUF's Q8_0, multiplied by the layer's code panels (engine.code_panels) in
                        int32 and scaled in float32; layers without code panels take "bfloat16_kernel"'s path.
                        auto takes it where the probe timed it at least INT8_SPEEDUP x the fastest bfloat16 path:
                        its rounding is coarser (1/254 of a sub-block's largest value)
The activations, the KV cache and every other op stay float32. A decode step's rows take swarm's quantized
matmul (kernels/cpu/csrc/quant_matmul.c) in float32, or in bfloat16 products summed in float32 where `choose_decode`
measured those faster: 8 agents' rows are bound by the products, one agent's by expanding the weights' blocks.

    dtype auto, on a CPU whose probe (engine.machine_probe) measured, of the paths that sum in float32 and run
    natively, the fastest at least BF16_SPEEDUP x float32     prompt rows: that path
        none such                                              prompt rows: float32
    dtype float32, or any dtype named                          float32 throughout, as transformers computes

Sharing must not change output, so a token's bits must not depend on its batch. In either mode every path a
prompt row can take (F.linear, oneDNN's packed op, weight @ x.T for a few rows, a tile of a dequantized weight,
swarm's kernel) gives a row the same bits whatever rows come with it (tests/engine/test_prompt_matmul.py), so
every prompt row takes it, even in a chunk of 3 rows the decode kernels would otherwise take. Decode rows never
do: in a decode step, nor beside a prompt in a mixed step (engine.model.rows_apart).

The kernel's precision costs a small prompt step what a large one gains: each step lays every quantized weight out
in bfloat16 once (SmolLM2 on a 2-core Zen 4: 8 agents' 3-token turns over a cached 2,112-token trunk took
0.20-0.27 s against 0.18-0.24 s in float32), where 8 agents' 2,048-token trunk and suffixes took 3.56-3.66 s
against 4.78-6.44 s.

The runner sets the precision for one step (`prompt_rows`), on the engine's thread; the linear layers run
their products through `with_step_precision`. torch's flag is process-wide, so it is set only around each of
those products.
"""
from __future__ import annotations

import math
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch

from engine.kernel_probes import DECODE_ROWS
from engine.machine_probe import INT8_KERNEL, KERNEL, cached_probe

BF16_SPEEDUP = 1.5   # below this, bfloat16's rounding is not worth its speed
INT8_SPEEDUP = 1.15  # over the fastest path that rounds to bfloat16: below this, int8's coarser rounding is not
                     # worth its speed
ATTENTION_BF16_SPEEDUP = 1.2   # the attention's: its matmuls' precision already rounds the prompt rows
ATTENTION_INT8_SPEEDUP = 1.1   # the attention's integer products over its fastest other: the matmuls' int8 rounds
                               # the rows already, and llama.cpp's q8_0 KV cache rounds K and V as they do
DECODE_BF16_SPEEDUP = 1.2      # the decode rows': a step of 8 of them
PRECISIONS = ("float32", "bfloat16", KERNEL, INT8_KERNEL)

_step = threading.local()
Result = TypeVar("Result")


def choose(dtype_option: str, device: torch.device, dtype: torch.dtype) -> str:
    """The precision (of PRECISIONS) this machine's prompt rows should take."""
    if dtype_option != "auto" or device.type != "cpu" or dtype != torch.float32:
        return "float32"
    rates = cached_probe().matmul_flop_s   # a few seconds once per machine, then read from its cache
    f32 = rates.get("float32")
    usable = {path: rate.flop_s for path, rate in rates.items() if path in PRECISIONS[1:] and _usable(path)
              and rate.native and rate.float32_sums}
    rounded = {path: rate for path, rate in usable.items() if path != INT8_KERNEL}
    best = max(rounded, key=rounded.get, default=None)
    if INT8_KERNEL in usable and usable[INT8_KERNEL] >= INT8_SPEEDUP * rounded.get(best, 0.0):
        best = INT8_KERNEL
    return best if best and f32 is not None and usable[best] >= BF16_SPEEDUP * f32.flop_s else "float32"


def choose_attention(precision: str) -> str:
    """The precision of the prompts' attention products in steps whose matmuls take `precision` (of PRECISIONS):
    bfloat16 where they do and the probe measured the C kernel's bfloat16 products at least
    ATTENTION_BF16_SPEEDUP x its float32 ones; float32 otherwise. With the matmuls in integer products and the
    attention in bfloat16: integers instead (csrc/rows_attention_i8.h) where the probe timed them at least
    ATTENTION_INT8_SPEEDUP x bfloat16's (the decode rows' attention then stays bfloat16)."""
    if precision == "float32":
        return "float32"
    rates = cached_probe().attention_flop_s
    fast = rates.get("bfloat16", 0.0) >= ATTENTION_BF16_SPEEDUP * rates.get("float32", math.inf)
    if not fast:
        return "float32"
    int8 = rates.get("int8", 0.0) >= ATTENTION_INT8_SPEEDUP * rates["bfloat16"]
    return "int8" if precision == INT8_KERNEL and int8 else "bfloat16"


def choose_decode(precision: str) -> str:
    """The precision of the decode rows' products on the quantized layers, with prompt rows in `precision` (of
    PRECISIONS): bfloat16 where prompts take bfloat16 products and the probe measured the C decode matmul's
    bfloat16 products at least DECODE_BF16_SPEEDUP x its float32 ones for 8 rows; float32 otherwise. One
    precision for every decode row, so a row's bits never depend on how many rows its step holds: a lone row's
    step may be the slower for it (DECODE_ROWS in the probe's decode_flop_s says by how much). With prompts in
    integer products: integer products too ("int8", from the code panels the engine then keeps) where the probe
    timed them faster than the blocks and either panels in bfloat16 for 1 row and for 8 (int8_speedup)."""
    if precision == "float32":
        return "float32"
    probe = cached_probe()
    if precision == INT8_KERNEL and all(
            probe.int8_speedup.get(rows, 0.0) > max(1.0, probe.codes_speedup.get(rows, 0.0),
                                                    probe.panels_speedup.get(rows, 0.0))
            for rows in map(str, DECODE_ROWS)):
        return "int8"
    rates = probe.decode_flop_s
    fast = rates.get("bfloat16", {}).get("8", 0.0) >= DECODE_BF16_SPEEDUP * rates.get("float32", {}).get("8", math.inf)
    return "bfloat16" if fast else "float32"


def choose_decode_attention(decode_products: str, prompt_attention: str) -> str:
    """The precision of last-token rows' attention products (decode steps): bfloat16 where decode rows take
    bfloat16 products (choose_decode) and the probe measured the attention kernels' bfloat16 products faster
    (choose_attention, which then takes bfloat16 or integers): the decode kernels multiply as the prompt kernel's
    bfloat16 does, on the same instruction; float32 otherwise."""
    fast = prompt_attention in ("bfloat16", "int8")
    return "bfloat16" if decode_products in ("bfloat16", "int8") and fast else "float32"


@dataclass(frozen=True, slots=True)
class Precisions:
    """What an engine's products take (of PRECISIONS, or "float32"/"bfloat16"): prompt rows' matmuls and attention,
    decode rows' matmuls on the quantized layers and attention."""
    prompt: str
    prompt_attention: str
    decode: str
    decode_attention: str


def choose_all(dtype_option: str, device: torch.device, dtype: torch.dtype) -> Precisions:
    """Every precision in turn, each from the ones before (choose, choose_attention, choose_decode,
    choose_decode_attention)."""
    prompt = choose(dtype_option, device, dtype)
    prompt_attention = choose_attention(prompt)
    decode = choose_decode(prompt)
    return Precisions(prompt, prompt_attention, decode, choose_decode_attention(decode, prompt_attention))


def _usable(path: str) -> bool:
    if path == "bfloat16":
        return _fpmath_available()
    from kernels.cpu import bf16_matmul, code_prompt  # builds the kernels: only where the probe timed them
    return bf16_matmul.native() and (path != INT8_KERNEL or code_prompt.native())


@contextmanager
def prompt_rows(precision: str):
    """A step's prompt rows run in `precision` while inside."""
    assert precision in PRECISIONS, precision
    before = getattr(_step, "precision", "float32")
    _step.precision = precision
    try:
        yield
    finally:
        _step.precision = before


def decode_rows():
    """Inside a prompt step, the decode rows of a mixed step: float32, as in a decode step."""
    return prompt_rows("float32")


def with_step_precision(product: Callable[..., Result], *args, **kwargs) -> Result:
    """`product(*args, **kwargs)`, a matmul, in this step's precision: oneDNN's, or float32 (also in the kernel's
    precision, for the layers that do not take the kernel)."""
    if getattr(_step, "precision", "float32") != "bfloat16":
        return product(*args, **kwargs)
    settings = torch.backends.mkldnn.matmul
    before = settings.fp32_precision
    settings.fp32_precision = "bf16"
    try:
        return product(*args, **kwargs)
    finally:
        settings.fp32_precision = before


def bfloat16_now() -> bool:
    """Whether products run in bfloat16 at this point of the step (either path)."""
    return getattr(_step, "precision", "float32") != "float32"


def kernel_now() -> bool:
    """Whether the quantized layers' products take swarm's kernels at this point of the step: the bfloat16 one,
    or the integer one where a layer keeps code panels (int8_now) and the bfloat16 one where it does not."""
    return getattr(_step, "precision", "float32") in (KERNEL, INT8_KERNEL)


def int8_now() -> bool:
    """Whether the quantized layers that keep code panels take swarm's integer products at this point of the step."""
    return getattr(_step, "precision", "float32") == INT8_KERNEL


def _fpmath_available() -> bool:
    """torch builds before 2.9 have no per-backend fp32 precision."""
    return hasattr(torch.backends.mkldnn, "matmul") and hasattr(torch.backends.mkldnn.matmul, "fp32_precision")
