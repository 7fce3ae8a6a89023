"""The KV pool's tensors: one preallocated K and V buffer per layer, addressed by block."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.loading.config import ModelConfig, kv_bytes_per_token


@dataclass(slots=True)
class KVCache:
    """`layers[i]` is a (K, V) pair, each shaped [num_blocks, block_size, kv_heads, head_dim]: one per
    full-attention layer (a hybrid's linear layers keep no KV; config.kv_layers maps them)."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    block_size: int

    @classmethod
    def allocate(cls, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype, device: torch.device) -> "KVCache":
        shape = (num_blocks, block_size, config.num_kv_heads, config.head_dim)
        layers = [(torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(shape, dtype=dtype, device=device)) for _ in range(config.num_kv_layers)]
        return cls(layers, block_size)

    @property
    def num_blocks(self) -> int:
        return self.layers[0][0].shape[0]

    @property
    def block_bytes(self) -> int:
        k = self.layers[0][0]
        return 2 * len(self.layers) * k[0].numel() * k.element_size()

    @property
    def bytes_per_token(self) -> int:
        return self.block_bytes // self.block_size

    @property
    def total_bytes(self) -> int:
        return self.block_bytes * self.num_blocks

    def copy_blocks(self, pairs: list[tuple[int, int]]) -> None:
        if not pairs:
            return
        device = self.layers[0][0].device
        src = torch.tensor([p[0] for p in pairs], device=device)
        dst = torch.tensor([p[1] for p in pairs], device=device)
        for k, v in self.layers:
            k.index_copy_(0, dst, k.index_select(0, src))
            v.index_copy_(0, dst, v.index_select(0, src))


def blocks_for_budget(config: ModelConfig, block_size: int, dtype: torch.dtype,
                      budget_tokens: int | None = None, budget_bytes: int | None = None) -> int:
    per_token = kv_bytes_per_token(config.num_kv_layers, config.num_kv_heads, config.head_dim, dtype.itemsize)
    block_bytes = per_token * block_size
    if budget_bytes is not None:
        return max(1, budget_bytes // block_bytes)
    assert budget_tokens is not None
    return max(1, -(-budget_tokens // block_size))
