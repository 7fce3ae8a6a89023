"""Which rows of a step share a trunk, worked out once per step from the block tables.

Rows whose tables begin with the same block ids share those blocks' KV (the blocks are
read-only while shared). Their attention reads the shared prefix once for the whole group
(`kernels.reference.cascade_attention`), then each row's private remainder through paged attention.
Prefill does the same for prompts that continue one cached trunk (`kernels.cpu.cascade_prefill`).
A `StepPlan` holds both splits of one step, as the backend (engine.attention.cascade) reads them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from engine.kv.block_pool import common_prefix

MIN_PREFIX_TOKENS = 64


@dataclass(slots=True)
class SharedPrefix:
    rows: torch.Tensor | slice      # batch rows that share the prefix (a slice when consecutive: a view, no gather)
    first_block: int                # the prefix's blocks are first_block, first_block + 1, ...
    blocks: torch.Tensor | None     # ... or these ids, when they are not consecutive
    num_blocks: int
    members: torch.Tensor | None = None   # bool, one per row of `rows`: those that read it (None: all); decode
                                          # graphs (engine.decode_graphs) give every row of a bucket, masked


@dataclass(slots=True)
class DecodePlan:
    prefixes: list[SharedPrefix]
    private_tables: torch.Tensor    # [batch, width] blocks after each row's shared prefix
    private_lens: torch.Tensor      # [batch] tokens after each row's shared prefix


@dataclass(slots=True)
class StepPlan:
    decode: DecodePlan                      # the last-token queries: decode rows, a prefill's last layer
    block_tables: list[torch.Tensor] = field(default_factory=list)   # prefill: each prompt chunk's blocks
    prefill_groups: list[tuple[list[int], SharedPrefix]] = field(default_factory=list)   # see plan_prefill
    decode_rows: DecodePlan | None = None   # a mixed step: its decode rows, in the layers where every row queries


def plan_decode(tables: list[list[int]], context_lens: list[int], block_size: int,
                device: torch.device, min_prefix_tokens: int = MIN_PREFIX_TOKENS, chunk: int = 1) -> DecodePlan:
    """chunk: a shared prefix is cut at a multiple of this many tokens (the decode kernels' chunk, where they
    give a row the bits of its whole context that way); the rest of it stays in each row's private table."""
    whole = math.lcm(block_size, chunk) // block_size   # blocks
    skip = [0] * len(tables)
    prefixes = []
    for rows in _groups_by_first_block(tables):
        shared = _shared_blocks(tables, context_lens, rows, block_size) // whole * whole
        if shared * block_size < min_prefix_tokens:
            continue
        for row in rows:
            skip[row] = shared
        prefixes.append(_shared_prefix(tables[rows[0]][:shared], rows, device))
    private = [table[n:] for table, n in zip(tables, skip)]
    width = max(1, max(len(t) for t in private))
    padded = [t + [0] * (width - len(t)) for t in private]
    lens = [ctx - n * block_size for ctx, n in zip(context_lens, skip)]
    return DecodePlan(prefixes, torch.tensor(padded, dtype=torch.long, device=device),
                      torch.tensor(lens, dtype=torch.long, device=device))


def _groups_by_first_block(tables: list[list[int]]) -> list[list[int]]:
    groups: dict[int, list[int]] = {}
    for row, table in enumerate(tables):
        groups.setdefault(table[0], []).append(row)
    return [rows for rows in groups.values() if len(rows) > 1]


def _shared_blocks(tables, context_lens, rows, block_size) -> int:
    first = tables[rows[0]]
    shared = min(common_prefix(first, tables[r]) for r in rows[1:])
    # never the block that receives this step's token
    return min([shared] + [(context_lens[r] - 1) // block_size for r in rows])


def _shared_prefix(blocks: list[int], rows: list[int], device) -> SharedPrefix:
    consecutive = blocks == list(range(blocks[0], blocks[0] + len(blocks)))
    ids = None if consecutive else torch.tensor(blocks, dtype=torch.long, device=device)
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return SharedPrefix(slice(rows[0], rows[0] + len(rows)), blocks[0], ids, len(blocks))
    return SharedPrefix(torch.tensor(rows, dtype=torch.long, device=device), blocks[0], ids, len(blocks))


def plan_prefill(tables: list[list[int]], starts: list[int], query_lens: list[int], block_size: int,
                 device: torch.device,
                 min_prefix_tokens: int = MIN_PREFIX_TOKENS) -> list[tuple[list[int], SharedPrefix]]:
    """Prompts in one prefill batch whose tables begin with the same blocks, already computed for
    all of them (before each one's new tokens): (their batch positions, the prefix, whose `rows`
    are their new tokens' rows in the packed batch)."""
    offsets = [0]
    for n in query_lens:
        offsets.append(offsets[-1] + n)
    groups = []
    for seqs in _groups_by_first_block(tables):
        shared = min(min(common_prefix(tables[seqs[0]], tables[i]) for i in seqs[1:]),
                     min(starts[i] // block_size for i in seqs))
        if shared * block_size < min_prefix_tokens:
            continue
        rows = [row for i in seqs for row in range(offsets[i], offsets[i + 1])]
        groups.append((seqs, _shared_prefix(tables[seqs[0]][:shared], rows, device)))
    return groups
