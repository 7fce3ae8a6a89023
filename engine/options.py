"""EngineOptions: how an engine is built and run (device, dtype, KV pool, batch limits, CPU kernels)."""
from __future__ import annotations

from dataclasses import dataclass


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
    quantized_decode: bool = True   # CPU float32: decode from the GGUF's Q4_0/Q4_1/Q8_0 blocks
    onednn_weights: bool = True     # CPU float32: weights in oneDNN's layout, multiplied by oneDNN
