"""Decode batches whose rows share a trunk's blocks, read by the C decode kernels shared and alone
(tests/kernels/cpu/test_trunk_chunks.py and test_decode_bf16.py)."""
import torch

from kernels.cpu import native_attention

BLOCK = 16
# (rows, heads, kv_heads, dim, trunk blocks): SmolLM2's decode step over a 2,048-token trunk; Qwen3-8B's heads over
# two chunks; a wide group; one query head a KV head, narrow
SHAPES = [(8, 9, 3, 64, 128), (3, 32, 8, 128, 32), (5, 16, 2, 64, 16), (2, 4, 4, 8, 48)]


def a_batch(rows, heads, kv_heads, dim, trunk_blocks, seed=0):
    """Rows whose tables start with the same trunk blocks (scattered in the pool), then tails of their own."""
    gen = torch.Generator().manual_seed(seed)
    pool_blocks = trunk_blocks + 4 * rows + 1
    k_cache = torch.randn(pool_blocks, BLOCK, kv_heads, dim, generator=gen)
    v_cache = torch.randn(pool_blocks, BLOCK, kv_heads, dim, generator=gen)
    order = torch.randperm(pool_blocks, generator=gen).tolist()
    trunk, tails = order[:trunk_blocks], order[trunk_blocks:]
    tables = [trunk + tails[4 * r:4 * r + 1 + r % 4] for r in range(rows)]
    lengths = [(len(t) - 1) * BLOCK + 1 + 5 * r % BLOCK for r, t in enumerate(tables)]
    q = torch.randn(rows, heads, dim, generator=gen)
    return q, k_cache, v_cache, trunk, tables, lengths


def padded(tables: list[list[int]]) -> torch.Tensor:
    width = max(len(t) for t in tables)
    return torch.tensor([t + [0] * (width - len(t)) for t in tables])


def shared_read(q, k_cache, v_cache, trunk, tables, lengths, cut_blocks, takers=None, prefix_lib=None,
                paged_lib=None, bf16=False):
    """The trunk's first cut_blocks read once for the rows in takers (every row: None), each row's rest paged;
    bf16: in bfloat16 products."""
    takers = range(len(q)) if takers is None else takers
    shape = k_cache.shape[2:]
    k = k_cache[trunk[:cut_blocks]].reshape(-1, *shape)
    v = v_cache[trunk[:cut_blocks]].reshape(-1, *shape)
    partials = native_attention.trunk_chunks(q, k, v, 0.3, prefix_lib, bf16)
    counts = torch.tensor([partials.shape[1] if r in takers else 0 for r in range(len(q))])
    private = padded([t[cut_blocks:] if r in takers else t for r, t in enumerate(tables)])
    lens = torch.tensor([n - cut_blocks * BLOCK if r in takers else n for r, n in enumerate(lengths)])
    given = native_attention.TrunkChunks(partials, counts)
    return native_attention.paged_decode_with_lse(q, k_cache, v_cache, private, lens, 0.3, paged_lib, given, bf16)


def alone(q, k_cache, v_cache, tables, lengths, paged_lib=None, bf16=False):
    return native_attention.paged_decode_with_lse(q, k_cache, v_cache, padded(tables), torch.tensor(lengths), 0.3,
                                                  paged_lib, bf16=bf16)
