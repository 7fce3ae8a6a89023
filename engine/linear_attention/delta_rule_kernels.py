"""Which kernels run the gated delta rule: flash-linear-attention's Triton kernels on a GPU, PyTorch on a CPU.

    SWARM_DELTA_RULE_BACKEND   unset/auto: fla on a GPU (CUDA or ROCm build of torch) where fla-core imports
                                           (pip install 'swarm-llm[gpu]'), else torch
                               torch:      always the PyTorch rule (engine.linear_attention.gated_delta_rule),
                                           the CPU path and the oracle
                               fla:        always fla; on a CPU only under TRITON_INTERPRET=1 (slow: for tests)

Each set has the two shapes the Gated DeltaNet layer calls: `step` for B sequences' one token each, `prompts`
for several sequences' runs of tokens packed one after another.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cache
from typing import Callable

import torch

from engine.errors import SwarmError
from engine.linear_attention.gated_delta_rule import chunked_gated_delta_rule, recurrent_gated_delta_step
from kernels.triton import gated_delta_rule as fla
from kernels.triton import interpreted

BACKEND_ENV = "SWARM_DELTA_RULE_BACKEND"
CHOICES = ("auto", "torch", "fla")


class DeltaRuleBackendError(SwarmError):
    """A SWARM_DELTA_RULE_BACKEND that cannot run here."""


@dataclass(frozen=True, slots=True)
class DeltaRuleKernels:
    name: str
    step: Callable      # (q, k, v, g, beta, state [B, ...]) -> (out [B, ...], state)
    prompts: Callable   # (q, k, v, g, beta, seq_lens, states [n, ...]) -> (out [tokens, ...], states)


def torch_prompts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                  seq_lens: list[int], states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The chunked rule, one sequence at a time."""
    outputs, finals = [], []
    for part, state in zip(zip(*(x.split(seq_lens) for x in (q, k, v, g, beta))), states):
        out, final = chunked_gated_delta_rule(*part, state)
        outputs.append(out)
        finals.append(final)
    return torch.cat(outputs), torch.stack(finals)


TORCH_KERNELS = DeltaRuleKernels("torch", recurrent_gated_delta_step, torch_prompts)
FLA_KERNELS = DeltaRuleKernels("fla", fla.step, fla.prompts)


def delta_rule_kernels(device_type: str) -> DeltaRuleKernels:
    """The set for tensors on `device_type`, as SWARM_DELTA_RULE_BACKEND asks."""
    return _kernels_for(device_type, os.environ.get(BACKEND_ENV, "").strip().lower() or "auto", interpreted())


@cache
def _kernels_for(device_type: str, choice: str, interpreted: bool) -> DeltaRuleKernels:
    if choice not in CHOICES:
        raise DeltaRuleBackendError(f"{BACKEND_ENV}={choice!r} is not a backend: use torch or fla, or unset it")
    if choice == "torch":
        return TORCH_KERNELS
    on_gpu = device_type == "cuda"
    if choice == "auto":
        return FLA_KERNELS if on_gpu and fla.available() else TORCH_KERNELS
    if not (on_gpu or interpreted):
        raise DeltaRuleBackendError(f"{BACKEND_ENV}=fla on {device_type} runs only under TRITON_INTERPRET=1 "
                                    f"(slow, for tests); unset {BACKEND_ENV} to use torch")
    if not fla.available():
        raise DeltaRuleBackendError(f"{BACKEND_ENV}=fla needs flash-linear-attention's kernels: "
                                    "pip install 'swarm-llm[gpu]' (fla-core)")
    return FLA_KERNELS
