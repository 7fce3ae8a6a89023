"""Decode steps replayed as CUDA/HIP graphs, fed through static buffers each step copies into (nano-vllm's
`capture_cudagraph` / `run_model`, reshaped around the shared trunk).

    static buffers (rows of the largest bucket)      a step of 5 rows, replayed in the bucket of 8
        input_ids, positions, slot_mapping            rows 0-4 the step's; rows 5-7 token 0, position 0,
                                                      the scratch slot (a block the pool never hands out)
        private_tables [rows, width], private_lens    rows 5-7 zeros and length 0: out 0, lse -inf
        members [prefix, rows]                        which rows read each shared prefix; padded rows
                                                      read it too, so their merge stays finite

A graph bakes in the Python side of a step: every tensor's shape (the Triton kernels' grids and splits
follow from them) and each shared prefix's blocks (the trunk, read once for all rows as a view of the
pool). So a graph is keyed by (rows bucket, width bucket, the prefixes' blocks): an agent that pauses
or returns changes only `members` and the padding, not the graph. Widths are buckets too, so a
short private tail is not split for the longest context the model takes. Graphs are captured lazily,
on a key's first step (the trunk is not known at start), sharing one memory pool; the least recently
used beyond MAX_GRAPHS are dropped. Logits are padded rows' too; they are dropped.
"""
from __future__ import annotations

import warnings
from collections import OrderedDict
from dataclasses import dataclass

import torch

from engine.attention.base import AttentionBackend, AttentionBatch
from engine.attention.plan import MIN_PREFIX_TOKENS, DecodePlan, SharedPrefix, StepPlan, plan_decode
from engine.kv.cache import KVCache
from engine.model import CausalLM
from engine.options import EngineOptions
from engine.scheduler import ScheduledBatch

MIN_WIDTH = 16          # blocks: the narrowest private table a graph takes (256 tokens at block size 16)
MAX_PREFIXES = 4        # shared prefixes one graph reads; a step with more runs eagerly
MAX_GRAPHS = 32         # graphs kept; the least recently used go first
CPU = torch.device("cpu")


@dataclass(frozen=True, slots=True)
class GraphSettings:
    max_num_seqs: int          # the largest batch bucket
    max_blocks_per_seq: int    # the widest private table (the model's context, in blocks)
    scratch_block: int         # a KV block no sequence holds: padded rows write there
    capture: bool = True       # False: the same static, padded step, run eagerly (how the CPU tests run it)


@dataclass(frozen=True, slots=True)
class GraphKey:
    rows: int
    width: int
    prefixes: tuple[tuple[int, int, tuple[int, ...] | None], ...]   # (first_block, num_blocks, block ids)


@dataclass(slots=True)
class StaticStep:
    """One graph's views of the static buffers, the attention batch it runs on, and its logits."""

    input_ids: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor
    private_tables: torch.Tensor
    private_lens: torch.Tensor
    members: torch.Tensor             # [prefixes, rows] bool
    batch: AttentionBatch
    graph: torch.cuda.CUDAGraph | None = None
    logits: torch.Tensor | None = None


def is_pure_decode(batch: ScheduledBatch) -> bool:
    """Every row computes one token past its prompt: the steps a graph replays."""
    return not batch.is_prefill and all(
        n == 1 and seq.num_computed_tokens >= seq.num_prompt_tokens for seq, n in zip(batch.seqs, batch.num_new))


def buckets(largest: int, smallest: int = 1) -> list[int]:
    """smallest, 2 x smallest, 4 x ... below `largest`, then `largest`."""
    sizes, size = [], smallest
    while size < largest:
        sizes.append(size)
        size *= 2
    return sizes + [largest]


def engine_settings(options: EngineOptions, device: torch.device, num_blocks: int,
                    context_tokens: int) -> GraphSettings | None:
    """Graphs on a GPU unless `options.cuda_graphs` is off, None (eager) elsewhere: for a pool whose block
    pool hands out `num_blocks` blocks, with the scratch block after them, and sequences of at most
    `context_tokens`."""
    if not options.cuda_graphs or device.type != "cuda":
        return None
    widest = min(num_blocks, -(-context_tokens // options.block_size))
    return GraphSettings(options.max_num_seqs, max(1, widest), scratch_block=num_blocks)


class DecodeGraphs:
    """Pure decode steps as graph replays (or, with capture off, the same padded step run eagerly)."""

    def __init__(self, model: CausalLM, kv: KVCache, attention: AttentionBackend, settings: GraphSettings,
                 cascade: bool = True):
        assert 0 <= settings.scratch_block < kv.num_blocks, "the scratch block lies inside the KV tensors"
        self.model, self.kv, self.attention, self.settings = model, kv, attention, settings
        self.device = kv.layers[0][0].device
        self.row_buckets = buckets(settings.max_num_seqs)
        self.width_buckets = buckets(settings.max_blocks_per_seq, min(MIN_WIDTH, settings.max_blocks_per_seq))
        self.failure: str | None = None
        self.steps_run = 0                  # decode steps this object ran (replayed, or static and eager)
        self.steps: OrderedDict[GraphKey, StaticStep] = OrderedDict()
        self.pool = None
        self.logits: torch.Tensor | None = None   # [rows, vocab]: every graph's output, made at the first capture
        self._allocate_buffers()
        self.use_cascade(cascade)

    def use_cascade(self, on: bool) -> None:
        """Shared prefixes planned as the attention backend plans them (CascadeBackend.use_cascade)."""
        self.min_prefix_tokens: float = MIN_PREFIX_TOKENS if on else float("inf")

    def describe(self) -> str:
        """"failed: <why>" after a failed capture, else how many steps ran on how many graphs."""
        if self.failure is not None:
            return f"failed: {self.failure}"
        if self.settings.capture:
            return f"{self.steps_run} steps on {len(self.steps)} graphs"
        return f"{self.steps_run} steps in {len(self.steps)} static layouts, not captured"

    def run(self, batch: ScheduledBatch) -> torch.Tensor | None:
        """Logits of this step's rows, or None where the step is not one a graph runs (the caller runs it
        eagerly): not pure decode, too many rows or prefixes, too wide, or capture failed once."""
        if self.failure is not None or not batch.seqs or not is_pure_decode(batch):
            return None
        plan = plan_decode([seq.block_table for seq in batch.seqs], [seq.num_computed_tokens + 1 for seq in batch.seqs],
                           self.kv.block_size, CPU, self.min_prefix_tokens)
        key = self._key(len(batch.seqs), plan)
        if key is None:
            return None
        step = self._step_for(key)
        self._fill(step, batch, plan)
        try:
            logits = self._forward(step, len(batch.seqs))
        except Exception as error:   # any failure to capture: eager from now on
            self._give_up(error)
            return None
        self.steps_run += 1
        return logits

    def _key(self, rows: int, plan: DecodePlan) -> GraphKey | None:
        width = plan.private_tables.shape[1]
        if rows > self.row_buckets[-1] or width > self.width_buckets[-1] or len(plan.prefixes) > MAX_PREFIXES:
            return None
        prefixes = tuple((p.first_block, p.num_blocks, None if p.blocks is None else tuple(p.blocks.tolist()))
                         for p in plan.prefixes)
        return GraphKey(_fit(rows, self.row_buckets), _fit(width, self.width_buckets), prefixes)

    def _forward(self, step: StaticStep, real_rows: int) -> torch.Tensor:
        if not self.settings.capture:
            return self._model_step(step)[:real_rows]
        if step.graph is None:
            self._capture(step)
        step.graph.replay()
        return step.logits[:real_rows].clone()   # the next replay of any graph overwrites it

    def _model_step(self, step: StaticStep) -> torch.Tensor:
        hidden = self.model(step.input_ids, step.positions, step.batch, self.attention)
        return self.model.compute_logits(hidden)

    def _capture(self, step: StaticStep) -> None:
        """Warm up on this step's data (Triton compiles, scratch buffers grow: never inside a capture), then
        capture the same step into the shared pool, its logits copied into the one buffer all graphs share."""
        logits = self._model_step(step)
        if self.logits is None:
            self.logits = logits.new_empty(self.row_buckets[-1], logits.shape[1])
        torch.cuda.synchronize(self.device)
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        step.logits = self.logits[:step.input_ids.shape[0]]
        with torch.cuda.graph(graph, pool=self.pool):
            step.logits.copy_(self._model_step(step))
        step.graph = graph

    def _give_up(self, error: Exception) -> None:
        self.failure = f"{type(error).__name__}: {error}".splitlines()[0]
        self.steps.clear()
        warnings.warn(f"decode graphs are off: capture failed ({self.failure}); decode runs eagerly", stacklevel=3)

    def _step_for(self, key: GraphKey) -> StaticStep:
        step = self.steps.get(key)
        if step is None:
            step = self.steps[key] = self._static_step(key)
            while len(self.steps) > MAX_GRAPHS:
                self.steps.popitem(last=False)
        self.steps.move_to_end(key)
        return step

    def _allocate_buffers(self) -> None:
        rows, widest = self.row_buckets[-1], self.width_buckets[-1]
        def longs(count):
            return torch.zeros(count, dtype=torch.long, device=self.device)
        self.input_ids, self.positions, self.slot_mapping = longs(rows), longs(rows), longs(rows)
        self.private_lens, self.private_tables = longs(rows), longs(rows * widest)
        self.members = torch.ones(MAX_PREFIXES, rows, dtype=torch.bool, device=self.device)

    def _static_step(self, key: GraphKey) -> StaticStep:
        rows = key.rows
        tables = self.private_tables[:rows * key.width].view(rows, key.width)
        lens, members = self.private_lens[:rows], self.members[:len(key.prefixes), :rows]
        prefixes = [SharedPrefix(slice(0, rows), first, None if ids is None else self._ids(ids), count, members[i])
                    for i, (first, count, ids) in enumerate(key.prefixes)]
        slots = self.slot_mapping[:rows]
        batch = AttentionBatch(False, slots, [], [1] * rows, [], queries="last",
                               plan=StepPlan(DecodePlan(prefixes, tables, lens)))
        return StaticStep(self.input_ids[:rows], self.positions[:rows], slots, tables, lens, members, batch)

    def _ids(self, ids: tuple[int, ...]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def _fill(self, step: StaticStep, batch: ScheduledBatch, plan: DecodePlan) -> None:
        """This step's rows into the static buffers; the rows past them padded (see the module's diagram)."""
        rows, real, block_size = step.input_ids.shape[0], len(batch.seqs), self.kv.block_size
        positions = [seq.num_computed_tokens for seq in batch.seqs]
        slots = [seq.block_table[p // block_size] * block_size + p % block_size
                 for seq, p in zip(batch.seqs, positions)]
        step.input_ids.copy_(_padded([seq.token_ids[p] for seq, p in zip(batch.seqs, positions)], rows))
        step.positions.copy_(_padded(positions, rows))
        step.slot_mapping.copy_(_padded(slots, rows, self.settings.scratch_block * block_size))
        step.private_lens.copy_(_padded(plan.private_lens.tolist(), rows))
        tables = torch.zeros(step.private_tables.shape, dtype=torch.long)
        tables[:real, :plan.private_tables.shape[1]] = plan.private_tables
        step.private_tables.copy_(tables)
        if plan.prefixes:
            step.members.copy_(_members(plan.prefixes, real, rows))


def _members(prefixes: list[SharedPrefix], real: int, rows: int) -> torch.Tensor:
    members = torch.ones(len(prefixes), rows, dtype=torch.bool)
    members[:, :real] = False
    for i, prefix in enumerate(prefixes):
        members[i, prefix.rows] = True
    return members


def _fit(size: int, sizes: list[int]) -> int:
    return next(s for s in sizes if s >= size)


def _padded(values: list[int], rows: int, padding: int = 0) -> torch.Tensor:
    return torch.tensor(values + [padding] * (rows - len(values)), dtype=torch.long)
