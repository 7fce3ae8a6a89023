"""Continuous batching: who computes what in the next step.

A step is either a prefill step (prompt chunks of admitted requests, under a token budget)
or a decode step (one token for every running sequence, in one batch). When the pool runs
dry, idle paused sequences give back their blocks first, then the youngest running one is
preempted: its references are dropped and it recomputes later, mostly from the cache.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from engine.block_manager import BlockCopy, BlockManager
from engine.block_pool import common_prefix
from engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledBatch:
    is_prefill: bool
    seqs: list[Sequence] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)
    copies: list[BlockCopy] = field(default_factory=list)
    failed: list[Sequence] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.seqs) or bool(self.failed)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        self.paused: dict[int, Sequence] = {}
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = self._schedule_prefill()
        if batch:
            return batch
        batch = self._schedule_decode()
        if not batch and self.prefilling:
            self._unblock_prefill(batch)
        return batch

    def prompt_done(self, seq: Sequence) -> None:
        """Its whole prompt has KV now: it decodes from the next step on."""
        self.prefilling.remove(seq)
        self.running.append(seq)

    def finish(self, seq: Sequence) -> None:
        self.running.remove(seq)
        if seq.keep_kv and seq.finish_reason != "error":
            seq.status = SequenceStatus.PAUSED
            self.paused[seq.seq_id] = seq
        else:
            seq.status = SequenceStatus.FINISHED
            self.blocks.free(seq)

    def resume(self, seq: Sequence) -> None:
        """A paused sequence got more tokens: compute them, keeping its KV."""
        self.paused.pop(seq.seq_id, None)
        self.add(seq)

    def release(self, seq: Sequence) -> None:
        """Drop a sequence wherever it is, freeing its blocks."""
        for queue in (self.prefilling, self.running):
            if seq in queue:
                queue.remove(seq)
        if seq in self.waiting:
            self.waiting.remove(seq)
        self.paused.pop(seq.seq_id, None)
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED

    def _schedule_prefill(self) -> ScheduledBatch:
        batch = ScheduledBatch(is_prefill=True)
        budget = self.max_num_batched_tokens
        for seq in list(self.prefilling):
            budget -= self._add_chunk(batch, seq, budget)
        while self.waiting and budget > 0 and self._num_active() < self.max_num_seqs:
            seq = self._next_admissible(batch)
            if seq is None:
                break
            if not self._admit(seq, budget, batch):
                break
            budget -= batch.num_new[-1]
        return batch

    def _next_admissible(self, batch: ScheduledBatch) -> Sequence | None:
        """The first waiting request that would not gain a block or more of cache hits by
        waiting for a prompt being computed now (so a shared trunk is computed once)."""
        in_flight = self.prefilling + batch.seqs
        for seq in self.waiting:
            if seq.block_table:
                return seq
            _, cached = self.blocks.match_prefix(seq.token_ids)
            gain = max((common_prefix(seq.token_ids, other.token_ids) for other in in_flight), default=0)
            if gain - cached < self.blocks.block_size:
                return seq
        return None

    def _admit(self, seq: Sequence, budget: int, batch: ScheduledBatch) -> bool:
        pool = self.blocks.pool
        if not seq.block_table:
            needed = self.blocks.blocks_to_admit(seq, 1)
            if needed > pool.num_free and self._evict_paused(needed):
                needed = self.blocks.blocks_to_admit(seq, 1)  # evicted blocks may be ones it matches
            if needed > pool.num_free:
                return self._fail_if_alone(seq, batch)
            self.blocks.admit(seq)
        self.waiting.remove(seq)
        self.prefilling.append(seq)
        seq.status = SequenceStatus.RUNNING
        if self._add_chunk(batch, seq, budget) == 0:
            return False
        return True

    def _add_chunk(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> int:
        num_new = min(seq.num_uncomputed_tokens, budget)
        while num_new > 0 and self.blocks.blocks_to_write(seq, num_new) > self.blocks.pool.num_free:
            num_new = self._fit(seq, num_new)
        if num_new <= 0:
            return 0
        batch.copies += self.blocks.prepare_write(seq, num_new)
        batch.seqs.append(seq)
        batch.num_new.append(num_new)
        return num_new

    def _fit(self, seq: Sequence, num_new: int) -> int:
        """Shrink a chunk to the free blocks; 0 when not even one token fits."""
        if self._evict_paused(1):
            return num_new
        free_tokens = self.blocks.pool.num_free * self.blocks.block_size
        free_tokens += (-seq.num_computed_tokens) % self.blocks.block_size
        return min(num_new - 1, free_tokens - 1 if free_tokens else 0)

    def _schedule_decode(self) -> ScheduledBatch:
        batch = ScheduledBatch(is_prefill=False)
        for seq in sorted(self.running, key=lambda s: s.arrival):
            if seq not in self.running:
                continue
            while self.blocks.blocks_to_write(seq, 1) > self.blocks.pool.num_free:
                if not self._make_room(seq, batch):
                    break
            else:
                batch.copies += self.blocks.prepare_write(seq, 1)
                batch.seqs.append(seq)
                batch.num_new.append(1)
        return batch

    def _make_room(self, seq: Sequence, batch: ScheduledBatch) -> bool:
        if self._evict_paused(1):
            return True
        victims = [s for s in self.running if s is not seq and s not in batch.seqs]
        if victims:
            self._preempt(max(victims, key=lambda s: s.arrival))
            return True
        if len(self.running) > 1:
            self._preempt(seq)
            return False
        self.running.remove(seq)
        self._fail(seq, batch)
        return False

    def _unblock_prefill(self, batch: ScheduledBatch) -> None:
        """Prompts being computed hold the whole pool and none can go on: give way."""
        youngest = max(self.prefilling, key=lambda s: s.arrival)
        self.prefilling.remove(youngest)
        if self.prefilling:
            self.blocks.free(youngest)
            youngest.status = SequenceStatus.WAITING
            self.waiting.appendleft(youngest)
        else:
            self._fail(youngest, batch)

    def _preempt(self, seq: Sequence) -> None:
        self.num_preemptions += 1
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = SequenceStatus.WAITING
        self.waiting.appendleft(seq)

    def _evict_paused(self, wanted: int) -> bool:
        evicted = False
        while self.paused and self.blocks.pool.num_free < wanted:
            _, seq = self.paused.popitem()
            self.blocks.free(seq)
            evicted = True
        return evicted

    def _fail_if_alone(self, seq: Sequence, batch: ScheduledBatch) -> bool:
        if self.running or self.prefilling or batch.seqs:
            return False
        self.waiting.remove(seq)
        self._fail(seq, batch)
        return False

    def _fail(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "error"
        seq.error = (f"request {seq.request_id} needs {len(seq)} tokens of KV, more than the pool holds "
                     f"({self.blocks.pool.num_blocks * self.blocks.block_size}); raise the KV budget")
        batch.failed.append(seq)

    def _num_active(self) -> int:
        return len(self.prefilling) + len(self.running)

