"""The attention backend on every kernel set against the plain paged reference (the oracle): a decode
step and a prefill over a cached trunk, with the cascade split on and off."""
import os

import pytest
import torch

from engine.attention.base import AttentionBatch
from engine.attention.plan import DecodePlan, SharedPrefix, StepPlan
from engine.attention.select import select_backend
from engine.kv.cache import KVCache
from kernels.cpu import native_attention
from kernels.reference import paged_attention

BLOCK, HEADS, KV_HEADS, DIM = 16, 4, 2, 16
SCALE = DIM ** -0.5
TRUNKS = {"consecutive": [0, 1, 2, 3, 4], "scattered": [7, 3, 9, 1, 5]}   # 80 tokens: past the 64 cascade takes
# 272 tokens: past one of the C decode kernels' chunks, where they cut a trunk (native_attention.decode_chunk)
LONG_TRUNKS = {"consecutive": list(range(17)),
               "scattered": [18, 3, 25, 1, 5, 27, 9, 14, 22, 0, 17, 6, 29, 2, 24, 8, 16]}
KERNEL_SETS = [
    "torch", "sdpa",
    pytest.param("native", marks=pytest.mark.skipif(not native_attention.available(), reason="no C compiler")),
    pytest.param("triton", marks=pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                                    reason="the Triton kernels run on CPU tensors interpreted")),
]


def random_tensor(*shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def pool(layers: int = 2) -> KVCache:
    shape = (40, BLOCK, KV_HEADS, DIM)
    return KVCache([(random_tensor(*shape, seed=2 * i), random_tensor(*shape, seed=2 * i + 1))
                    for i in range(layers)], BLOCK)


def step(tables, context_lens, query_lens, queries="all") -> AttentionBatch:
    slots, last_rows, row = [], [], -1
    for table, context, new in zip(tables, context_lens, query_lens):
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(context - new, context)]
        row += new
        last_rows.append(row)
    return AttentionBatch(queries == "all", torch.tensor(slots), context_lens, query_lens, tables,
                          torch.tensor(last_rows) if queries == "all" else None, queries)


def expected(kv: KVCache, layer: int, q, k, v, batch: AttentionBatch) -> torch.Tensor:
    """Every new token's causal attention over its whole context, on a copy of the pool with k, v written."""
    k_cache, v_cache = (t.clone() for t in kv.layers[layer])
    paged_attention.write_kv(k_cache, v_cache, k, v, batch.slot_mapping)
    tables = [torch.tensor(t) for t in batch.block_tables]
    return paged_attention.prefill_attention(q, k_cache, v_cache, tables, batch.context_lens, batch.query_lens, SCALE)


def a_decode_step(trunk: list[int]) -> AttentionBatch:
    """Rows 0 and 2 share the trunk, apart in the batch."""
    tables = [trunk + [30, 31], [20, 21], trunk + [32]]
    tokens = len(trunk) * BLOCK
    return step(tables, [tokens + 20, 25, tokens + 10], [1, 1, 1], queries="last")


@pytest.mark.parametrize("trunk", LONG_TRUNKS.values(), ids=LONG_TRUNKS.keys())
@pytest.mark.parametrize("cascade", [True, False], ids=["cascade", "plain"])
@pytest.mark.parametrize("kernels", KERNEL_SETS)
def test_a_decode_step_attends_as_the_reference_and_writes_its_kv(kernels, cascade, trunk):
    kv = pool()
    attention = select_backend(kv, SCALE, choice=kernels)
    attention.use_cascade(cascade)
    batch = a_decode_step(trunk)
    attention.plan(batch)
    assert len(batch.plan.decode.prefixes) == (1 if cascade else 0)
    q, k, v = random_tensor(3, HEADS, DIM, seed=10), random_tensor(3, KV_HEADS, DIM, seed=11), \
        random_tensor(3, KV_HEADS, DIM, seed=12)
    want = expected(kv, 1, q, k, v, batch)
    got = attention.forward(q, k, v, 1, batch)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    k_cache, v_cache = kv.layers[1]
    assert torch.equal(k_cache.view(-1, KV_HEADS, DIM)[batch.slot_mapping], k)
    assert torch.equal(v_cache.view(-1, KV_HEADS, DIM)[batch.slot_mapping], v)


@pytest.mark.skipif(not native_attention.available(), reason="no C compiler")
@pytest.mark.parametrize("blocks", [17, 16, 15, 40], ids=["past-a-chunk", "a-chunk", "short-of-a-chunk", "chunks"])
def test_the_c_kernels_give_a_decode_row_the_same_bits_with_its_trunk_shared_or_read_alone(blocks):
    """The trunk is cut at a whole chunk, its chunks read once for the rows that share it and merged with each
    row's own in one pass: the bits each row gets reading its whole context alone, in one call or row by row."""
    kv = pool(1) if blocks < 40 else KVCache([(random_tensor(90, BLOCK, KV_HEADS, DIM, seed=1),
                                                random_tensor(90, BLOCK, KV_HEADS, DIM, seed=2))], BLOCK)
    trunk = list(range(40, 40 + blocks)) if blocks == 40 else LONG_TRUNKS["scattered"][:blocks]
    batch = a_decode_step(trunk)
    q, k, v = random_tensor(3, HEADS, DIM, seed=40), random_tensor(3, KV_HEADS, DIM, seed=41), \
        random_tensor(3, KV_HEADS, DIM, seed=42)
    runs = {}
    for cascade in (True, False):
        pool_copy = KVCache([tuple(t.clone() for t in layer) for layer in kv.layers], BLOCK)
        attention = select_backend(pool_copy, SCALE, choice="native")
        attention.use_cascade(cascade)
        attention.plan(batch)
        runs[cascade] = (attention.forward(q, k, v, 0, batch), len(batch.plan.decode.prefixes))
    assert runs[True][1] == (blocks * BLOCK >= native_attention.decode_chunk()) and runs[False][1] == 0
    assert torch.equal(runs[True][0], runs[False][0])
    for row in range(3):
        alone = step([batch.block_tables[row]], [batch.context_lens[row]], [1], queries="last")
        attention = select_backend(KVCache([tuple(t.clone() for t in layer) for layer in kv.layers], BLOCK), SCALE,
                                   choice="native")
        attention.plan(alone)
        assert torch.equal(attention.forward(q[row:row + 1], k[row:row + 1], v[row:row + 1], 0, alone),
                           runs[True][0][row:row + 1])


@pytest.mark.parametrize("trunk", TRUNKS.values(), ids=TRUNKS.keys())
@pytest.mark.parametrize("cascade", [True, False], ids=["cascade", "plain"])
@pytest.mark.parametrize("kernels", KERNEL_SETS)
def test_a_prefill_over_a_cached_trunk_attends_as_the_reference_for_every_token_and_the_last(kernels, cascade, trunk):
    kv = pool()
    attention = select_backend(kv, SCALE, choice=kernels)
    attention.use_cascade(cascade)
    tables = [trunk + [10], trunk + [11], trunk + [12, 13], [30]]   # three continue the trunk, one is alone
    batch = step(tables, [86, 90, 100, 5], [6, 10, 20, 5])
    attention.plan(batch)
    cascade_prefill = cascade and kernels != "torch"
    assert [seqs for seqs, _ in batch.plan.prefill_groups] == ([[0, 1, 2]] if cascade_prefill else [])
    tokens = sum(batch.query_lens)
    q, k, v = random_tensor(tokens, HEADS, DIM, seed=20), random_tensor(tokens, KV_HEADS, DIM, seed=21), \
        random_tensor(tokens, KV_HEADS, DIM, seed=22)
    want = expected(kv, 0, q, k, v, batch)
    torch.testing.assert_close(attention.forward(q, k, v, 0, batch), want, atol=1e-5, rtol=1e-5)
    last = batch.last_tokens()
    assert last.queries == "last" and batch.queries == "all" and last.query_rows.tolist() == [5, 15, 35, 40]
    got = attention.forward(q[last.query_rows], k, v, 0, last)
    torch.testing.assert_close(got, want[last.query_rows], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kernels", KERNEL_SETS)
def test_a_padded_decode_batch_reads_the_prefix_for_its_members_only_and_pads_harmlessly(kernels):
    """A decode step as a graph runs it (engine.decode_graphs): the prefix read for every row of the bucket,
    `members` masking the row that does not share it, and a padded row of length 0 that writes a scratch block."""
    kv = pool()
    attention = select_backend(kv, SCALE, choice=kernels)
    trunk, scratch_block = TRUNKS["consecutive"], 39
    real = step([trunk + [10, 11], [20, 21], trunk + [12]], [100, 25, 90], [1, 1, 1], queries="last")
    q, k, v = random_tensor(4, HEADS, DIM, seed=30), random_tensor(4, KV_HEADS, DIM, seed=31), \
        random_tensor(4, KV_HEADS, DIM, seed=32)
    want = expected(kv, 1, q[:3], k[:3], v[:3], real)
    before = kv.layers[1][0].clone()
    prefix = SharedPrefix(slice(0, 4), trunk[0], None, len(trunk), torch.tensor([True, False, True, True]))
    plan = DecodePlan([prefix], torch.tensor([[10, 11], [20, 21], [12, 0], [0, 0]]), torch.tensor([20, 25, 10, 0]))
    slots = torch.cat((real.slot_mapping, torch.tensor([scratch_block * BLOCK])))
    got = attention.forward(q, k, v, 1, AttentionBatch(False, slots, [], [1] * 4, [], queries="last",
                                                       plan=StepPlan(plan)))
    torch.testing.assert_close(got[:3], want, atol=1e-5, rtol=1e-5)
    assert torch.isfinite(got[3]).all()
    changed = (kv.layers[1][0] != before).flatten(1).any(1).nonzero().flatten().tolist()
    assert changed == sorted({11, 21, 12, scratch_block})   # the real rows' blocks and the scratch block
