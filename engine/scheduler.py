"""Continuous batching: who computes what in the next step.

A step carries one token for every running sequence (its decode rows, first) and prompt chunks of
admitted requests beside them (chunked prefill), under a per-step token budget:

    step rows:  [ decode: 1 token per running seq ][ prefill chunks, oldest first ]
    budget:     max_num_batched_tokens with no decode rows; mixed_step_tokens with them, so a tool
                result or a newly admitted agent delays the running agents by a chunk, not a prompt

Who gives way when the pool runs dry: age decides, everywhere. A sequence that needs blocks
takes them from idle paused sequences first, then from the youngest sequence younger than
itself that holds any (waiting, prefilling or decoding), which is preempted: its references
are dropped and it recomputes later, mostly from the cache. Sequences older than it keep
theirs; if they leave it nothing, it gives its own blocks back and waits. A request is failed
only when no other sequence holds a block, so it cannot fit the pool alone.

    age ->   oldest ..................................... youngest
             A decoding    B prefilling    C waiting, KV kept    D new
    A short of a block: paused go first, then C, then B (D holds none)
    D is admitted only once its first chunk fits beside all of them
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from engine.kv.block_manager import BlockCopy, BlockManager
from engine.sequence import Sequence, SequenceStatus


@dataclass(slots=True)
class ScheduledBatch:
    """One step's rows: the first `num_decode` sequences decode one token; the rest are prompt chunks."""

    seqs: list[Sequence] = field(default_factory=list)
    num_new: list[int] = field(default_factory=list)
    copies: list[BlockCopy] = field(default_factory=list)
    failed: list[Sequence] = field(default_factory=list)
    num_decode: int = 0

    def __bool__(self) -> bool:
        return bool(self.seqs) or bool(self.failed)

    @property
    def is_prefill(self) -> bool:
        """Whether any prompt chunk runs in this step (a mixed step has decode rows too)."""
        return len(self.seqs) > self.num_decode

    def is_decode_row(self, row: int) -> bool:
        return row < self.num_decode

    def add_decode(self, seq: Sequence) -> None:
        self.seqs.insert(self.num_decode, seq)
        self.num_new.insert(self.num_decode, 1)
        self.num_decode += 1

    def add_chunk(self, seq: Sequence, num_new: int) -> None:
        self.seqs.append(seq)
        self.num_new.append(num_new)


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int = 64, max_num_batched_tokens: int = 2048,
                 mixed_step_tokens: int | None = None):
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.mixed_step_tokens = max_num_batched_tokens if mixed_step_tokens is None else mixed_step_tokens
        self.waiting: list[Sequence] = []   # oldest first
        self.prefilling: list[Sequence] = []
        self.running: list[Sequence] = []
        self.paused: dict[int, Sequence] = {}
        self.num_preemptions = 0

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=_age)

    def has_work(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def schedule(self) -> ScheduledBatch:
        """Oldest first: each running sequence's next token, each prefilling one's next chunk, then
        admissions while the budget lasts."""
        batch = ScheduledBatch()
        budget = self._prefill_budget()
        for seq in sorted(self.running + self.prefilling, key=_age):
            if seq in self.running:
                self._add_decode(batch, seq)
            elif seq in self.prefilling:   # not preempted by an older one this step
                budget -= self._add_chunk(batch, seq, budget)
        while self.waiting and budget > 0 and self._num_active() < self.max_num_seqs:
            seq = self._next_admissible(batch)
            if seq is None or not self._admit(seq, budget, batch):
                break
            budget -= batch.num_new[-1]
        return batch

    def _prefill_budget(self) -> int:
        """Prompt tokens this step may carry: beside decode rows, what the mixed budget leaves (at
        least a block, so prompts always progress)."""
        if not self.running:
            return self.max_num_batched_tokens
        mixed = min(self.mixed_step_tokens, self.max_num_batched_tokens)
        return max(mixed - len(self.running), self.blocks.block_size)

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
        self._dequeue(seq)
        self.paused.pop(seq.seq_id, None)
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED

    def _next_admissible(self, batch: ScheduledBatch) -> Sequence | None:
        """The first waiting request that would not gain a block or more of cache hits by
        waiting for a prompt being computed now (so a shared trunk is computed once; on a hybrid
        model, only a prompt that its own starts with: engine.kv.block_manager). Without prefix
        caching nobody waits for hits."""
        in_flight = self.prefilling + batch.seqs
        for seq in self.waiting:
            if seq.block_table or not self.blocks.enable_prefix_caching:
                return seq
            _, cached = self.blocks.match_prefix(seq.token_ids)
            gain = max((self.blocks.prefix_gain(seq.token_ids, other.token_ids) for other in in_flight), default=0)
            if gain - cached < self.blocks.block_size:
                return seq
        return None

    def _admit(self, seq: Sequence, budget: int, batch: ScheduledBatch) -> bool:
        """Start computing a waiting request; one that holds no KV yet starts only once its
        whole prompt fits, so it never takes blocks that older sequences are about to need (its
        chunks are small beside decode rows: starting on the first chunk alone would thrash)."""
        if not seq.block_table:
            if not self._make_room(seq, seq.num_uncomputed_tokens, batch):
                if not self._others_hold_blocks(seq):
                    self.waiting.remove(seq)
                    self._fail(seq, batch)
                return False
            self.blocks.admit(seq)
        self.waiting.remove(seq)
        self.prefilling.append(seq)
        seq.status = SequenceStatus.RUNNING
        return self._add_chunk(batch, seq, budget) > 0

    def _add_chunk(self, batch: ScheduledBatch, seq: Sequence, budget: int) -> int:
        """The next chunk of its prompt, shrunk to the blocks left once younger ones gave way."""
        num_new = min(seq.num_uncomputed_tokens, budget)
        if num_new <= 0:
            return 0
        if not self._make_room(seq, num_new, batch):
            num_new = min(num_new, self.blocks.writable_tokens(seq))
        if num_new == 0:
            self._give_way(seq, batch)
            return 0
        batch.copies += self.blocks.prepare_write(seq, num_new)
        batch.add_chunk(seq, num_new)
        return num_new

    def _add_decode(self, batch: ScheduledBatch, seq: Sequence) -> None:
        if self._make_room(seq, 1, batch):
            batch.copies += self.blocks.prepare_write(seq, 1)
            batch.add_decode(seq)
        else:
            self._give_way(seq, batch)

    def _make_room(self, seq: Sequence, num_new: int, batch: ScheduledBatch) -> bool:
        """Free blocks until writing the next `num_new` tokens of `seq` fits: evict paused
        sequences, then preempt younger ones. False when what is left is held by older ones."""
        while self._blocks_needed(seq, num_new) > self.blocks.pool.num_free:
            if not self._evict_one_paused() and not self._preempt_youngest_after(seq, batch):
                return False
        return True

    def _blocks_needed(self, seq: Sequence, num_new: int) -> int:
        if seq.block_table:
            return self.blocks.blocks_to_write(seq, num_new)
        return self.blocks.blocks_to_admit(seq, num_new)

    def _preempt_youngest_after(self, seq: Sequence, batch: ScheduledBatch) -> bool:
        younger = [s for s in self._holders() if s.arrival > seq.arrival and s not in batch.seqs]
        if not younger:
            return False
        self._preempt(max(younger, key=_age))
        return True

    def _give_way(self, seq: Sequence, batch: ScheduledBatch) -> None:
        """Not one more token of `seq` fits: wait for the older sequences, or fail if none is left."""
        if self._others_hold_blocks(seq):
            self._preempt(seq)
        else:
            self._dequeue(seq)
            self._fail(seq, batch)

    def _preempt(self, seq: Sequence) -> None:
        self.num_preemptions += 1
        self.blocks.free(seq)
        if seq.status != SequenceStatus.WAITING:   # a resumed one waiting with its KV keeps its place
            self._dequeue(seq)
            self.add(seq)

    def _evict_one_paused(self) -> bool:
        if not self.paused:
            return False
        _, seq = self.paused.popitem()
        self.blocks.free(seq)
        return True

    def _holders(self) -> list[Sequence]:
        """Sequences that hold blocks and may be preempted (paused ones are evicted instead)."""
        return [s for s in self.waiting + self.prefilling + self.running if s.block_table]

    def _others_hold_blocks(self, seq: Sequence) -> bool:
        return any(s is not seq for s in self._holders())

    def _dequeue(self, seq: Sequence) -> None:
        for queue in (self.waiting, self.prefilling, self.running):
            if seq in queue:
                queue.remove(seq)

    def _fail(self, seq: Sequence, batch: ScheduledBatch) -> None:
        self.blocks.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = "error"
        seq.error = (f"request {seq.request_id} needs {len(seq)} tokens of KV, more than the pool holds "
                     f"({self.blocks.pool.num_blocks * self.blocks.block_size}); raise the KV budget")
        batch.failed.append(seq)

    def _num_active(self) -> int:
        return len(self.prefilling) + len(self.running)


def _age(seq: Sequence) -> int:
    return seq.arrival
