"""Copies of a hybrid sequence's linear state at the end of a prompt and where the sequence stops (finished,
preempted, evicted: engine.kv.block_manager), so that a later request whose prompt starts with the same tokens
(the next turn of a chat, the preempted request itself) continues from there instead of from its first token
(the state cannot be rewound).

    a trunk of 6 tokens (prefill_only, pinned), block size 4

        blocks:    [ b0: t0 t1 t2 t3 ][ b1: t4 t5 . . ]
        snapshot:                              ^ P = 6, key chain_hash(hash of b0, [t4, t5]), belongs to b1

A snapshot at position P is keyed by the content hash of the tokens before it, the block pool's own chain
(engine.kv.block_pool): the hash of the full blocks before P's block, then that block's tokens up to P, which at
a block's end is the block's own hash. Any cached block holding those tokens finds it (a copy of the trunk's last
block, written on by a request, does too). It belongs to the block that held token P − 1 when it was taken: it
goes when that block is reused for other tokens, and stays while that block is pinned (a trunk). Past
`max_unpinned` snapshots, the least recently used one whose block is not pinned goes.

Its state lives in a StatePool of its own (`storage`, keyed by snapshot key instead of sequence id): a sequence's
slot is copied in when a prompt ends (`take`) and copied out into an admitted sequence's fresh slot (`restore`).
"""
from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable

from engine.kv.block_pool import chain_hash
from engine.linear_attention.state_pool import StatePool


@dataclass(slots=True)
class Snapshot:
    key: int
    parent_hash: int   # of the full blocks before P's block
    offset: int        # tokens of P's block before P: 1 .. block size
    block_id: int      # the block it belongs to


class SnapshotPool:
    def __init__(self, storage: StatePool, is_pinned: Callable[[int], bool], max_unpinned: int = 64):
        assert max_unpinned > 0
        self.storage = storage
        self.is_pinned = is_pinned
        self.max_unpinned = max_unpinned
        self.snapshots: OrderedDict[int, Snapshot] = OrderedDict()   # by key, least recently used first
        self.offsets_under: dict[int, Counter[int]] = {}              # parent hash -> offsets of its snapshots
        self.by_block: dict[int, set[int]] = {}                       # block id -> keys of its snapshots
        self.num_taken = 0
        self.num_restored = 0

    @property
    def num_held(self) -> int:
        return len(self.snapshots)

    @property
    def num_pinned(self) -> int:
        return sum(1 for s in self.snapshots.values() if self.is_pinned(s.block_id))

    @property
    def bytes_per_snapshot(self) -> int:
        return self.storage.bytes_per_slot

    @property
    def bytes_held(self) -> int:
        return self.num_held * self.bytes_per_snapshot

    def take(self, parent_hash: int, tokens: list[int], block_id: int, states: StatePool, seq_id: int) -> None:
        """Keep a copy of `seq_id`'s state (in `states`) after `tokens`, the start of `block_id`, whose parent is
        `parent_hash`; one kept there already is only marked used."""
        key = chain_hash(parent_hash, tokens)
        if key in self.snapshots:
            self.snapshots.move_to_end(key)
            return
        self._make_room()
        self.storage.allocate(key)
        self.storage.copy(seq_id, key, source=states)
        self.snapshots[key] = Snapshot(key, parent_hash, len(tokens), block_id)
        self.offsets_under.setdefault(parent_hash, Counter())[len(tokens)] += 1
        self.by_block.setdefault(block_id, set()).add(key)
        self.num_taken += 1

    def deepest(self, parent_hash: int, tokens: list[int]) -> Snapshot | None:
        """The snapshot after the most of `tokens` (what a block under `parent_hash` holds of a prompt)."""
        for offset in sorted(self.offsets_under.get(parent_hash, ()), reverse=True):
            if offset <= len(tokens):
                snapshot = self.snapshots.get(chain_hash(parent_hash, tokens[:offset]))
                if snapshot is not None:
                    return snapshot
        return None

    def restore(self, key: int, states: StatePool, seq_id: int) -> None:
        """`seq_id` (holding a slot of `states`) continues from the snapshot `key`."""
        states.copy(key, seq_id, source=self.storage)
        self.snapshots.move_to_end(key)
        self.num_restored += 1

    def forget_block(self, block_id: int) -> None:
        """`block_id` is reused for other tokens: its snapshots go with it."""
        for key in list(self.by_block.get(block_id, ())):
            self._drop(key)

    def _make_room(self) -> None:
        unpinned = [key for key, s in self.snapshots.items() if not self.is_pinned(s.block_id)]
        for key in unpinned[:max(0, len(unpinned) - self.max_unpinned + 1)]:
            self._drop(key)

    def _drop(self, key: int) -> None:
        snapshot = self.snapshots.pop(key)
        offsets = self.offsets_under[snapshot.parent_hash]
        offsets[snapshot.offset] -= 1
        if not offsets[snapshot.offset]:
            del offsets[snapshot.offset]
        if not offsets:
            del self.offsets_under[snapshot.parent_hash]
        keys = self.by_block[snapshot.block_id]
        keys.discard(key)
        if not keys:
            del self.by_block[snapshot.block_id]
        self.storage.free(key)
