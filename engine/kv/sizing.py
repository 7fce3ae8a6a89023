"""How many blocks the KV pool gets, decided once at start, before the pool exists.

    GPU   pool = free memory after the weights - the profile step's peak - RUNTIME_RESERVE_BYTES
                 - a hybrid's linear state (its sequences' slots and snapshots), capped by kv_budget
    CPU   pool = kv_budget, else DEFAULT_CPU_KV_TOKENS (at most 8 model contexts)
    both  never fewer tokens than the caller's KVFloor (its trunk and one agent's context after it):
          KVPoolTooSmall otherwise, saying what fits

The profile step runs the largest steps the scheduler may run through the real model and attention
backend, over a pool of PROFILE_BLOCKS blocks every slot maps into (the values do not matter; the
shapes do): max_num_batched_tokens of prompt at the end of the longest context a sequence can have,
and max_num_seqs rows at that context, all but one decoding beside a mixed step's prompt chunk. The
block tables are as long as that context, so what attention gathers and materializes is counted.
On the CPU the profile is skipped: host memory is not what sizes the pool there, and the profile
would cost seconds of prefill compute at every start.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.errors import SwarmError
from engine.kv.cache import KVCache, blocks_for_budget
from engine.kv.device_memory import DeviceMemory
from engine.linear_attention.state_pool import StatePool, state_reserve_bytes
from engine.loading.config import ModelConfig, kv_bytes_per_token
from engine.model import CausalLM
from engine.model_runner import ModelRunner
from engine.options import RUNTIME_RESERVE_BYTES, EngineOptions, KVFloor
from engine.sampling import SamplingParams
from engine.scheduler import ScheduledBatch
from engine.sequence import Sequence

DEFAULT_CPU_KV_TOKENS = 65536
PROFILE_BLOCKS = 4


class KVPoolTooSmall(SwarmError):
    """The KV pool would not hold the caller's trunk and one agent's context."""


@dataclass(frozen=True, slots=True)
class KVSizing:
    """The pool decided at start, and the figures it was decided from (free_bytes None: on the CPU)."""

    num_blocks: int
    block_size: int
    block_bytes: int
    limited_by: str                  # "memory", "kv_budget" or "cpu default"
    free_bytes: int | None = None    # the device's free memory after the weights and the profile
    peak_bytes: int = 0              # the profile step's peak activations
    reserve_bytes: int = 0

    @property
    def pool_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.block_bytes

    def to_json(self) -> dict:
        return {"pool_tokens": self.pool_tokens, "pool_bytes": self.pool_bytes, "limited_by": self.limited_by,
                "free_bytes": self.free_bytes, "peak_bytes": self.peak_bytes, "reserve_bytes": self.reserve_bytes}


def size_kv_pool(net: CausalLM, config: ModelConfig, options: EngineOptions, dtype: torch.dtype,
                 device: torch.device, memory: DeviceMemory | None, kv_dtype: torch.dtype | None = None) -> KVSizing:
    """The pool for `net` computing in `dtype`, its K and V kept in `kv_dtype` (None: `dtype`); `memory` None sizes
    it by the CPU's default, else by what `memory` has free."""
    kv_dtype = kv_dtype or dtype
    block_bytes = options.block_size * kv_bytes_per_token(config.num_kv_layers, config.num_kv_heads,
                                                          config.head_dim, kv_dtype.itemsize)
    budget = _budget_blocks(config, options, kv_dtype)
    if memory is None:
        default = blocks_for_budget(config, options.block_size, kv_dtype,
                                    min(DEFAULT_CPU_KV_TOKENS, 8 * config.max_position_embeddings))
        sizing = KVSizing(budget or default, options.block_size, block_bytes,
                          "kv_budget" if budget else "cpu default")
    else:
        peak = profile_peak(net, config, options, dtype, device, memory)
        free = memory.free_bytes()
        reserve = RUNTIME_RESERVE_BYTES + state_reserve_bytes(config, options.max_num_seqs, dtype.itemsize)
        fits = max(0, (free - peak - reserve) // block_bytes)
        limited_by = "kv_budget" if budget is not None and budget < fits else "memory"
        sizing = KVSizing(min(fits, budget or fits), options.block_size, block_bytes, limited_by,
                          free, peak, reserve)
    check_floor(sizing, options.kv_floor)
    return sizing


def check_floor(sizing: KVSizing, floor: KVFloor | None) -> None:
    """KVPoolTooSmall, one line saying what fits, when the pool is empty or below `floor`."""
    size = sizing.block_size
    need = 0 if floor is None else size * (_blocks(floor.trunk_tokens, size) + _blocks(floor.agent_tokens, size))
    have = sizing.pool_tokens
    if have >= max(need, size):
        return
    message = f"the KV pool holds {have:,} tokens ({_where_from(sizing)})"
    if floor is not None:
        trunk = _blocks(floor.trunk_tokens, size) * size
        message += (f"; the run needs {need:,} (trunk {floor.trunk_tokens:,} + one agent's {floor.agent_tokens:,}): "
                    f"at this pool an agent's context fits {max(0, have - trunk):,} tokens after the trunk, "
                    f"or a trunk of {max(0, have - need + trunk):,} beside one agent")
    raise KVPoolTooSmall(f"{message}; {_remedy(sizing, floor is not None)}")


def profile_peak(net: CausalLM, config: ModelConfig, options: EngineOptions, dtype: torch.dtype,
                 device: torch.device, memory: DeviceMemory) -> int:
    """The most the largest steps allocate beyond the weights and a temporary PROFILE_BLOCKS pool
    (freed when this returns)."""
    context = profile_context(config, options, dtype)
    kv = KVCache.allocate(config, PROFILE_BLOCKS, options.block_size, dtype, device)
    steps = [prefill_step(options, context), mixed_step(options, context)]
    runner = ModelRunner(net, kv, device, options.cascade_attention, states=_profile_states(config, dtype, device,
                                                                                           steps))
    try:
        return max(memory.peak_during(lambda: runner.run(step)) for step in steps)
    except torch.OutOfMemoryError:
        raise KVPoolTooSmall(f"a {options.max_num_batched_tokens:,}-token step at a {context:,}-token context "
                             "does not fit beside the weights; lower max_num_batched_tokens or kv_budget, "
                             "or use smaller weights (--weights)") from None


def _profile_states(config: ModelConfig, dtype: torch.dtype, device: torch.device,
                    steps: list[ScheduledBatch]) -> StatePool | None:
    """A hybrid's state pool with a slot for each stand-in sequence of `steps`; None for other models."""
    if not config.is_hybrid:
        return None
    states = StatePool.for_config(config, dtype, device)
    for step in steps:
        for seq in step.seqs:
            states.allocate(seq.seq_id)
    return states


def profile_context(config: ModelConfig, options: EngineOptions, dtype: torch.dtype) -> int:
    """The longest context a sequence can reach: the model's context, or the caller's floor where
    that is longer; never more than kv_budget holds."""
    floor = options.kv_floor
    longest = max(config.max_position_embeddings, floor.trunk_tokens + floor.agent_tokens if floor else 0)
    budget = _budget_blocks(config, options, dtype)
    return max(1, min(longest, budget * options.block_size) if budget else longest)


def prefill_step(options: EngineOptions, context: int) -> ScheduledBatch:
    """max_num_batched_tokens of prompt: one chunk ending a `context`-token sequence, or, where the
    budget is longer than that, whole prompts of `context` tokens while the budget and max_num_seqs last."""
    batch, left = ScheduledBatch(), options.max_num_batched_tokens
    while left > 0 and len(batch.seqs) < options.max_num_seqs:
        new = min(left, context)
        batch.add_chunk(_stand_in(context, new, options.block_size), new)
        left -= new
    return batch


def mixed_step(options: EngineOptions, context: int) -> ScheduledBatch:
    """max_num_seqs rows at `context` tokens: one prompt chunk of the mixed budget, the others decoding."""
    batch, decoding = ScheduledBatch(), options.max_num_seqs - 1
    for _ in range(decoding):
        batch.add_decode(_stand_in(context, 1, options.block_size))
    # what the scheduler leaves a prompt beside `decoding` rows (Scheduler._prefill_budget)
    chunk = max(min(options.mixed_step_tokens, options.max_num_batched_tokens) - decoding, options.block_size)
    chunk = min(chunk, context)
    batch.add_chunk(_stand_in(context, chunk, options.block_size), chunk)
    return batch


def _stand_in(context: int, new: int, block_size: int) -> Sequence:
    """A sequence of `context` tokens whose last `new` are computed next; its blocks all map into the
    profile's small pool, the same table for every row, as agents over one trunk have."""
    seq = Sequence([0] * context, SamplingParams(max_tokens=1))
    seq.num_computed_tokens = context - new
    seq.block_table = [i % PROFILE_BLOCKS for i in range(_blocks(context, block_size))]
    return seq


def _budget_blocks(config: ModelConfig, options: EngineOptions, dtype: torch.dtype) -> int | None:
    tokens, budget = options.kv_budget_tokens, options.kv_budget_bytes
    if tokens is None and budget is None:
        return None
    return blocks_for_budget(config, options.block_size, dtype, tokens, budget)


def _where_from(sizing: KVSizing) -> str:
    if sizing.limited_by == "kv_budget":
        return "as kv_budget asks"
    if sizing.free_bytes is None:
        return "the CPU's default"
    return (f"{_gb(sizing.free_bytes)} free after the weights - {_gb(sizing.peak_bytes)} for the largest "
            f"step's activations - {_gb(sizing.reserve_bytes)} reserved")


def _remedy(sizing: KVSizing, has_trunk: bool) -> str:
    if sizing.free_bytes is None or sizing.limited_by == "kv_budget":
        remedy = "raise kv_budget"
    else:
        remedy = "free memory on the card, use smaller weights (--weights)"
    return remedy + (" or shorten the trunk (fewer rules and tools)" if has_trunk else "")


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _gb(n: int) -> str:
    return f"{n / 1e9:.2f} GB"
