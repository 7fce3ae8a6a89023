"""4-bit weights also kept as nibble panels, for the decode rows' bfloat16 products on a CPU.

Expanding a Q4 block to bfloat16 values before its products (kernels/cpu/csrc/quant_columns.h) took most of a
decode step's matmul time on two Zen 4 cores. Nibble panels (kernels/cpu/csrc/nibble_matmul.c) keep the codes,
16 weight rows side by side, with each sub-block's scale and offset, and multiply the codes themselves: two vector
ops make 64 codes operands, and the scale and offset come in once a sub-block. SmolLM2's gate_proj took 1.7x less
time for 8 rows, 3.4x less for one. A row's bits still depend on its own values only; they differ from the blocks'
path (which rounds each value to bfloat16 first) by the rounding of the weights, and are nearer float32's.

They cost 1.2x the Q4_1 blocks' bytes beside them (prompt rows still read the blocks). `auto` keeps them where the
machine probe timed the decode matmul of 1 and of 8 rows faster from them than from the blocks (`nibbles_speedup`,
side by side) and they take at most a quarter of the available memory. A weight set whose weights are not all
Q4_0, Q4_1 or Q4_K (a Q4_K_M file's Q6_K layers beside Q4_K ones) keeps the blocks' path.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.errors import OptionError
from engine.machine_probe import DECODE_ROWS, MachineProbe, cached_probe
from engine.packed_weights import PANELS_SHARE, available_host_bytes, quantized_layers
from engine.prompt_matmul import Precisions
from engine.quantized_layers import QuantizedLinear
from kernels.cpu import nibble_matmul


def nibble_layers(net: nn.Module) -> list[QuantizedLinear]:
    return [layer for layer in quantized_layers(net) if nibble_matmul.packable(layer.quantized)]


def nibbles_bytes(layers: list[QuantizedLinear]) -> int:
    total = 0
    for layer in layers:
        panels, subs, cell = nibble_matmul.panels_shape(*layer.quantized.shape)
        total += panels * subs * cell
    return total


def can_use(device: torch.device, precisions: Precisions) -> bool:
    """Nibble panels serve decode rows in bfloat16 products, on a build that multiplies them natively."""
    return (device.type == "cpu" and precisions.decode == "bfloat16" and nibble_matmul.available()
            and nibble_matmul.native())


def faster_from_nibbles(probe: MachineProbe) -> bool:
    return all(probe.nibbles_speedup.get(str(rows), 0.0) > 1.0 for rows in DECODE_ROWS)


def choose_nibbles(option: bool | None, device: torch.device, precisions: Precisions, net: nn.Module) -> bool:
    """option: True or False as asked; None: auto (the module's top)."""
    layers = nibble_layers(net)
    if not layers:
        return False
    if not can_use(device, precisions):
        if option:
            raise OptionError("nibble_panels needs bfloat16 decode products on swarm's CPU kernels with AVX512-BF16 "
                              "(dtype: auto on such a CPU); leave it unset")
        return False
    if option is not None:
        return option
    if nibbles_bytes(layers) > PANELS_SHARE * available_host_bytes():
        return False
    return faster_from_nibbles(cached_probe())


def pack(net: nn.Module) -> int:
    """Every 4-bit layer's nibble panels made; their bytes."""
    layers = nibble_layers(net)
    for layer in layers:
        layer.use_nibbles(nibble_matmul.pack(layer.quantized))
    return nibbles_bytes(layers)
