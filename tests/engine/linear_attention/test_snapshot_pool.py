"""Snapshots of a hybrid sequence's state: taken where a prompt ends, found by the block manager's prefix match
only inside the blocks that prove the tokens before it, copied into an admitted sequence's fresh slot, dropped
when their block is reused, kept while it is pinned, and capped least recently used first.

A stand-in for the model writes a fingerprint of the tokens a sequence has computed into its slot, so whatever
state an admitted sequence starts from can be checked against the tokens it skipped."""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.kv.block_manager import BlockManager
from engine.kv.block_pool import BlockPool
from engine.linear_attention.state_pool import StatePool
from engine.sampling import SamplingParams
from engine.sequence import Sequence

BLOCK = 4


def fingerprint(tokens: list[int]) -> tuple[float, float]:
    return float(len(tokens)), float(sum((i + 1) * t for i, t in enumerate(tokens)) % 1_000_003)


def state_of(manager: BlockManager, seq: Sequence) -> tuple[float, float]:
    slot = manager.states.slot_of[seq.seq_id]
    held = manager.states.recurrent[0, slot, 0, 0]
    return float(held[0]), float(held[1])


def compute(manager: BlockManager, seq: Sequence, num_new: int) -> None:
    """What a step does to `seq`: write its next tokens' KV and move its state past them."""
    manager.prepare_write(seq, num_new)
    manager.commit_written(seq, num_new)
    slot = manager.states.slot_of[seq.seq_id]
    manager.states.recurrent[0, slot, 0, 0, :2] = torch.tensor(fingerprint(seq.token_ids[:seq.num_computed_tokens]))


def prefill(manager: BlockManager, tokens: list[int], chunk: int = 64) -> Sequence:
    seq = Sequence(list(tokens), SamplingParams(max_tokens=1))
    manager.admit(seq)
    while seq.num_uncomputed_tokens:
        compute(manager, seq, min(chunk, seq.num_uncomputed_tokens))
    manager.snapshot_state(seq)
    return seq


def hybrid_manager(num_blocks: int = 16, max_snapshots: int = 8) -> BlockManager:
    states = StatePool(1, conv_shape=(2, 3), recurrent_shape=(1, 2, 2), dtype=torch.float32, device=torch.device("cpu"))
    return BlockManager(BlockPool(num_blocks, BLOCK), states=states, max_snapshots=max_snapshots)


def test_a_prompt_matches_up_to_the_deepest_snapshot_its_tokens_reach_and_starts_from_it():
    manager = hybrid_manager()
    trunk = list(range(10, 20))   # ends inside its third block
    manager.free(prefill(manager, trunk[:4]))
    manager.free(prefill(manager, trunk))
    assert manager.snapshots.num_taken == 2
    assert manager.match_prefix(trunk + [7])[1] == 10
    assert manager.match_prefix(trunk[:9] + [7, 8])[1] == 4   # inside the trunk's last block: back to its first
    assert manager.match_prefix(trunk) == (manager.match_prefix(trunk[:4] + [1])[0], 4)   # a token is left to compute
    assert manager.match_prefix([9] + trunk) == ([], 0)
    seq = Sequence(trunk + [7, 8], SamplingParams(max_tokens=1))
    manager.admit(seq)
    assert seq.num_computed_tokens == seq.num_cached_tokens == 10 and len(seq.block_table) == 3
    assert state_of(manager, seq) == fingerprint(trunk)
    assert manager.snapshots.num_restored == 2   # the trunk itself started from its first block's snapshot
    other = Sequence(trunk + [5, 6], SamplingParams(max_tokens=1))
    manager.admit(other)
    [copy] = manager.prepare_write(seq, 2)   # the trunk's partly filled block, shared: copied before the suffix
    assert copy.src == other.block_table[-1] and copy.dst == seq.block_table[-1]
    assert state_of(manager, other) == fingerprint(trunk)


def test_a_snapshot_goes_when_its_block_is_reused_and_stays_while_it_is_pinned():
    manager = hybrid_manager(num_blocks=4)
    pinned = prefill(manager, [1, 2, 3, 4, 5, 6])
    manager.pin(pinned)
    manager.free(pinned)
    manager.free(prefill(manager, [9, 9, 9, 9, 9]))
    assert manager.snapshots.num_held == 2
    manager.free(prefill(manager, [8, 8, 8, 8, 8, 8, 8]))   # needs the two unpinned blocks: the [9]s' go
    assert manager.match_prefix([9, 9, 9, 9, 9, 1])[1] == 0
    assert manager.match_prefix([1, 2, 3, 4, 5, 6, 1])[1] == 6
    assert manager.snapshots.num_held == 2 and manager.snapshots.num_pinned == 1


def test_past_the_cap_the_least_recently_used_unpinned_snapshot_goes():
    manager = hybrid_manager(num_blocks=32, max_snapshots=2)
    trunk = prefill(manager, [1, 2, 3])
    manager.pin(trunk)
    first, second = prefill(manager, [4, 5, 6]), prefill(manager, [7, 8, 9])
    manager.admit(Sequence([4, 5, 6, 0], SamplingParams(max_tokens=1)))   # uses the first: the second is older now
    prefill(manager, [10, 11, 12])
    assert manager.snapshots.num_held == 3 and manager.snapshots.num_pinned == 1
    assert [manager.match_prefix(s.token_ids + [0])[1] for s in (trunk, first, second)] == [3, 3, 0]
    assert manager.snapshots.bytes_held == 3 * manager.states.bytes_per_slot


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 2), min_size=1, max_size=14), st.integers(1, 6), st.booleans()),
                min_size=1, max_size=12))
def test_every_admitted_sequence_starts_from_the_state_of_exactly_the_tokens_it_skips(requests):
    """Prompts from a three-token alphabet share prefixes often; a small pool reuses blocks often."""
    manager = hybrid_manager(num_blocks=10, max_snapshots=3)
    held: list[Sequence] = []
    for tokens, chunk, keep in requests:
        seq = Sequence(tokens, SamplingParams(max_tokens=1))
        if manager.blocks_to_admit(seq, len(tokens)) > manager.pool.num_free:
            while held:
                manager.free(held.pop())
        if manager.blocks_to_admit(seq, len(tokens)) > manager.pool.num_free:
            continue
        manager.admit(seq)
        assert state_of(manager, seq) == fingerprint(tokens[:seq.num_computed_tokens])   # zeros for none
        while seq.num_uncomputed_tokens:
            compute(manager, seq, min(chunk, seq.num_uncomputed_tokens))
        manager.snapshot_state(seq)
        if keep:
            held.append(seq)
        else:
            manager.free(seq)
    unpinned = manager.snapshots.num_held - manager.snapshots.num_pinned
    assert unpinned <= 3 and manager.snapshots.storage.slots_in_use == manager.snapshots.num_held
