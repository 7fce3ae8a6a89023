"""The Triton prefill kernels against the PyTorch reference (kernels.reference.paged_attention.prefill_attention,
computed in float32 from the same inputs), with fresh random inputs per case.

Without a GPU they run under TRITON_INTERPRET=1 on CPU tensors (set here unless already set);
with one, compiled on CUDA tensors.
"""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before the kernels are defined
pytest.importorskip("triton")

from engine.attention.cascade import prefix_kv  # noqa: E402
from engine.attention.plan import plan_prefill  # noqa: E402
from kernels.reference import paged_attention  # noqa: E402
from kernels.triton import prefill  # noqa: E402
from kernels.triton.attention import INTERPRETED  # noqa: E402

DEVICE = "cpu" if INTERPRETED else "cuda"
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                reason="TRITON_INTERPRET=0 needs a GPU")

# max |out - reference| / max |reference|. The kernel rounds the softmax weights to the 16-bit input
# type before multiplying by V (as flash attention does) and the output to q's dtype. Measured on these
# cases: 3e-4 (float16), 6e-3 (bfloat16), 4e-7 (float32); the bounds are 2 units of float16's precision
# (2^-10) and 4 of bfloat16's (2^-8), float32's summation order aside.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# (context_len, query_len): no cache; 27 cached (not a multiple of the block); a 1-token query (a decode
# row in a mixed step); 19 new tokens, more than one query tile when GQA packs 4 or more heads a KV head
SEQUENCES = [(5, 5), (37, 10), (40, 1), (50, 19)]
# (heads, kv_heads, head_dim): GQA ratios 1, 2, 4 and 7; head_dim 24 pads to 32
SHAPES = [(2, 2, 64), (4, 2, 128), (4, 1, 256), (8, 2, 64), (7, 1, 64), (3, 3, 24)]
_case_seed = iter(range(10_000))
# Compiles the kernel, as the launcher sizes it, for an NVIDIA (sm_90) and an AMD (gfx942) GPU: no GPU needed
COMPILE_FOR_GPUS = """
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels.triton.prefill import _tile_shape
from kernels.triton.prefill_kernels import paged_prefill_kernel as kernel

def signature(dtype):
    ptr = {"tables_ptr": "*i64", "seqs_ptr": "*i32", "tiles_ptr": "*i32", "lse_ptr": "*fp32"}
    return {name: ptr.get(name, f"*{dtype}") if name.endswith("_ptr") else "fp32" if name == "qk_scale"
            else "constexpr" if name.isupper() else "i32" for name in kernel.arg_names}

for target in (GPUTarget("cuda", 90, 32), GPUTarget("hip", "gfx942", 64)):
    for dtype, size, group, dim in (("bf16", 2, 4, 128), ("fp32", 4, 7, 64)):
        rows, keys, warps = _tile_shape(dim, size)
        constants = dict(GROUP=group, TOKENS=rows // group, BLOCK_M=rows, DIM_P=dim, BLOCK_SIZE=16, TILE_N=keys,
                         UPCAST=False)
        triton.compile(ASTSource(kernel, signature(dtype), constants), target=target, options={"num_warps": warps})
"""


def fresh(*shape, dtype=torch.float32):
    gen = torch.Generator().manual_seed(next(_case_seed))
    return torch.randn(*shape, generator=gen).to(dtype).to(DEVICE)


def shuffled_tables(context_lens, block_size, num_blocks):
    """Each sequence's blocks, drawn from a random permutation of the pool: scattered, out of order."""
    ids = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(next(_case_seed))).tolist()
    tables = []
    for context in context_lens:
        count = -(-context // block_size)
        tables.append(torch.tensor(ids[:count], dtype=torch.long, device=DEVICE))
        ids = ids[count:]
    return tables


def expected(q, k_cache, v_cache, tables, context_lens, query_lens, scale):
    return paged_attention.prefill_attention(q.float(), k_cache.float(), v_cache.float(), tables, context_lens,
                                             query_lens, scale)


def assert_close(out, want, dtype):
    error = (out.float() - want).abs().max() / want.abs().max()
    assert error <= TOLERANCE[dtype], f"relative error {error:.2e} above {TOLERANCE[dtype]:.0e} for {dtype}"


def run_case(shape, dtype, sequences=SEQUENCES, block_size=16):
    heads, kv_heads, dim = shape
    context_lens, query_lens = [c for c, _ in sequences], [n for _, n in sequences]
    num_blocks = sum(-(-c // block_size) for c in context_lens) + 3
    k_cache, v_cache = (fresh(num_blocks, block_size, kv_heads, dim, dtype=dtype) for _ in range(2))
    tables = shuffled_tables(context_lens, block_size, num_blocks)
    q = fresh(sum(query_lens), heads, dim, dtype=dtype)
    scale = dim ** -0.5
    out = prefill.prefill_attention(q, k_cache, v_cache, tables, context_lens, query_lens, scale)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, expected(q, k_cache, v_cache, tables, context_lens, query_lens, scale), dtype)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{h}h{kv}kv{d}d" for h, kv, d in SHAPES])
def test_prefill_attends_as_the_reference_in_float32(shape):
    run_case(shape, torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(4, 2, 128), (4, 1, 256)], ids=["4h2kv128d", "4h1kv256d"])
def test_prefill_attends_as_the_reference_in_16_bit(shape, dtype):
    run_case(shape, dtype)


def test_a_block_size_of_32_reads_each_token_at_its_slot():
    run_case((4, 2, 64), torch.float32, [(70, 6), (33, 33)], block_size=32)


@settings(max_examples=12)
@given(sequences=st.lists(st.tuples(st.integers(0, 40), st.integers(1, 45)), min_size=1, max_size=4),
       block_size=st.sampled_from([4, 16]))
def test_any_batch_of_cached_and_new_lengths_attends_as_the_reference(sequences, block_size):
    """(cached, new) tokens per sequence; 3 query heads a KV head put 21 new tokens in a query tile."""
    run_case((6, 2, 32), torch.float32, [(cached + new, new) for cached, new in sequences], block_size)


def test_the_same_tables_with_other_lengths_attend_with_the_new_lengths():
    """Every layer of a step reuses the step's metadata; the next step, on the same table tensors, must not."""
    heads, kv_heads, dim = 4, 2, 64
    k_cache, v_cache = (fresh(8, 16, kv_heads, dim) for _ in range(2))
    tables = shuffled_tables([40, 30], 16, 8)
    for context_lens, query_lens in (([35, 30], [5, 30]), ([36, 30], [1, 1])):
        q = fresh(sum(query_lens), heads, dim)
        for _layer in range(2):
            out = prefill.prefill_attention(q, k_cache, v_cache, tables, context_lens, query_lens, 0.125)
            assert_close(out, expected(q, k_cache, v_cache, tables, context_lens, query_lens, 0.125), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("trunk_order", ["consecutive", "scattered"])
def test_cascade_prefill_reads_the_trunk_once_and_attends_as_the_reference(trunk_order, dtype):
    heads, kv_heads, dim, block_size = 4, 2, 64, 16
    # three prompts continue an 80-token trunk, one is alone: last (the group's rows are a slice of q),
    # or second (its rows are gathered)
    if trunk_order == "consecutive":
        trunk, alone = [0, 1, 2, 3, 4], 3
    else:
        trunk, alone = [7, 3, 9, 1, 5], 1
    tables = [trunk + [10], trunk + [11], trunk + [12, 13]]
    context_lens, query_lens = [86, 90, 100], [6, 10, 20]
    tables.insert(alone, [14])
    context_lens.insert(alone, 5)
    query_lens.insert(alone, 5)
    starts = [c - n for c, n in zip(context_lens, query_lens)]
    groups = plan_prefill(tables, starts, query_lens, block_size, torch.device(DEVICE))
    assert [seqs for seqs, _ in groups] == [[i for i in range(4) if i != alone]]
    k_cache, v_cache = (fresh(16, block_size, kv_heads, dim, dtype=dtype) for _ in range(2))
    block_tables = [torch.tensor(t, dtype=torch.long, device=DEVICE) for t in tables]
    q = fresh(sum(query_lens), heads, dim, dtype=dtype)
    out = prefill.cascade_prefill_attention(q, k_cache, v_cache, block_tables, context_lens, query_lens, groups,
                                            0.125, prefix_kv)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, expected(q, k_cache, v_cache, block_tables, context_lens, query_lens, 0.125), dtype)


def test_the_kernel_compiles_for_an_nvidia_and_an_amd_gpu():
    """The interpreter runs the kernel's Python; this lowers it as a GPU would, to catch what only a
    compiler rejects (layouts, dot shapes, types, shared memory)."""
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPUS], env=env, capture_output=True, text=True,
                            cwd=Path(__file__).parents[3], timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
