"""Property-based tests of the block pool and the sequence-level block protocol."""
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.kv.block_manager import BlockManager
from engine.kv.block_pool import BlockPool
from engine.sampling import SamplingParams
from engine.sequence import Sequence

BLOCK = 4


class PoolMachine(RuleBasedStateMachine):
    """Random interleavings of admit (prefix-matching allocate), fork, append, free and
    evict-by-reuse. A shadow copy of every slot's token stands in for the KV tensors."""

    def __init__(self):
        super().__init__()
        self.pool = BlockPool(num_blocks=24, block_size=BLOCK)
        self.manager = BlockManager(self.pool)
        self.slots: dict[tuple[int, int], int] = {}
        self.seqs: list[Sequence] = []

    def _write(self, seq: Sequence, num_new: int) -> None:
        for copy in self.manager.prepare_write(seq, num_new):
            for offset in range(BLOCK):
                if (copy.src, offset) in self.slots:
                    self.slots[(copy.dst, offset)] = self.slots[(copy.src, offset)]
        start = seq.num_computed_tokens
        for pos in range(start, start + num_new):
            block = seq.block_table[pos // BLOCK]
            assert self.pool.ref_count(block) == 1, "wrote into a shared block"
            recorded = self.pool.blocks[block].token_ids
            assert pos % BLOCK >= len(recorded), "overwrote a registered token"
            self.slots[(block, pos % BLOCK)] = seq.token_ids[pos]
        self.manager.commit_written(seq, num_new)

    @rule(tokens=st.lists(st.integers(0, 3), min_size=1, max_size=14))
    def admit(self, tokens):
        seq = Sequence(tokens, SamplingParams())
        if self.manager.blocks_to_admit(seq, 1) > self.pool.num_free:
            return
        self.manager.admit(seq)
        needed = self.manager.blocks_to_write(seq, seq.num_uncomputed_tokens)
        if needed > self.pool.num_free:
            self.manager.free(seq)
            return
        self._write(seq, seq.num_uncomputed_tokens)
        self.seqs.append(seq)

    @precondition(lambda self: self.seqs)
    @rule(index=st.integers(0, 100))
    def fork(self, index):
        parent = self.seqs[index % len(self.seqs)]
        child = Sequence(list(parent.token_ids), SamplingParams())
        self.manager.fork(parent, child)
        self.seqs.append(child)

    @precondition(lambda self: self.seqs)
    @rule(index=st.integers(0, 100), token=st.integers(0, 3))
    def append(self, index, token):
        seq = self.seqs[index % len(self.seqs)]
        seq.token_ids.append(token)
        if self.manager.blocks_to_write(seq, 1) > self.pool.num_free:
            seq.token_ids.pop()
            return
        self._write(seq, 1)

    @precondition(lambda self: self.seqs)
    @rule(index=st.integers(0, 100))
    def free(self, index):
        self.manager.free(self.seqs.pop(index % len(self.seqs)))

    @rule()
    def reset_prefix_cache(self):
        in_use = {block for seq in self.seqs for block in seq.block_table}
        self.manager.reset_prefix_cache()
        assert not any(self.pool.is_cached(block.block_id) for block in self.pool.blocks)
        assert all(self.pool.blocks[block].parent_hash is not None for block in in_use
                   if self.pool.num_recorded(block))   # what sequences hold stays findable

    @invariant()
    def ref_counts_are_exact(self):
        expected = [0] * self.pool.num_blocks
        for seq in self.seqs:
            for block in seq.block_table:
                expected[block] += 1
        assert [b.ref_count for b in self.pool.blocks] == expected
        assert self.pool.num_free == sum(1 for n in expected if n == 0)

    @invariant()
    def every_sequence_reads_its_own_tokens(self):
        for seq in self.seqs:
            for pos in range(seq.num_computed_tokens):
                assert self.slots[(seq.block_table[pos // BLOCK], pos % BLOCK)] == seq.token_ids[pos]

    @invariant()
    def registered_content_is_what_the_slots_hold(self):
        for block in self.pool.blocks:
            for offset, token in enumerate(block.token_ids):
                assert self.slots[(block.block_id, offset)] == token

    def teardown(self):
        for seq in self.seqs:
            self.manager.free(seq)
        assert self.pool.num_free == self.pool.num_blocks
        assert all(b.ref_count == 0 for b in self.pool.blocks)


TestPoolMachine = PoolMachine.TestCase
TestPoolMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_allocation_reuses_least_recently_released_first():
    pool = BlockPool(4, BLOCK)
    a, b, _ = pool.allocate(), pool.allocate(), pool.allocate()
    pool.release(b)
    pool.release(a)
    assert [pool.allocate() for _ in range(3)] == [3, b, a]


def test_reviving_a_cached_block_keeps_its_hash_and_content():
    pool = BlockPool(4, BLOCK)
    manager = BlockManager(pool)
    seq = Sequence([1, 2, 3, 4, 5, 6], SamplingParams())
    manager.admit(seq)
    manager.prepare_write(seq, 6)
    manager.commit_written(seq, 6)
    first = seq.block_table[0]
    full_hash = pool.block_hash(first)
    manager.free(seq)
    assert pool.is_cached(first)
    again = Sequence([1, 2, 3, 4, 5, 6, 7], SamplingParams())
    manager.admit(again)
    assert again.block_table[0] == first and again.num_cached_tokens == 6
    assert pool.block_hash(first) == full_hash


def test_a_reset_prefix_cache_forgets_the_free_blocks_and_keeps_those_in_use():
    pool = BlockPool(8, BLOCK)
    manager = BlockManager(pool)
    done, running = Sequence([1, 2, 3, 4, 5, 6], SamplingParams()), Sequence([7, 8, 9, 10, 11], SamplingParams())
    for seq in (done, running):
        manager.admit(seq)
        manager.prepare_write(seq, seq.num_uncomputed_tokens)
        manager.commit_written(seq, seq.num_uncomputed_tokens)
    manager.free(done)
    assert manager.reset_prefix_cache() == 2
    assert manager.match_prefix([1, 2, 3, 4, 5, 6, 0]) == ([], 0)
    blocks, tokens = manager.match_prefix([7, 8, 9, 10, 11, 0])
    assert blocks == running.block_table and tokens == 5
    assert pool.num_free == 6


def test_pinned_blocks_are_never_reused():
    pool = BlockPool(3, BLOCK)
    manager = BlockManager(pool)
    trunk = Sequence([1, 2, 3, 4, 5], SamplingParams())
    manager.admit(trunk)
    manager.prepare_write(trunk, 5)
    manager.commit_written(trunk, 5)
    pinned = manager.pin(trunk)
    manager.free(trunk)
    assert pool.num_free == 1
    other = pool.allocate()
    assert other not in pinned and pool.num_free == 0
    manager.unpin(pinned)
    assert pool.num_free == 2


def test_fork_shares_partial_block_and_first_write_copies_it():
    pool = BlockPool(6, BLOCK)
    manager = BlockManager(pool)
    parent = Sequence([1, 2, 3, 4, 5, 6], SamplingParams())
    manager.admit(parent)
    manager.prepare_write(parent, 6)
    manager.commit_written(parent, 6)
    child = Sequence(list(parent.token_ids), SamplingParams())
    manager.fork(parent, child)
    assert child.block_table == parent.block_table
    assert all(pool.ref_count(b) == 2 for b in parent.block_table)
    child.token_ids.append(9)
    copies = manager.prepare_write(child, 1)
    assert len(copies) == 1 and copies[0].src == parent.block_table[1]
    assert child.block_table[0] == parent.block_table[0] and child.block_table[1] == copies[0].dst
    assert pool.ref_count(parent.block_table[1]) == 1


@given(st.lists(st.integers(0, 5), min_size=2, max_size=30))
def test_match_leaves_at_least_one_token_to_compute(tokens):
    pool = BlockPool(20, BLOCK)
    manager = BlockManager(pool)
    first = Sequence(list(tokens), SamplingParams())
    manager.admit(first)
    manager.prepare_write(first, len(tokens))
    manager.commit_written(first, len(tokens))
    blocks, matched = manager.match_prefix(tokens)
    assert matched == len(tokens) - 1
