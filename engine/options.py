"""EngineOptions: how an engine is built and run (device, dtype, KV pool, batch limits, CPU kernels)."""
from __future__ import annotations

from dataclasses import dataclass

QUANTIZE_SCHEMES = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")   # a checkpoint quantized at load by gguf
WEIGHT_SCHEMES = ("auto", "float", *QUANTIZE_SCHEMES)        # engine.loading.weight_plan says what each does


@dataclass(slots=True)
class EngineOptions:
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    kv_budget_tokens: int | None = None
    kv_budget_bytes: int | None = None
    enable_prefix_caching: bool = True
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    cascade_attention: bool = True
    weights: str = "auto"           # engine.loading.weight_plan: keep a GGUF's formats, float, or q8_0 & co
    onednn_weights: bool = True     # CPU float32: weights in oneDNN's layout, multiplied by oneDNN
