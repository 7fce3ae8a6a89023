"""Fixed-size KV blocks: ref counts, an LRU of free blocks, pins, and a content index.

    one request's KV, block size 4, trunk of 6 tokens shared by two agents

        block:      [ b0 | b1 ]  [  b2  ]  [ b3 ]
        tokens:      t0-t3  t4-t5 a0-a1   a2-a5     agent A (b2 copied on its first write)
                     shared, read-only     private

    A block is *findable* once tokens are written into it: it is listed under its parent's
    hash with the tokens it holds, so a request whose prompt starts with the same tokens can
    share it, partially filled blocks included. A full block also gets its own chained hash,
    hash(parent hash, its token ids), under which its children are listed.

    Invariant: nothing writes into a block whose ref count is above one; the writer copies
    it first (see `BlockManager.prepare_write`). A block is reused only once its ref count
    is zero and no pin holds it, least recently released first.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable

ROOT_HASH = 0


@dataclass(slots=True)
class Block:
    block_id: int
    ref_count: int = 0
    pins: int = 0
    parent_hash: int | None = None
    token_ids: list[int] = field(default_factory=list)
    hash: int | None = None


def chain_hash(parent_hash: int, token_ids: list[int]) -> int:
    return hash((parent_hash, tuple(token_ids)))


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int):
        assert num_blocks > 0 and block_size > 0
        self.block_size = block_size
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free_order: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.children: dict[int, dict[int, None]] = {}
        self.num_pinned = 0
        self.forget_listeners: list[Callable[[int], None]] = []   # told the id of a block whose content goes

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        return len(self.free_order)

    @property
    def num_in_use(self) -> int:
        """Blocks referenced or pinned: every block not in the free order."""
        return len(self.blocks) - len(self.free_order)

    def ref_count(self, block_id: int) -> int:
        return self.blocks[block_id].ref_count

    def is_shared(self, block_id: int) -> bool:
        return self.blocks[block_id].ref_count > 1

    def is_pinned(self, block_id: int) -> bool:
        return self.blocks[block_id].pins > 0

    def allocate(self) -> int:
        """Take the least recently released free block, forgetting what it held."""
        assert self.free_order, "allocate() on an empty pool: check num_free first"
        block_id, _ = self.free_order.popitem(last=False)
        block = self.blocks[block_id]
        self._forget(block)
        block.ref_count = 1
        return block_id

    def acquire(self, block_id: int) -> None:
        """Add a reference; a cached free block is revived with its content and hash."""
        block = self.blocks[block_id]
        if block.ref_count == 0 and block.pins == 0:
            del self.free_order[block_id]
        block.ref_count += 1

    def release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"release of unreferenced block {block_id}"
        block.ref_count -= 1
        self._free_if_unused(block)

    def pin(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0 or block.pins > 0, "pin only blocks that hold content in use"
        if block.pins == 0:
            self.num_pinned += 1
        block.pins += 1

    def unpin(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.pins > 0, f"unpin of block {block_id} that is not pinned"
        block.pins -= 1
        if block.pins == 0:
            self.num_pinned -= 1
        self._free_if_unused(block)

    def record_tokens(self, block_id: int, parent_hash: int, token_ids: list[int]) -> None:
        """Make the block findable for the tokens whose KV it now holds (a prefix of it)."""
        block = self.blocks[block_id]
        assert len(token_ids) <= self.block_size
        if block.parent_hash is None:
            block.parent_hash = parent_hash
            self.children.setdefault(parent_hash, {})[block_id] = None
        assert block.parent_hash == parent_hash
        assert block.token_ids == token_ids[:len(block.token_ids)], "registered content changed"
        block.token_ids = list(token_ids)
        if len(token_ids) == self.block_size and block.hash is None:
            block.hash = chain_hash(parent_hash, token_ids)

    def num_recorded(self, block_id: int) -> int:
        return len(self.blocks[block_id].token_ids)

    def block_hash(self, block_id: int) -> int | None:
        return self.blocks[block_id].hash

    def longest_match(self, parent_hash: int, token_ids: list[int]) -> tuple[int | None, int]:
        """The findable block under `parent_hash` sharing the most leading tokens with `token_ids`."""
        best, best_len = None, 0
        for block_id in self.children.get(parent_hash, ()):
            held = self.blocks[block_id].token_ids
            n = common_prefix(held, token_ids)
            if n > best_len:
                best, best_len = block_id, n
                if n == self.block_size:
                    break
        return best, best_len

    def forget_cached(self) -> int:
        """Make every cached block (free, findable) unfindable, as if never written; blocks in use stay findable.
        Returns how many were forgotten."""
        cached = [self.blocks[i] for i in self.free_order if self.blocks[i].parent_hash is not None]
        for block in cached:
            self._forget(block)
        return len(cached)

    def is_cached(self, block_id: int) -> bool:
        block = self.blocks[block_id]
        return block.ref_count == 0 and block.pins == 0 and block.parent_hash is not None

    def _free_if_unused(self, block: Block) -> None:
        if block.ref_count == 0 and block.pins == 0:
            self.free_order[block.block_id] = None

    def _forget(self, block: Block) -> None:
        if block.parent_hash is not None:
            siblings = self.children[block.parent_hash]
            del siblings[block.block_id]
            if not siblings:
                del self.children[block.parent_hash]
            for listener in self.forget_listeners:
                listener(block.block_id)
        block.parent_hash, block.hash, block.token_ids = None, None, []


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
