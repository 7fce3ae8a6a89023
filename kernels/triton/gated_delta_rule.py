"""The gated delta rule on a GPU: flash-linear-attention's Triton kernels (the optional `fla-core` package, for
CUDA and ROCm builds of torch), in the shapes of engine.linear_attention.gated_delta_rule, the PyTorch rule they
are checked against.

    prompts  several sequences' runs of tokens, packed one after another: one varlen call of fla's chunked rule
    step     one token for each of B sequences (decode): one call of fla's fused recurrent rule

Both continue from the float32 states they are given and return the new ones. q and k come L2-normalised and
unscaled (fla scales by k_dim^-0.5, as the PyTorch rule does); value head h reads key head h // (value_heads //
key_heads) in both. q, k and v go in v's dtype, as transformers hands them to fla.

Under TRITON_INTERPRET=1 (the tests on a CPU) two things fla's kernels take for granted on a GPU are provided:
a loop index with `.to()` (compiled Triton makes `range`'s index a tensor, the interpreter a Python int), and
one config per autotuner (the interpreter has no driver to time several on).
"""
from __future__ import annotations

import builtins
import sys
from functools import cache

import torch

from kernels.triton import interpreted


@cache
def available() -> bool:
    """fla-core imports here (and with it triton)."""
    try:
        _fla_ops()
    except Exception:   # not installed, or a build that does not load here
        return False
    return True


def prompts(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
            seq_lens: list[int], states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k: [tokens, key_heads, k_dim]; v: [tokens, value_heads, v_dim]; g, beta: [tokens, value_heads], the
    sequences' tokens one after another; seq_lens: each one's count; states: [sequences, value_heads, k_dim,
    v_dim]. Returns out [tokens, value_heads, v_dim] in v's dtype and the states after each sequence's last token."""
    chunked, _ = _fla_ops()
    cu_seqlens = torch.tensor([0, *seq_lens], device=v.device).cumsum(0)
    q, k, vv = (x.to(v.dtype).unsqueeze(0) for x in (q, k, v))
    out, final = chunked(q, k, vv, g.float().unsqueeze(0), beta.float().unsqueeze(0),
                         initial_state=states.float().contiguous(), output_final_state=True,
                         cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens.cpu())
    return out.squeeze(0).to(v.dtype), final.float()


def step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
         state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token for each of B sequences: q, k [B, key_heads, k_dim]; v [B, value_heads, v_dim]; g, beta
    [B, value_heads]; state [B, value_heads, k_dim, v_dim]. Returns out [B, value_heads, v_dim] and the states."""
    _, recurrent = _fla_ops()
    q, k, vv = (x.to(v.dtype).unsqueeze(1) for x in (q, k, v))
    out, final = recurrent(q, k, vv, g=g.float().unsqueeze(1), beta=beta.float().unsqueeze(1),
                           initial_state=state.float().contiguous(), output_final_state=True)
    return out.squeeze(1).to(v.dtype), final.float()


@cache
def _fla_ops():
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    if interpreted():
        _fit_fla_to_the_interpreter()
    return chunk_gated_delta_rule, fused_recurrent_gated_delta_rule


class _LoopIndex(int):
    """A loop index the interpreter can cast, as compiled Triton's is (`i_t.to(tl.int64)` in fla's kernels)."""

    def to(self, dtype, **kwargs):
        from triton.runtime import interpreter

        return interpreter._implicit_cvt(int(self)).to(dtype, **kwargs)


def _loop_range(*args):
    return (_LoopIndex(i) for i in builtins.range(*args))


def _fit_fla_to_the_interpreter() -> None:
    from triton.runtime.autotuner import Autotuner

    for name, module in list(sys.modules.items()):
        if not name.startswith("fla.ops") or module is None:
            continue
        module.range = _loop_range
        for value in vars(module).values():
            while value is not None:   # an autotuner may sit under heuristics, or hold a kernel that does
                if isinstance(value, Autotuner):
                    value.configs = value.configs[:1]
                value = getattr(value, "fn", None)
