"""The precision of prompt tokens' matmuls on a CPU: exact float32, or bfloat16 products summed in float32.

A prompt's matmuls are bound by arithmetic: thousands of rows against every weight. Where the CPU multiplies
bfloat16 on units of its own (AMX, AVX512-BF16), oneDNN's bf16 "fpmath mode"
(torch.backends.mkldnn.matmul.fp32_precision = "bf16") rounds a float32 matmul's two inputs to bfloat16 and
keeps its sums and its output in float32. The activations, the KV cache and every other op stay float32. A
decode step's few rows are bound by reading the weights, not by products, and keep swarm's float32 kernels.

    dtype auto, on a CPU whose probe (engine.machine_probe) measured
        native bfloat16 at least BF16_SPEEDUP x float32,
        the bf16 mode's sums in float32                     prompt rows: bfloat16 products
        anything else                                       prompt rows: float32
    dtype float32, or any dtype named                       float32 throughout, as transformers computes

Sharing must not change output, so a token's bits must not depend on its batch. In the bf16 mode every path a
prompt row can take (F.linear, oneDNN's packed op, weight @ x.T for a few rows, a tile of a dequantized weight)
gives a row the same bits whatever rows come with it (tests/engine/test_prompt_matmul.py), so every prompt row
takes it, even in a chunk of 3 rows the decode kernels would otherwise take. Decode rows never do: in a decode
step, nor beside a prompt in a mixed step (engine.model.rows_apart).

The runner sets the precision for one step (`prompt_rows`), on the engine's thread; the linear layers run
their products through `with_step_precision`. torch's flag is process-wide, so it is set only around each of
those products.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar

import torch

from engine.machine_probe import cached_probe

BF16_SPEEDUP = 1.5   # below this, bfloat16's rounding is not worth its speed
PRECISIONS = ("float32", "bfloat16")

_step = threading.local()
Result = TypeVar("Result")


def choose(dtype_option: str, device: torch.device, dtype: torch.dtype) -> str:
    """"bfloat16" where this machine's prompts should take bfloat16 products, else "float32"."""
    if dtype_option != "auto" or device.type != "cpu" or dtype != torch.float32 or not _fpmath_available():
        return "float32"
    rates = cached_probe().matmul_flop_s   # a few seconds once per machine, then read from its cache
    bf16, f32 = rates.get("bfloat16"), rates.get("float32")
    faster = bf16 is not None and f32 is not None and bf16.native and bf16.flop_s >= BF16_SPEEDUP * f32.flop_s
    return "bfloat16" if faster and bf16.float32_sums else "float32"


@contextmanager
def prompt_rows(precision: str):
    """A step's prompt rows run in `precision` while inside."""
    assert precision in PRECISIONS, precision
    before = getattr(_step, "bfloat16", False)
    _step.bfloat16 = precision == "bfloat16"
    try:
        yield
    finally:
        _step.bfloat16 = before


def decode_rows():
    """Inside a prompt step, the decode rows of a mixed step: float32, as in a decode step."""
    return prompt_rows("float32")


def with_step_precision(product: Callable[..., Result], *args, **kwargs) -> Result:
    """`product(*args, **kwargs)`, a matmul, in this step's precision."""
    if not getattr(_step, "bfloat16", False):
        return product(*args, **kwargs)
    settings = torch.backends.mkldnn.matmul
    before = settings.fp32_precision
    settings.fp32_precision = "bf16"
    try:
        return product(*args, **kwargs)
    finally:
        settings.fp32_precision = before


def bfloat16_now() -> bool:
    """Whether products run in bfloat16 at this point of the step."""
    return getattr(_step, "bfloat16", False)


def _fpmath_available() -> bool:
    """torch builds before 2.9 have no per-backend fp32 precision."""
    return hasattr(torch.backends.mkldnn, "matmul") and hasattr(torch.backends.mkldnn.matmul, "fp32_precision")
