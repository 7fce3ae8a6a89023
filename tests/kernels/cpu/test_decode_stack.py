"""A decode step's layers in one C call against the same layers run one by one, each with the cascade backend's
attention (engine.attention.cascade on the C kernels): the same outputs and the same KV pool, bit for bit, with
trunks whose rows and blocks are scattered and rows that share a trunk's table but do not read it."""
import pytest
import torch

from engine import fused_decode
from engine.attention.base import AttentionBatch
from engine.attention.cascade import CascadeBackend
from engine.attention.kernel_sets import NATIVE_KERNELS
from engine.attention.plan import DecodePlan, SharedPrefix, StepPlan
from engine.kv.cache import KVCache
from kernels.cpu import native_attention
from kernels.cpu.decode_stack import DecodeStack, Trunk
from kernels.errors import KernelError
from tests.helpers.decode_layers import HEAD_DIM, KV_HEADS, decode_layer, layer_parts, step_inputs

pytestmark = pytest.mark.skipif(not DecodeStack.available(), reason="no C compiler for the kernels")

BLOCKS, BLOCK_SIZE, SCALE = 12, 8, HEAD_DIM ** -0.5


def random_pool(layers: int, dtype: torch.dtype = torch.float32) -> KVCache:
    """float32 values that bfloat16 holds exactly, in `dtype`: pools of either dtype hold the same keys and values."""
    generator = torch.Generator().manual_seed(9)
    shape = (BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    def values():
        return torch.randn(shape, generator=generator).to(torch.bfloat16).to(dtype)
    return KVCache([(values(), values()) for _ in range(layers)], BLOCK_SIZE)


def a_step(members: torch.Tensor | None):
    """4 rows: rows 3, 0 and 1 share a trunk in blocks 7 and 2, then private tails; row 2 has only its tail."""
    tables = torch.tensor([[4, 5], [6, 0], [1, 8], [9, 0]])
    lengths = torch.tensor([11, 5, 14, 1])
    slots = torch.stack([table[(n - 1) // BLOCK_SIZE] * BLOCK_SIZE + (n - 1) % BLOCK_SIZE
                         for table, n in zip(tables, lengths)])
    trunk = SharedPrefix(torch.tensor([3, 0, 1]), 7, torch.tensor([7, 2]), 2, members)
    return slots, DecodePlan([trunk], tables, lengths)


def layer_by_layer(layers, pool: KVCache, x, cos, sin, slots, plan: DecodePlan,
                   attention: str = "float32") -> torch.Tensor:
    backend = CascadeBackend(NATIVE_KERNELS, pool, SCALE)
    backend.use_decode_attention(attention)
    batch = AttentionBatch(False, slots, [], [1] * len(x), [], queries="last", plan=StepPlan(plan))
    for index, layer in enumerate(layers):
        q, k, v = layer.attention_inputs(x, cos, sin)
        attended = backend.forward(q, k, v, index, batch)
        h, gate, up = layer.mlp_inputs(x, attended.reshape(len(x), -1).contiguous())
        x = layer.mlp_output(h, fused_decode.silu_mul(gate, up))
    return x


@pytest.mark.parametrize("members", [None, torch.tensor([True, False, True])])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("attention", ["float32", "bfloat16"])
def test_one_call_gives_the_layer_by_layer_bits(members, qk_norm, attention):
    """bfloat16: the attention's products, where this build has them natively (else both paths stay float32)."""
    layers = [decode_layer(*layer_parts(qk_norm, seed=10 * i)) for i in range(3)]
    x, cos, sin = step_inputs(4)
    slots, plan = a_step(members)
    pool, stacked_pool = random_pool(3), random_pool(3)
    want = layer_by_layer(layers, pool, x, cos, sin, slots, plan, attention)
    bf16 = attention == "bfloat16" and native_attention.bf16_products_native()
    stack = DecodeStack(layers, stacked_pool.layers, SCALE, bf16_attention=bf16)
    got = stack.run(x, cos, sin, slots, plan.private_tables, plan.private_lens, fused_decode._trunks(plan))
    assert torch.equal(got, want)
    for (k, v), (want_k, want_v) in zip(stacked_pool.layers, pool.layers):
        assert torch.equal(k, want_k) and torch.equal(v, want_v)


@pytest.mark.parametrize("members", [None, torch.tensor([True, False, True])])
def test_a_bfloat16_pool_gives_the_bits_of_a_float32_pool_of_the_same_values(members):
    """In bfloat16 products (plain C where this build has no AVX512-BF16), one call and layer by layer, the new
    keys and values written rounded as those products round them."""
    layers = [decode_layer(*layer_parts(True, seed=10 * i)) for i in range(3)]
    x, cos, sin = step_inputs(4)
    slots, plan = a_step(members)
    pool16, pool32, stacked16 = random_pool(3, torch.bfloat16), random_pool(3), random_pool(3, torch.bfloat16)
    got = DecodeStack(layers, stacked16.layers, SCALE, bf16_attention=True).run(
        x, cos, sin, slots, plan.private_tables, plan.private_lens, fused_decode._trunks(plan))
    want = DecodeStack(layers, pool32.layers, SCALE, bf16_attention=True).run(
        x, cos, sin, slots, plan.private_tables, plan.private_lens, fused_decode._trunks(plan))
    assert torch.equal(got, want)
    if native_attention.bf16_products_native():   # (the backend's products are float32 elsewhere)
        assert torch.equal(layer_by_layer(layers, pool16, x, cos, sin, slots, plan, "bfloat16"), want)
    for (k, v), (k16, v16), (k32, v32) in zip(stacked16.layers, pool16.layers, pool32.layers):
        assert k.dtype == torch.bfloat16
        assert torch.equal(k, k32.to(torch.bfloat16)) and torch.equal(v, v32.to(torch.bfloat16))
        if native_attention.bf16_products_native():
            assert torch.equal(k, k16) and torch.equal(v, v16)


def test_a_bfloat16_pool_is_refused_to_float32_products():
    with pytest.raises(KernelError, match="bfloat16 products only"):
        DecodeStack([decode_layer(*layer_parts(False))], random_pool(1, torch.bfloat16).layers, SCALE)


def test_a_trunk_in_consecutive_blocks_is_read_in_place():
    layers = [decode_layer(*layer_parts(False, seed=i)) for i in range(2)]
    x, cos, sin = step_inputs(3)
    tables, lengths = torch.tensor([[5], [6], [8]]), torch.tensor([3, 8, 1])
    slots = tables[:, 0] * BLOCK_SIZE + lengths - 1
    plan = DecodePlan([SharedPrefix(slice(0, 3), 2, None, 3)], tables, lengths)
    pool, stacked_pool = random_pool(2), random_pool(2)
    want = layer_by_layer(layers, pool, x, cos, sin, slots, plan)
    got = DecodeStack(layers, stacked_pool.layers, SCALE).run(x, cos, sin, slots, tables, lengths,
                                                              fused_decode._trunks(plan))
    assert torch.equal(got, want)


@pytest.mark.parametrize("change,message", [
    (lambda a: a.update(slots=torch.tensor([0, 1, 2, BLOCKS * BLOCK_SIZE])), r"slots must lie in \[0, 96\)"),
    (lambda a: a.update(tables=torch.tensor([[4, 5], [6, 0], [1, 12], [9, 0]])), r"tables must lie in \[0, 12\)"),
    (lambda a: a.update(lengths=torch.tensor([1, 2, 3])), r"lengths must have shape \[4\]"),
    (lambda a: a.update(x=a["x"][:, :100].contiguous()), r"x must be \[rows >= 1, 256\]"),
    (lambda a: a.update(trunks=[Trunk(torch.tensor([0, 4]), None, None, 0, 2)]), r"trunk rows must lie in \[0, 4\)"),
    (lambda a: a.update(trunks=[Trunk(torch.tensor([0]), None, None, 11, 2)]), r"not in the pool's 12"),
    (lambda a: a.update(trunks=[Trunk(torch.tensor([0]), None, torch.tensor([3, 20]), 3, 2)]),
     r"trunk blocks must lie in \[0, 12\)"),
])
def test_indices_the_kernel_would_follow_out_of_the_pool_are_refused(change, message):
    layers = [decode_layer(*layer_parts(False))]
    x, cos, sin = step_inputs(4)
    slots, plan = a_step(None)
    args = dict(x=x, cos=cos, sin=sin, slots=slots, tables=plan.private_tables, lengths=plan.private_lens,
                trunks=fused_decode._trunks(plan))
    change(args)
    pool = random_pool(1)
    before = [t.clone() for pair in pool.layers for t in pair]
    with pytest.raises(KernelError, match=message):
        DecodeStack(layers, pool.layers, SCALE).run(**args)
    assert all(torch.equal(t, b) for t, b in zip((t for pair in pool.layers for t in pair), before))


def test_layers_and_caches_that_do_not_fit_are_refused():
    layers = [decode_layer(*layer_parts(False))]
    with pytest.raises(KernelError, match="each with its caches"):
        DecodeStack(layers, random_pool(2).layers, SCALE)
    with pytest.raises(KernelError, match=r"k_cache must be \[blocks, block_size, 2, 64\]"):
        DecodeStack(layers, [(torch.zeros(4, 8, 3, 64), torch.zeros(4, 8, 3, 64))], SCALE)
