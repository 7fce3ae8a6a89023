"""KV memory accounting, read off the block pool: the engine's own figures, which must add up."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.kv.block_manager import BlockManager
from engine.sequence import Sequence


@dataclass(slots=True)
class RequestKV:
    request_id: str
    tokens: int
    shared_tokens: int
    private_tokens: int
    shared_blocks: int
    private_blocks: int
    shared_bytes: int
    private_bytes: int


@dataclass(slots=True)
class StateStats:
    """A hybrid model's linear-attention state beside its KV (all zero on other models): a slot per live
    sequence, and the snapshots kept where prompts ended, shared by every request that starts from one."""

    bytes_per_slot: int = 0
    slots_in_use: int = 0
    slot_bytes_in_use: int = 0
    snapshots_held: int = 0
    snapshots_pinned: int = 0
    snapshot_bytes: int = 0


@dataclass(slots=True)
class KVStats:
    block_size: int
    block_bytes: int
    bytes_per_token: int
    blocks_total: int
    blocks_free: int
    blocks_cached: int
    blocks_in_use: int
    blocks_shared: int
    blocks_pinned: int
    used_bytes: int
    total_bytes: int
    prefix_lookup_tokens: int
    prefix_hit_tokens: int
    tokens_computed: int
    requests: list[RequestKV] = field(default_factory=list)
    states: StateStats = field(default_factory=StateStats)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hit_tokens / self.prefix_lookup_tokens if self.prefix_lookup_tokens else 0.0

    def to_dict(self) -> dict:
        data = {name: getattr(self, name) for name in self.__slots__ if name not in ("requests", "states")}
        data["prefix_hit_rate"] = self.prefix_hit_rate
        data["requests"] = [{n: getattr(r, n) for n in r.__slots__} for r in self.requests]
        data["states"] = {n: getattr(self.states, n) for n in self.states.__slots__}
        return data


def collect_stats(manager: BlockManager, seqs: list[Sequence], block_bytes: int,
                  tokens_computed: int) -> KVStats:
    pool = manager.pool
    blocks = pool.blocks
    in_use = [b for b in blocks if b.ref_count > 0 or b.pins > 0]
    assert len(in_use) == pool.num_in_use, "free order and ref counts disagree"
    return KVStats(
        block_size=pool.block_size,
        block_bytes=block_bytes,
        bytes_per_token=block_bytes // pool.block_size,
        blocks_total=pool.num_blocks,
        blocks_free=pool.num_free,
        blocks_cached=sum(1 for b in blocks if pool.is_cached(b.block_id)),
        blocks_in_use=len(in_use),
        blocks_shared=sum(1 for b in in_use if b.ref_count > 1),
        blocks_pinned=sum(1 for b in in_use if b.pins > 0),
        used_bytes=len(in_use) * block_bytes,
        total_bytes=pool.num_blocks * block_bytes,
        prefix_lookup_tokens=manager.lookup_tokens,
        prefix_hit_tokens=manager.hit_tokens,
        tokens_computed=tokens_computed,
        requests=[request_kv(manager, seq, block_bytes) for seq in seqs if seq.block_table],
        states=state_stats(manager),
    )


def state_stats(manager: BlockManager) -> StateStats:
    states, snapshots = manager.states, manager.snapshots
    if states is None:
        return StateStats()
    stats = StateStats(bytes_per_slot=states.bytes_per_slot, slots_in_use=states.slots_in_use,
                       slot_bytes_in_use=states.bytes_in_use)
    if snapshots is not None:
        stats.snapshots_held, stats.snapshots_pinned = snapshots.num_held, snapshots.num_pinned
        stats.snapshot_bytes = snapshots.bytes_held
    return stats


def request_kv(manager: BlockManager, seq: Sequence, block_bytes: int) -> RequestKV:
    size = manager.block_size
    shared_tokens = shared_blocks = 0
    for index, block_id in enumerate(seq.block_table):
        if manager.pool.is_shared(block_id):
            shared_blocks += 1
            shared_tokens += max(0, min(size, seq.num_computed_tokens - index * size))
    private_blocks = len(seq.block_table) - shared_blocks
    return RequestKV(
        request_id=seq.request_id,
        tokens=seq.num_computed_tokens,
        shared_tokens=shared_tokens,
        private_tokens=seq.num_computed_tokens - shared_tokens,
        shared_blocks=shared_blocks,
        private_blocks=private_blocks,
        shared_bytes=shared_blocks * block_bytes,
        private_bytes=private_blocks * block_bytes,
    )
