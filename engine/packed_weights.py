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
- by the machine probe's rates, a decode step of 1 and of 8 rows takes less time from panels (their bytes at the
  read bandwidth, then their FLOPs at the bfloat16 kernel's rate) than from the blocks (their bytes, then their
  FLOPs at the decode matmul's measured rate for that many rows). The reads and the arithmetic are added, not
  overlapped: on this project's 2-core Zen 4, SmolLM2's lone-row step from memory took about their sum (its
  layers 10.3-10.5 ms from the blocks at 28-30 GB/s, against 3.4 + 7.1 estimated). Many cores expand fast and
  keep the blocks; few cores and good bandwidth read panels.
"""
from __future__ import annotations

import os

import torch
from torch import nn

from engine.errors import OptionError
from engine.machine_probe import DECODE_ROWS, KERNEL, MachineProbe, cached_probe
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


def faster_from_panels(probe: MachineProbe, params: int, panel_bytes: int, block_bytes: int) -> bool:
    """Whether a decode step of each of DECODE_ROWS rows takes less time from panels than from the blocks."""
    expanding = probe.decode_flop_s.get("bfloat16", {})
    kernel = probe.matmul_flop_s.get(KERNEL)
    if kernel is None or any(str(rows) not in expanding for rows in DECODE_ROWS):
        return False
    read = probe.read_bytes_per_s
    for rows in DECODE_ROWS:
        flops = 2 * params * rows
        from_panels = panel_bytes / read + flops / kernel.flop_s
        if from_panels >= block_bytes / read + flops / expanding[str(rows)]:
            return False
    return True


def choose_panels(option: bool | None, device: torch.device, precisions: Precisions, net: nn.Module) -> bool:
    """option: True or False as asked; None: auto (the module's top)."""
    layers = quantized_layers(net)
    if not layers:
        return False
    if not can_pack(device, precisions):
        if option:
            raise OptionError("packed_weights needs bfloat16 products on swarm's CPU kernels (dtype: auto on a CPU "
                              "with AVX512-BF16); leave it unset")
        return False
    if option is not None:
        return option
    nbytes = panels_bytes(layers)
    if nbytes > PANELS_SHARE * available_host_bytes():
        return False
    params = sum(layer.quantized.shape[0] * layer.quantized.shape[1] for layer in layers)
    return faster_from_panels(cached_probe(), params, nbytes, sum(layer.quantized.nbytes for layer in layers))


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
