"""engine/kv/sizing.py: the KV pool decided at start. Only the device's free figure is substituted
(`Card`); the profile step runs the real tiny model and attention backend, and its peak is what
torch's CPU allocator recorded (engine.kv.device_memory.HostAllocations)."""
from dataclasses import replace

import pytest
import torch

from engine.errors import SwarmError
from engine.kv.cache import KVCache
from engine.kv.device_memory import HostAllocations
from engine.kv.sizing import (
    DEFAULT_CPU_KV_TOKENS,
    KVPoolTooSmall,
    mixed_step,
    prefill_step,
    profile_context,
    profile_peak,
    size_kv_pool,
)
from engine.llm_engine import LLMEngine
from engine.options import RUNTIME_RESERVE_BYTES, EngineOptions, KVFloor
from engine.sampling import SamplingParams

BLOCK = 16
SMALL = EngineOptions(device="cpu", max_num_seqs=2, max_num_batched_tokens=64, kv_budget_tokens=256)


class Card(HostAllocations):
    """A device with `free` bytes free; the peak is measured for real."""

    def __init__(self, free: int):
        self.free = free

    def free_bytes(self) -> int:
        return self.free


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    return LLMEngine(str(tiny_model_dir("llama")), EngineOptions(device="cpu"))


def size(engine, options, memory):
    return size_kv_pool(engine.runner.model, engine.config, options, engine.dtype, engine.device, memory)


def block_bytes(engine) -> int:
    return KVCache.allocate(engine.config, 1, BLOCK, engine.dtype, engine.device).block_bytes


def test_the_pool_is_free_memory_less_the_measured_peak_and_the_reserve_in_whole_blocks(engine):
    options = replace(SMALL, kv_budget_tokens=None)
    peak = profile_peak(engine.runner.model, engine.config, options, engine.dtype, engine.device, HostAllocations())
    free = RUNTIME_RESERVE_BYTES + peak + 37 * block_bytes(engine) + 100
    sizing = size(engine, options, Card(free))
    assert sizing.peak_bytes == peak > 0
    assert (sizing.free_bytes, sizing.reserve_bytes) == (free, RUNTIME_RESERVE_BYTES)
    assert sizing.num_blocks == 37 and sizing.limited_by == "memory"
    assert sizing.pool_bytes == 37 * block_bytes(engine) and sizing.pool_tokens == 37 * BLOCK


def test_kv_budget_caps_the_pool_on_a_card_with_room_for_more(engine):
    sizing = size(engine, SMALL, Card(RUNTIME_RESERVE_BYTES + 2**30))
    assert (sizing.pool_tokens, sizing.limited_by) == (256, "kv_budget")


def test_a_kv_budget_larger_than_the_card_holds_gets_what_the_card_holds(engine):
    options = replace(SMALL, kv_budget_tokens=10**6)
    peak = profile_peak(engine.runner.model, engine.config, options, engine.dtype, engine.device, HostAllocations())
    sizing = size(engine, options, Card(RUNTIME_RESERVE_BYTES + peak + 20 * block_bytes(engine)))
    assert (sizing.num_blocks, sizing.limited_by) == (20, "memory")


def test_the_cpu_keeps_its_default_token_count_and_kv_budget_sets_it(engine):
    default = min(DEFAULT_CPU_KV_TOKENS, 8 * engine.config.max_position_embeddings)
    assert (engine.kv_sizing.pool_tokens, engine.kv_sizing.limited_by) == (default, "cpu default")
    assert engine.kv_capacity_tokens == default
    assert size(engine, replace(SMALL, kv_budget_tokens=100_000), None).pool_tokens == 100_000


def test_a_pool_below_the_trunk_and_one_agent_fails_at_start_saying_what_fits(engine):
    options = replace(SMALL, kv_budget_tokens=320, kv_floor=KVFloor(trunk_tokens=64, agent_tokens=300))
    with pytest.raises(KVPoolTooSmall) as raised:
        size(engine, options, None)
    assert str(raised.value) == (
        "the KV pool holds 320 tokens (as kv_budget asks); the run needs 368 (trunk 64 + one agent's 300): "
        "at this pool an agent's context fits 256 tokens after the trunk, or a trunk of 16 beside one agent; "
        "raise kv_budget or shorten the trunk (fewer rules and tools)")
    assert isinstance(raised.value, SwarmError) and raised.value.exit_code == 1


def test_a_card_too_small_for_the_floor_names_the_free_memory_the_peak_and_the_reserve(engine):
    options = replace(SMALL, kv_budget_tokens=None, kv_floor=KVFloor(trunk_tokens=64, agent_tokens=300))
    peak = profile_peak(engine.runner.model, engine.config, options, engine.dtype, engine.device, HostAllocations())
    free = RUNTIME_RESERVE_BYTES + peak + 10 * block_bytes(engine)
    with pytest.raises(KVPoolTooSmall) as raised:
        size(engine, options, Card(free))
    gb = lambda n: f"{n / 1e9:.2f} GB"  # noqa: E731
    assert str(raised.value) == (
        f"the KV pool holds 160 tokens ({gb(free)} free after the weights - {gb(peak)} for the largest step's "
        f"activations - {gb(RUNTIME_RESERVE_BYTES)} reserved); the run needs 368 (trunk 64 + one agent's 300): "
        "at this pool an agent's context fits 96 tokens after the trunk, or a trunk of 0 beside one agent; "
        "free memory on the card, use smaller weights (--weights) or shorten the trunk (fewer rules and tools)")


def test_a_card_with_no_room_left_fails_even_without_a_floor(engine):
    with pytest.raises(KVPoolTooSmall, match=r"^the KV pool holds 0 tokens \(.*\); free memory on the card, "
                                             r"use smaller weights \(--weights\)$"):
        size(engine, replace(SMALL, kv_budget_tokens=None), Card(RUNTIME_RESERVE_BYTES))


def test_the_engine_refuses_to_start_below_its_floor(tiny_model_dir):
    options = EngineOptions(device="cpu", kv_budget_tokens=256, kv_floor=KVFloor(trunk_tokens=100, agent_tokens=200))
    with pytest.raises(KVPoolTooSmall, match="the run needs 320"):
        LLMEngine(str(tiny_model_dir("llama")), options)


def test_the_engine_starts_and_generates_at_its_floor(tiny_model_dir):
    options = EngineOptions(device="cpu", kv_budget_tokens=320, kv_floor=KVFloor(trunk_tokens=100, agent_tokens=200))
    engine = LLMEngine(str(tiny_model_dir("llama")), options)
    seq = engine.add_request(list(range(4, 40)), SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_work():
        engine.step()
    assert seq.num_output_tokens == 3 and engine.kv_capacity_tokens == 320


def test_the_measured_peak_grows_with_the_step_token_budget(engine):
    def peak(tokens):
        options = replace(SMALL, max_num_batched_tokens=tokens)
        return profile_peak(engine.runner.model, engine.config, options, engine.dtype, engine.device,
                            HostAllocations())

    assert peak(32) < peak(64) < peak(256)


def test_the_measured_peak_counts_attention_over_a_longer_context(engine):
    def peak(context):
        options = replace(SMALL, max_num_batched_tokens=128, kv_budget_tokens=context)
        return profile_peak(engine.runner.model, engine.config, options, engine.dtype, engine.device,
                            HostAllocations())

    assert peak(128) < peak(2048)


def test_the_profile_context_is_the_model_context_or_a_longer_floor_within_kv_budget(engine):
    config, dtype = engine.config, engine.dtype
    context = config.max_position_embeddings
    assert profile_context(config, replace(SMALL, kv_budget_tokens=None), dtype) == context
    assert profile_context(config, SMALL, dtype) == 256
    short = replace(SMALL, kv_budget_tokens=None, kv_floor=KVFloor(trunk_tokens=100, agent_tokens=200))
    assert profile_context(config, short, dtype) == context   # an agent's later turns grow to the model's context
    long = replace(short, kv_floor=KVFloor(trunk_tokens=context, agent_tokens=200))
    assert profile_context(config, long, dtype) == context + 200


def test_the_prefill_profile_is_one_chunk_at_the_end_of_a_long_context():
    batch = prefill_step(EngineOptions(max_num_batched_tokens=2048), context=40960)
    assert batch.num_new == [2048] and batch.num_decode == 0
    seq = batch.seqs[0]
    assert (len(seq), seq.num_computed_tokens, len(seq.block_table)) == (40960, 40960 - 2048, 40960 // BLOCK)


def test_the_prefill_profile_spreads_a_budget_longer_than_the_context_over_whole_prompts():
    batch = prefill_step(EngineOptions(max_num_batched_tokens=2048, max_num_seqs=3), context=512)
    assert batch.num_new == [512, 512, 512]
    assert all(seq.num_computed_tokens == 0 and len(seq) == 512 for seq in batch.seqs)


def test_the_mixed_profile_fills_every_row_beside_a_prompt_chunk():
    options = EngineOptions(max_num_seqs=64, max_num_batched_tokens=2048, mixed_step_tokens=256)
    batch = mixed_step(options, context=4096)
    assert len(batch.seqs) == 64 and batch.num_decode == 63
    assert batch.num_new == [1] * 63 + [256 - 63]
    assert all(len(seq) == 4096 and seq.num_uncomputed_tokens == n for seq, n in zip(batch.seqs, batch.num_new))



@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_on_a_gpu_the_pool_is_sized_from_the_measured_profile(tiny_model_dir):
    from engine.kv.device_memory import CudaMemory

    options = EngineOptions(device="cuda", max_num_batched_tokens=512, kv_budget_tokens=4096)
    engine = LLMEngine(str(tiny_model_dir("llama")), options)   # a small pool: a whole H200 is millions of blocks
    assert (engine.kv_sizing.limited_by, engine.kv_capacity_tokens) == ("kv_budget", 4096)
    assert engine.kv_sizing.peak_bytes > 0
    sizing = size(engine, replace(options, kv_budget_tokens=None), CudaMemory(engine.device))
    assert sizing.limited_by == "memory" and 0 < sizing.peak_bytes
    assert sizing.num_blocks == (sizing.free_bytes - sizing.peak_bytes - RUNTIME_RESERVE_BYTES) // sizing.block_bytes
    seq = engine.add_request(list(range(4, 40)), SamplingParams(max_tokens=3, ignore_eos=True))
    while engine.has_work():
        engine.step()
    assert seq.num_output_tokens == 3


def test_a_hybrid_model_is_profiled_with_its_states_and_its_blocks_hold_only_full_attention_kv(tiny_model_dir):
    hybrid = LLMEngine(str(tiny_model_dir("qwen3_5")), EngineOptions(device="cpu", dtype="float32"))
    options = replace(SMALL, kv_budget_tokens=None)
    peak = profile_peak(hybrid.runner.model, hybrid.config, options, hybrid.dtype, hybrid.device, HostAllocations())
    per_block = block_bytes(hybrid)
    assert per_block == BLOCK * hybrid.config.kv_bytes_per_token("float32") == BLOCK * 2 * 1 * 2 * 16 * 4
    # kept apart from the pool: a state slot for each of max_num_seqs sequences, and as many snapshots
    states = 2 * options.max_num_seqs * hybrid.states.bytes_per_slot
    sizing = size(hybrid, options, Card(RUNTIME_RESERVE_BYTES + states + peak + 5 * per_block))
    assert sizing.block_bytes == per_block and sizing.num_blocks == 5
    assert sizing.reserve_bytes == RUNTIME_RESERVE_BYTES + states
