"""The state pool: a zeroed slot per sequence, given back and reused, grown without losing what it holds, its
bytes counted; and the block manager taking and giving back a sequence's slot with its blocks."""
import torch

from engine.kv.block_manager import BlockManager
from engine.kv.block_pool import BlockPool
from engine.linear_attention.gated_deltanet_layer import LinearState
from engine.linear_attention.state_pool import StatePool, state_bytes_per_sequence
from engine.loading.config import ModelConfig
from engine.sampling import SamplingParams
from engine.sequence import Sequence

TINY = {"architectures": ["Qwen3_5ForCausalLM"], "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 4, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
        "full_attention_interval": 2, "linear_num_key_heads": 1, "linear_num_value_heads": 3,
        "linear_key_head_dim": 4, "linear_value_head_dim": 6, "linear_conv_kernel_dim": 4}


def tiny_pool(dtype: torch.dtype = torch.float32) -> StatePool:
    return StatePool.for_config(ModelConfig.from_dict(TINY), dtype, torch.device("cpu"))


def filled(pool: StatePool, layer: int, slot: int, value: float) -> LinearState:
    conv, recurrent = pool.conv[layer, slot], pool.recurrent[layer, slot]
    return LinearState(torch.full_like(conv, value), torch.full_like(recurrent, value))


def test_a_slot_holds_every_linear_layers_state_and_counts_its_bytes():
    config = ModelConfig.from_dict(TINY)
    for dtype in (torch.float32, torch.bfloat16):
        pool = StatePool.for_config(config, dtype, torch.device("cpu"))
        assert pool.conv.shape == (2, pool.capacity, 2 * 4 + 3 * 6, 3) and pool.conv.dtype == dtype
        assert pool.recurrent.shape == (2, pool.capacity, 3, 4, 6) and pool.recurrent.dtype == torch.float32
        measured = sum(t.numel() * t.element_size() for t in (pool.conv, pool.recurrent))
        assert pool.total_bytes == measured
        assert pool.bytes_per_slot == state_bytes_per_sequence(config, dtype.itemsize)


def test_a_freed_slot_is_reused_zeroed_and_the_pool_grows_keeping_what_it_holds():
    pool = tiny_pool()
    capacity = pool.capacity
    slots = [pool.allocate(seq_id) for seq_id in range(capacity)]
    for seq_id, slot in enumerate(slots):
        pool.for_step([seq_id]).write(1, [filled(pool, 1, slot, seq_id + 1.0)])
    pool.free(0)
    assert pool.allocate(100) == slots[0]
    assert not pool.conv[:, slots[0]].any() and not pool.recurrent[:, slots[0]].any()
    grown = pool.allocate(101)
    assert pool.capacity == 2 * capacity and grown >= capacity
    assert pool.slots_in_use == capacity + 1 and pool.bytes_in_use == (capacity + 1) * pool.bytes_per_slot
    for seq_id in range(1, capacity):
        state = pool.for_step([seq_id]).read(1)[0]
        assert torch.equal(state.recurrent, torch.full_like(state.recurrent, seq_id + 1.0))


def test_a_step_reads_and_writes_its_sequences_slots_in_the_steps_order():
    pool = tiny_pool()
    for seq_id in (7, 8, 9):
        pool.allocate(seq_id)
    step = pool.for_step([9, 7])
    step.write(0, [filled(pool, 0, 0, 9.0), filled(pool, 0, 0, 7.0)])
    nine, seven = pool.for_step([9, 7]).read(0)
    assert nine.conv.eq(9.0).all() and seven.recurrent.eq(7.0).all()
    assert not pool.for_step([8]).read(0)[0].recurrent.any()
    assert not pool.recurrent[1].any()


def test_the_block_manager_takes_a_slot_at_admit_and_gives_it_back_with_the_blocks():
    pool = tiny_pool()
    blocks = BlockManager(BlockPool(8, 4), enable_prefix_caching=True, states=pool)
    assert blocks.snapshots is not None and blocks.snapshots.storage.conv.shape[2:] == pool.conv.shape[2:]
    seq = Sequence(list(range(10)), SamplingParams(max_tokens=1))
    blocks.admit(seq)
    blocks.prepare_write(seq, 10)
    blocks.commit_written(seq, 10)
    assert pool.slot_of.keys() == {seq.seq_id}
    assert blocks.match_prefix(list(range(10)) + [5]) == ([], 0)   # its blocks, but no snapshot of its state
    child = Sequence(list(range(10)), SamplingParams(max_tokens=1))
    pool.for_step([seq.seq_id]).write(0, [filled(pool, 0, 0, 3.0)])
    blocks.fork(seq, child)
    assert pool.for_step([child.seq_id]).read(0)[0].conv.eq(3.0).all()
    blocks.free(seq)
    blocks.free(child)
    blocks.free(child)   # freeing twice, or a sequence never admitted, gives nothing back twice
    assert pool.slots_in_use == 0 and len(pool.free_slots) == pool.capacity
