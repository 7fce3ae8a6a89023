"""Quantized weights also kept as bfloat16 panels, where the CPU reads those faster than it expands the blocks.

With bfloat16 products on swarm's C kernels, a decode row's matmul expands each block of a weight into
bfloat16 in registers before it multiplies (kernels/cpu/csrc/quant_columns.h), and a prompt expands a tile at
a time into a scratch (kernels.cpu.bf16_matmul.quantized_linear). On a machine with few cores that expansion,
not memory, bounds a decode step: on a Zen 4 core, 8 rows against a 4,096 x 4,096 Q4_1 weight took 2.41 ms, and
1.70 without expanding the blocks (their bytes read as codes), the vector units taking one or the other.
Panels are the expanded weight laid out once (bf16_matmul.pack_quantized, 2 bytes a weight): every row, prompt
or decode, then multiplies them as a prompt does (swarm_bf16_matmul's sums), so a row's bits still never depend
on what it is batched with, and prompts skip their expansion too.

They cost memory (3.2x Q4_1's bytes), and a step reads more bytes. `auto` keeps them where both hold:
- the panels take at most PANELS_SHARE of the host's available memory;
- the machine probe timed the decode matmul of 1 and of 8 rows faster from panels than from the blocks
  (`panels_speedup`: a Q4_1 weight of 65,536 x 2,048 both ways, from memory, side by side). Many cores expand
  fast and keep the blocks; few cores and good bandwidth read panels. A rule from the probe's separate rates
  (bandwidth, the decode matmul's rate on a weight in the cache) missed both ways on this project's VM, whose
  bandwidth other tenants move between 28 and 51 GB/s.
"""
from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch import nn

from engine.errors import OptionError
from engine.kernel_probes import DECODE_ROWS
from engine.machine_probe import KERNEL, MachineProbe, cached_probe
from engine.prompt_matmul import Precisions
from engine.quantized_layers import QuantizedLinear
from kernels.cpu import bf16_matmul, entry_points

PANELS_SHARE = 0.25


def quantized_layers(net: nn.Module) -> list[QuantizedLinear]:
    return [module for module in net.modules() if isinstance(module, QuantizedLinear)]


def panels_bytes(layers: list[QuantizedLinear]) -> int:
    """What the layers' panels take: ceil(rows / 16) x 16 x ceil(cols / 2) 32-bit words each."""
    total = 0
    for layer in layers:
        panels, pairs, lanes = entry_points.bf16_panels_shape(*layer.quantized.shape)
        total += 4 * panels * pairs * lanes
    return total


def can_pack(device: torch.device, precisions: Precisions) -> bool:
    """Panels serve bfloat16 products on the C kernels, for prompts and decode rows alike."""
    return (device.type == "cpu" and precisions.prompt == KERNEL and precisions.decode == "bfloat16"
            and bf16_matmul.available())


def faster_from_panels(probe: MachineProbe) -> bool:
    """Whether the probe timed the decode matmul of each of DECODE_ROWS rows faster from panels."""
    return all(probe.panels_speedup.get(str(rows), 0.0) > 1.0 for rows in DECODE_ROWS)


def choose_panels(option: bool | None, device: torch.device, precisions: Precisions, net: nn.Module,
                  code_panels: bool = False) -> bool:
    """option: True or False as asked; None: auto (the module's top), never beside code panels (`code_panels`:
    engine.code_panels serves the decode rows, which the probe timed panels for)."""
    return choose_layout(option, quantized_layers(net), can_pack(device, precisions),
                         "packed_weights needs bfloat16 products on swarm's CPU kernels (dtype: auto on a CPU with "
                         "AVX512-BF16); leave it unset", panels_bytes, None if code_panels else faster_from_panels)


def choose_layout(option: bool | None, layers: list[QuantizedLinear], usable: bool, refusal: str,
                  layout_bytes: Callable[[list[QuantizedLinear]], int],
                  faster: Callable[[MachineProbe], bool] | None) -> bool:
    """Whether the layers also keep a copy laid out for the CPU kernels (bfloat16 panels here, code panels in
    engine.code_panels), where the kernels can use it (`usable`; asked for where they cannot: `refusal`, as an
    OptionError): option True or False as asked; None (auto): where the copy takes at most PANELS_SHARE of the
    available memory and the cached probe says it is `faster` (None: auto never keeps it)."""
    if not layers:
        return False
    if not usable:
        if option:
            raise OptionError(refusal)
        return False
    if option is not None:
        return option
    return (faster is not None and layout_bytes(layers) <= PANELS_SHARE * available_host_bytes()
            and faster(cached_probe()))


def pack(net: nn.Module) -> int:
    """Every quantized layer's panels made; their bytes."""
    layers = quantized_layers(net)
    for layer in layers:
        layer.use_panels(bf16_matmul.pack_quantized(layer.quantized))
    return panels_bytes(layers)


def available_host_bytes() -> int:
    """MemAvailable, or the free pages where /proc/meminfo has none."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
