"""Sequence-level KV block bookkeeping on top of the block pool.

The protocol the scheduler follows for every sequence:
    blocks_to_admit  how many free blocks admitting it and writing its first n tokens will take
    admit()          share the longest cached prefix of its tokens (no compute for it)
    blocks_to_write  how many free blocks writing the next n tokens will take
    writable_tokens  how many of its next tokens the free blocks can hold
    prepare_write()  grow the block table; copy a shared block before writing into it
    commit_written() make the freshly written tokens findable by other requests
    fork() / free()  share every block with a new sequence / drop this one's references

On a hybrid model (Qwen3.5) each sequence also holds a slot of linear-attention state (a StatePool's, from
engine.linear_attention.state_pool), taken at admit() and given back at free() with its blocks. That state
cannot be rewound, so a cached prefix is only of use up to a position whose state was kept:

    snapshot_state() at a prompt's end   keep a copy of the state there (engine.linear_attention.snapshot_pool)
    free()                               and where a sequence stops (finished, preempted, evicted)
    match_prefix()                       stop at the deepest snapshot inside the matched blocks
    admit()                              copy that snapshot into the sequence's fresh slot

    cached:   [ b0 full ][ b1 full ][ b2: 3 of 4 ]      snapshots at 4 (end of b0) and 11 (inside b2)
    prompt:   b0's tokens, b1's, b2's first 2, more      -> matched 4: b0 shared, the rest computed
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.kv.block_pool import ROOT_HASH, BlockPool, common_prefix
from engine.linear_attention.snapshot_pool import SnapshotPool
from engine.sequence import Sequence

if TYPE_CHECKING:
    from engine.linear_attention.state_pool import StatePool


@dataclass(slots=True)
class BlockCopy:
    src: int
    dst: int


@dataclass(slots=True)
class PrefixMatch:
    blocks: list[int]
    tokens: int
    snapshot_key: int | None = None   # a hybrid's: the state at `tokens`


class BlockManager:
    def __init__(self, pool: BlockPool, enable_prefix_caching: bool = True, states: "StatePool | None" = None,
                 max_snapshots: int = 64):
        self.pool = pool
        self.block_size = pool.block_size
        self.states = states
        self.enable_prefix_caching = enable_prefix_caching
        self.snapshots = None
        if states is not None and enable_prefix_caching:
            self.snapshots = SnapshotPool(states.empty_like(), pool.is_pinned, max_snapshots)
            pool.forget_listeners.append(self.snapshots.forget_block)
        self.lookup_tokens = 0
        self.hit_tokens = 0

    def match_prefix(self, token_ids: list[int]) -> tuple[list[int], int]:
        """Cached blocks that hold a prefix of `token_ids`, leaving at least one token to compute; on a hybrid
        model (one with a StatePool), up to the deepest snapshot of its state in them."""
        match = self._match(token_ids)
        return match.blocks, match.tokens

    def _match(self, token_ids: list[int]) -> PrefixMatch:
        if not self.enable_prefix_caching:
            return PrefixMatch([], 0)
        blocks, matched, parent = [], 0, ROOT_HASH
        deepest = PrefixMatch([], 0)
        limit = len(token_ids) - 1
        while matched < limit:
            chunk = token_ids[matched:min(matched + self.block_size, limit)]
            block_id, n = self.pool.longest_match(parent, chunk)
            if block_id is None:
                break
            blocks.append(block_id)
            snapshot = self.snapshots.deepest(parent, chunk[:n]) if self.snapshots is not None else None
            if snapshot is not None:
                deepest = PrefixMatch(list(blocks), matched + snapshot.offset, snapshot.key)
            matched += n
            if n < self.block_size:
                break
            parent = self.pool.block_hash(block_id)
        return deepest if self.snapshots is not None else PrefixMatch(blocks, matched)

    def prefix_gain(self, token_ids: list[int], other_ids: list[int]) -> int:
        """Tokens of `token_ids` a match could skip once `other_ids` (a prompt being computed) is: their common
        prefix; on a hybrid, all of `other_ids` or nothing, as its state is kept at its end only."""
        common = common_prefix(token_ids, other_ids)
        if self.snapshots is None:
            return common
        return common if common == len(other_ids) < len(token_ids) else 0

    def blocks_to_admit(self, seq: Sequence, num_new: int) -> int:
        """Free blocks taken by admitting `seq` and writing up to `num_new` tokens after its cached prefix."""
        blocks, matched = self.match_prefix(seq.token_ids)
        num_new = min(num_new, len(seq.token_ids) - matched)
        revived = sum(1 for b in blocks if self.pool.ref_count(b) == 0 and self.pool.blocks[b].pins == 0)
        return revived + self._blocks_for(len(blocks), matched, num_new, shared_last=bool(blocks))

    def admit(self, seq: Sequence) -> None:
        assert not seq.block_table
        match = self._match(seq.token_ids)
        for block_id in match.blocks:
            self.pool.acquire(block_id)
        seq.block_table = match.blocks
        seq.num_computed_tokens = match.tokens
        seq.num_cached_tokens = match.tokens
        if self.states is not None:
            self.states.allocate(seq.seq_id)
            if match.snapshot_key is not None:
                self.snapshots.restore(match.snapshot_key, self.states, seq.seq_id)
        self.lookup_tokens += len(seq.token_ids)
        self.hit_tokens += match.tokens

    def blocks_to_write(self, seq: Sequence, num_new: int) -> int:
        return self._blocks_for(len(seq.block_table), seq.num_computed_tokens, num_new,
                                self._must_copy_last(seq))

    def writable_tokens(self, seq: Sequence) -> int:
        blocks = self.pool.num_free - (1 if self._must_copy_last(seq) else 0)
        return max(0, (len(seq.block_table) + blocks) * self.block_size - seq.num_computed_tokens)

    def prepare_write(self, seq: Sequence, num_new: int) -> list[BlockCopy]:
        """Make the table cover the next `num_new` tokens; returns the copies to run first."""
        copies = []
        start = seq.num_computed_tokens
        if self._must_copy_last(seq):
            copies.append(self._copy_on_write(seq))
        needed = -(-(start + num_new) // self.block_size)
        while len(seq.block_table) < needed:
            seq.block_table.append(self.pool.allocate())
        for block_id in seq.block_table[start // self.block_size:needed]:
            assert self.pool.ref_count(block_id) == 1, f"write into shared block {block_id}"
        return copies

    def commit_written(self, seq: Sequence, num_new: int) -> None:
        start = seq.num_computed_tokens
        seq.num_computed_tokens = start + num_new
        if not self.enable_prefix_caching:
            return
        size = self.block_size
        for index in range(start // size, -(-seq.num_computed_tokens // size)):
            parent = ROOT_HASH if index == 0 else self.pool.block_hash(seq.block_table[index - 1])
            tokens = seq.token_ids[index * size:min((index + 1) * size, seq.num_computed_tokens)]
            self.pool.record_tokens(seq.block_table[index], parent, tokens)

    def snapshot_state(self, seq: Sequence) -> None:
        """On a hybrid, keep a copy of `seq`'s state where its computed tokens end (its prompt's end, or where it
        stopped when its blocks are freed), keyed by their content hash, so a prompt starting with them starts
        there."""
        if self.snapshots is None or not seq.num_computed_tokens:
            return
        end, size = seq.num_computed_tokens, self.block_size
        index = (end - 1) // size
        parent = ROOT_HASH if index == 0 else self.pool.block_hash(seq.block_table[index - 1])
        self.snapshots.take(parent, seq.token_ids[index * size:end], seq.block_table[index], self.states, seq.seq_id)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """`child` shares every block of `parent`, the partly filled last block included."""
        assert not child.block_table
        for block_id in parent.block_table:
            self.pool.acquire(block_id)
        child.block_table = list(parent.block_table)
        child.num_computed_tokens = parent.num_computed_tokens
        child.num_cached_tokens = parent.num_computed_tokens
        if self.states is not None:
            self.states.allocate(child.seq_id)
            self.states.copy(parent.seq_id, child.seq_id)

    def free(self, seq: Sequence) -> None:
        """Drop `seq`'s blocks; on a hybrid, first keep its state where it stopped: a finished request's next
        turn (its prompt, reply and more) starts there, and so does a preempted or evicted one when it comes back,
        while the blocks stay cached."""
        self.snapshot_state(seq)
        for block_id in reversed(seq.block_table):
            self.pool.release(block_id)
        seq.block_table = []
        seq.num_computed_tokens = 0
        if self.states is not None:
            self.states.free(seq.seq_id)

    def reset_prefix_cache(self) -> int:
        """Forget the cached blocks no sequence holds (and a hybrid's snapshots at them); the blocks forgotten."""
        return self.pool.forget_cached()

    def pin(self, seq: Sequence) -> list[int]:
        for block_id in seq.block_table:
            self.pool.pin(block_id)
        return list(seq.block_table)

    def unpin(self, block_ids: list[int]) -> None:
        for block_id in block_ids:
            self.pool.unpin(block_id)

    def _must_copy_last(self, seq: Sequence) -> bool:
        """Writing continues inside the last block: copy it if another sequence reads it, or
        if it is findable for more tokens than this sequence keeps (they must not change)."""
        offset = seq.num_computed_tokens % self.block_size
        if not offset:
            return False
        last = seq.block_table[-1]
        return self.pool.is_shared(last) or self.pool.num_recorded(last) > offset

    def _copy_on_write(self, seq: Sequence) -> BlockCopy:
        old = seq.block_table[-1]
        new = self.pool.allocate()
        self.pool.release(old)
        seq.block_table[-1] = new
        return BlockCopy(src=old, dst=new)

    def _blocks_for(self, have: int, computed: int, num_new: int, shared_last: bool) -> int:
        needed = -(-(computed + num_new) // self.block_size)
        cow = 1 if computed % self.block_size and shared_last else 0
        return max(0, needed - have) + cow
