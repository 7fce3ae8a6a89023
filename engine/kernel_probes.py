"""The machine probe's timings of swarm's own CPU kernels (engine/machine_probe.py's attention_flop_s,
decode_flop_s, panels_speedup and codes_speedup): for `dtype: auto`'s choice of the prompts' attention and the decode
rows' products, and for keeping bfloat16 panels or code panels beside a model's blocks."""
from __future__ import annotations

from typing import Callable

import torch

from engine.probe_timing import fastest_each

ATTENTION_SHAPE = (1024, 9, 3, 64)   # tokens, heads, KV heads, head width: a SmolLM2 layer's causal prompt
DECODE_SHAPE = (1536, 576)   # outputs, inputs: SmolLM2's gate projection
DECODE_ROWS = (1, 8)         # a lone agent's step, and 8 agents'
PANELS_SHAPE = (65536, 2048)  # outputs, inputs: 84 MB of Q4_1 blocks, past the L3 cache as a model's weights are
                              # (at 21 MB the blocks stayed in this VM's 32 MB: a lone row 0.8x from panels, 1.04x
                              # here), and 268 MB of panels


def attention_precisions() -> list[str]:
    """The precisions of the prompt attention's products a probe times: none without the C kernel."""
    from kernels.cpu import native_attention  # builds the kernels, once per machine
    if not native_attention.available():
        return []
    return (["float32"] + (["bfloat16"] if native_attention.rows_attention_bf16_native() else [])
            + (["int8"] if native_attention.rows_attention_int8_native() else []))


def attention_rates(precisions: list[str], budget_s: float) -> dict[str, float]:
    """FLOP/s of the C prompt attention on a causal ATTENTION_SHAPE prompt, its products in each precision, timed
    side by side (budget_s: per precision)."""
    from kernels.cpu import native_attention
    tokens, heads, kv_heads, dim = ATTENTION_SHAPE
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(tokens, heads, dim, generator=generator)
    k, v = (torch.randn(tokens, kv_heads, dim, generator=generator) for _ in range(2))
    flops = 2 * 2 * heads * dim * tokens * (tokens + 1) // 2   # two products over each token's keys

    def attend(precision: str) -> Callable[[], object]:
        return lambda: native_attention.rows_attention(q, k, v, dim ** -0.5, True, bf16=precision == "bfloat16",
                                                       int8=precision == "int8")

    seconds = fastest_each({p: attend(p) for p in precisions}, budget_s * len(precisions))
    return {precision: flops / s for precision, s in seconds.items()}


def decode_precisions() -> list[str]:
    """The precisions of the decode matmul's products a probe times: none without the C kernel."""
    from kernels.cpu import quant_matmul  # builds the kernel, once per machine
    if not quant_matmul.available():
        return []
    return ["float32"] + (["bfloat16"] if quant_matmul.bf16_native() else [])


def decode_rates(precisions: list[str], budget_s: float) -> dict[str, dict[str, float]]:
    """FLOP/s of the C decode matmul of each of DECODE_ROWS rows against a DECODE_SHAPE weight in Q4_1, its
    products in each precision: {precision: {rows: FLOP/s}}, the precisions timed side by side at each row count
    (budget_s: per precision and row count)."""
    import gguf.quants
    import numpy as np

    from kernels.cpu.weight_set import WeightSet
    from kernels.reference.quant_blocks import QuantizedTensor
    outputs, inputs = DECODE_SHAPE
    values = np.random.default_rng(0).standard_normal((outputs, inputs)).astype(np.float32)
    weight = QuantizedTensor(torch.from_numpy(gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q4_1)), "Q4_1",
                             inputs)
    matmuls = {precision: WeightSet([weight], [None], bf16=precision == "bfloat16") for precision in precisions}
    calls = 20   # a call takes tens of microseconds: a run of them is timed
    rates: dict[str, dict[str, float]] = {precision: {} for precision in precisions}
    for rows in DECODE_ROWS:
        x = torch.randn(rows, inputs, generator=torch.Generator().manual_seed(0))

        def run(matmul: WeightSet) -> Callable[[], object]:
            return lambda: [matmul(x) for _ in range(calls)]

        seconds = fastest_each({p: run(matmul) for p, matmul in matmuls.items()}, budget_s * len(precisions))
        for precision, s in seconds.items():
            rates[precision][str(rows)] = calls * 2 * rows * outputs * inputs / s
    return rates


def panels_probed() -> bool:
    """Whether a probe times panels and code panels against blocks: the bfloat16 kernels multiply natively."""
    from kernels.cpu import bf16_matmul, code_matmul, quant_matmul  # builds the kernels, once per machine
    return (quant_matmul.available() and quant_matmul.bf16_native() and bf16_matmul.available()
            and bf16_matmul.native() and code_matmul.available() and code_matmul.native())


def layout_speedups(budget_s: float) -> dict[str, dict[str, float]]:
    """{"panels" and "codes": {rows: the decode matmul's time from a PANELS_SHAPE Q4_1 weight's blocks over its
    time from that layout}}, bfloat16 products, DECODE_ROWS rows; and "int8": the same from its code panels in
    integer products, where they are native; all timed side by side (budget_s: per (layout, rows))."""
    from kernels.cpu import bf16_matmul, code_matmul, code_prompt
    from kernels.cpu.weight_set import WeightSet
    weight = random_q4_1(*PANELS_SHAPE)
    codes = [code_matmul.pack(weight)]
    sets = {"blocks": WeightSet([weight], [None], bf16=True),
            "panels": WeightSet([weight], [None], bf16=True, panels=[bf16_matmul.pack_quantized(weight)]),
            "codes": WeightSet([weight], [None], bf16=True, code_panels=codes)}
    if code_prompt.native():
        sets["int8"] = WeightSet([weight], [None], code_panels=codes, int8=True)
    speedups: dict[str, dict[str, float]] = {layout: {} for layout in sets if layout != "blocks"}
    for rows in DECODE_ROWS:
        x = torch.randn(rows, PANELS_SHAPE[1], generator=torch.Generator().manual_seed(0))
        seconds = fastest_each({name: (lambda s=s: s(x)) for name, s in sets.items()}, 3 * budget_s)
        for layout, by_rows in speedups.items():
            by_rows[str(rows)] = seconds["blocks"] / seconds[layout]
    return speedups


def random_q4_1(outputs: int, inputs: int):
    """A Q4_1 weight of random codes under one scale and offset: what a step reads, at no quantizing cost."""
    import numpy as np

    from kernels.reference.quant_blocks import QuantizedTensor
    blocks = np.random.default_rng(0).integers(0, 256, (outputs, inputs // 32, 20), dtype=np.uint8)
    blocks[:, :, 0:2] = np.frombuffer(np.float16(0.01).tobytes(), dtype=np.uint8)
    blocks[:, :, 2:4] = np.frombuffer(np.float16(-0.08).tobytes(), dtype=np.uint8)
    return QuantizedTensor(torch.from_numpy(blocks.reshape(outputs, -1)), "Q4_1", inputs)
