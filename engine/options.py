"""EngineOptions: how an engine is built and run (device, dtype, KV pool, batch limits, CPU kernels)."""
from __future__ import annotations

from dataclasses import dataclass

QUANTIZE_SCHEMES = ("q8_0", "q5_1", "q5_0", "q4_1", "q4_0")   # a checkpoint quantized at load by gguf
WEIGHT_SCHEMES = ("auto", "float", *QUANTIZE_SCHEMES)        # engine.loading.weight_plan says what each does
# What a GPU needs beside the weights, the KV pool and a step's activations (which engine.kv.sizing
# measures): the driver's context with torch's and the BLAS libraries' kernels loaded, the Triton and
# BLAS workspaces, the caching allocator's fragmentation, a few sequences' float32 logits.
RUNTIME_RESERVE_BYTES = 2**30


@dataclass(frozen=True, slots=True)
class KVFloor:
    """The fewest KV tokens a caller needs: its pinned trunk, and one agent's context after it."""

    trunk_tokens: int
    agent_tokens: int


@dataclass(slots=True)
class EngineOptions:
    device: str = "auto"
    dtype: str = "auto"
    block_size: int = 16
    max_model_len: int | None = None   # the served context; past the trained length only with a warning
    kv_budget_tokens: int | None = None
    kv_budget_bytes: int | None = None
    kv_floor: KVFloor | None = None   # engine.kv.sizing: a pool smaller than this fails at start
    enable_prefix_caching: bool = True
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048     # tokens a step computes when no sequence is decoding
    mixed_step_tokens: int = 256           # ... and beside decoding ones: the most a prompt delays them per step
    cascade_attention: bool = True
    weights: str = "auto"           # engine.loading.weight_plan: keep a GGUF's formats, float, or q8_0 & co
    onednn_weights: bool = True     # CPU float32: weights in oneDNN's layout, multiplied by oneDNN
    packed_weights: bool | None = None   # CPU bfloat16 products: quantized weights also kept as bfloat16 panels
                                         # (engine.packed_weights); None: where the machine reads them faster
    code_panels: bool | None = None      # CPU bfloat16 decode products: Q4 and Q8_0 weights also kept as code
                                         # panels (engine.code_panels); None: where the machine multiplies them faster
    cuda_graphs: bool = True        # a GPU's decode steps replayed as CUDA/HIP graphs (engine.decode_graphs)
