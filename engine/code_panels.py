"""Quantized weights also kept as code panels, for the decode rows' bfloat16 products on a CPU.

A decode row's matmul from a weight's blocks expands each block to bfloat16 values before its products
(kernels/cpu/csrc/quant_columns.h): on two Zen 4 cores that expansion, not memory, took most of a decode step's
matmul time. Code panels (kernels/cpu/csrc/code_matmul.c) keep the integer codes, 16 weight rows side by side,
with each sub-block's scale and offset, and multiply the codes themselves: two vector ops make 64 four-bit codes
operands (five, 32 eight-bit ones), and the scale and offset come in once a sub-block. Against a 4,096 x 4,096
Q4_1 weight, 8 rows took 1.45x less time, one row 3.2x less. A row's bits still depend on its own values only;
they differ from the blocks' path, which rounds each value to bfloat16 first, and are nearer float32's.

Q4_0, Q4_1, Q4_K and Q8_0 layers get them, at 1.2x their blocks' bytes beside the blocks (prompt rows read the
blocks, or in integer products the code panels: kernels/cpu/code_prompt.py, engine/prompt_matmul.py). `auto`
keeps them where the machine probe timed the decode matmul of 1 and of 8 rows faster from them than from the
blocks (`codes_speedup`, side by side), or prompts take integer products, and they take at most a quarter of the
available memory. A weight set whose weights do not all have them (a Q4_K_M file's Q6_K layers beside Q4_K ones)
keeps the blocks.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.kernel_probes import DECODE_ROWS
from engine.machine_probe import INT8_KERNEL, MachineProbe
from engine.packed_weights import choose_layout, quantized_layers
from engine.prompt_matmul import Precisions
from engine.quantized_layers import QuantizedLinear
from kernels.cpu import code_matmul


def code_layers(net: nn.Module) -> list[QuantizedLinear]:
    return [layer for layer in quantized_layers(net) if code_matmul.packable(layer.quantized)]


def code_panels_bytes(layers: list[QuantizedLinear]) -> int:
    total = 0
    for layer in layers:
        panels, subs, cell = code_matmul.panels_shape(layer.quantized.format, *layer.quantized.shape)
        total += panels * subs * cell
    return total


def can_use(device: torch.device, precisions: Precisions) -> bool:
    """Code panels serve decode rows in bfloat16 products, on a build that multiplies them natively."""
    return (device.type == "cpu" and precisions.decode in ("bfloat16", "int8") and code_matmul.available()
            and code_matmul.native())


def faster_from_codes(probe: MachineProbe) -> bool:
    return all(probe.codes_speedup.get(str(rows), 0.0) > 1.0 for rows in DECODE_ROWS)


def choose_code_panels(option: bool | None, device: torch.device, precisions: Precisions, net: nn.Module) -> bool:
    """option: True or False as asked; None: auto (the module's top). Prompt rows in integer products need them:
    there auto keeps them where they take at most a quarter of the available memory."""
    prompts_read_them = precisions.prompt == INT8_KERNEL
    return choose_layout(option, code_layers(net), prompts_read_them or can_use(device, precisions),
                         "code_panels needs bfloat16 decode products on swarm's CPU kernels with AVX512-BF16 "
                         "(dtype: auto on such a CPU); leave it unset", code_panels_bytes,
                         (lambda probe: True) if prompts_read_them else faster_from_codes)


def pack(net: nn.Module) -> int:
    """The code panels of every layer in a format they take, made; their bytes."""
    layers = code_layers(net)
    for layer in layers:
        layer.use_code_panels(code_matmul.pack(layer.quantized))
    return code_panels_bytes(layers)
