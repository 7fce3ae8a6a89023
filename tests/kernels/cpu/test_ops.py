"""The C kernels as torch ops (kernels/cpu/ops.py): the profiler lists them, torch.compile keeps them as
opaque nodes of one graph, their fake outputs match the real ones (torch.library.opcheck), and an argument
the C code cannot take raises KernelError naming it, where it used to be read out of bounds."""
import gguf.quants
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from torch._subclasses.fake_tensor import FakeTensorMode

from kernels.cpu import fused_ops, native_attention, ops, quant_matmul
from kernels.errors import KernelError
from kernels.reference import cascade_attention
from kernels.reference.quant_blocks import QuantizedTensor

pytestmark = pytest.mark.skipif(not (native_attention.available() and quant_matmul.available()
                                     and fused_ops.rms_norm(torch.ones(1, 8), torch.ones(8), 1e-5) is not None),
                                reason="no C compiler for the kernels")


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def quantized(rows=96, cols=320, format="Q4_1"):
    values = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    return QuantizedTensor(torch.from_numpy(gguf.quants.quantize(values, Q[format])), format, cols)


def code(format):
    """a format's GGML type code, as quant_matmul_many takes it"""
    return Q[format].value


def paged_args():
    """q [3, 6, 16] over a pool of 10 blocks of 4 tokens, 2 KV heads; the last sequence is empty."""
    tables = torch.tensor([[0, 1, 2], [3, 4, 5], [6, 7, 8]])
    return randn(3, 6, 16), randn(10, 4, 2, 16, seed=1), randn(10, 4, 2, 16, seed=2), tables, torch.tensor([5, 12, 0])


def op_args(name):
    """Arguments each op takes, in its order."""
    weight, other = quantized(), quantized(rows=40, format="Q8_0")
    return {
        "rms_norm": lambda: (randn(5, 64), randn(64, seed=1), 1e-5),
        "rotary": lambda: (randn(7, 3, 64), randn(7, 64, seed=1), randn(7, 64, seed=2)),
        "silu_mul": lambda: (randn(3, 70), randn(3, 70, seed=1)),
        "quant_matmul": lambda: (randn(4, 320), weight.blocks, weight.format, weight.cols, randn(96)),
        "quant_matmul_many": lambda: (randn(4, 320), [weight.blocks, other.blocks], [code("Q4_1"), code("Q8_0")], 320,
                                      [randn(96), None]),
        "quant_dequantize": lambda: (weight.blocks[3:10], weight.format, weight.cols, torch.empty(7, 320)),
        "paged_decode": lambda: (*paged_args(), 0.25),
        "paged_decode_given": lambda: (*paged_args(), 0.25, ops.prefix_partials(*op_args("prefix_partials")),
                                       torch.tensor([2, 1, 0])),
        "prefix_attention": lambda: (randn(3, 6, 16), randn(40, 2, 16, seed=1), randn(40, 2, 16, seed=2), 0.25),
        "prefix_partials": lambda: (randn(3, 6, 16), randn(300, 2, 16, seed=1), randn(300, 2, 16, seed=2), 0.25),
        "rows_attention": lambda: (randn(5, 6, 16), randn(9, 2, 16, seed=1), randn(9, 2, 16, seed=2), 0.25, True),
        "rows_attention_running": lambda: (randn(5, 6, 16), randn(9, 2, 16, seed=1), randn(9, 2, 16, seed=2), 0.25,
                                           True),
        "merge_attention": lambda: (randn(3, 6, 16), randn(3, 6, seed=1), randn(3, 6, 16, seed=2),
                                    randn(3, 6, seed=3)),
    }[name]()


NAMES = ["rms_norm", "rotary", "silu_mul", "quant_matmul", "quant_matmul_many", "paged_decode", "paged_decode_given",
         "prefix_attention", "prefix_partials", "rows_attention", "rows_attention_running", "merge_attention"]
WRITING = ["quant_dequantize"]   # ops that write into their last argument, returning nothing


def op_of(name: str) -> str:
    """The op a case of NAMES calls: paged_decode_given is paged_decode with a trunk's chunks given."""
    return name.removesuffix("_given")


@pytest.mark.parametrize("name", NAMES)
def test_the_profiler_lists_each_kernel_as_its_op_with_the_bits_of_the_direct_call(name):
    args = op_args(name)
    direct = getattr(ops, op_of(name))(*args)
    with torch.profiler.profile() as profiler:
        profiled = getattr(ops, op_of(name))(*args)
    assert f"swarm::{op_of(name)}" in {event.name for event in profiler.events()}
    for got, want in zip(*(r if isinstance(r, (tuple, list)) else (r,) for r in (profiled, direct))):
        assert torch.equal(got, want)


def test_the_engines_decode_attention_shows_in_the_profiler():
    q, k_cache, v_cache, tables, lengths = paged_args()
    prefix_k, prefix_v = randn(40, 2, 16, seed=3), randn(40, 2, 16, seed=4)
    with torch.profiler.profile() as profiler:
        paged = native_attention.paged_decode_with_lse(q, k_cache, v_cache, tables, lengths, 0.25)
        shared = native_attention.prefix_attention(q, prefix_k, prefix_v, 0.25)
        native_attention.merge_attention(*shared, *paged)
    names = {event.name for event in profiler.events()}
    assert {"swarm::paged_decode", "swarm::prefix_attention", "swarm::merge_attention"} <= names


@pytest.mark.parametrize("name", WRITING)
def test_the_profiler_lists_each_writing_kernel_as_its_op_with_the_bits_of_the_direct_call(name):
    args = op_args(name)
    getattr(ops, name)(*args)
    direct = args[-1].clone()
    args[-1].zero_()
    with torch.profiler.profile() as profiler:
        getattr(ops, name)(*args)
    assert f"swarm::{name}" in {event.name for event in profiler.events()}
    assert torch.equal(args[-1], direct)


@pytest.mark.parametrize("name", NAMES + WRITING)
def test_each_fake_gives_the_real_outputs_shapes_and_dtypes(name):
    op = getattr(torch.ops.swarm, op_of(name)).default
    torch.library.opcheck(op, op_args(name), test_utils=("test_schema", "test_faketensor",
                                                          "test_autograd_registration"))


def test_rows_attention_continuing_running_states_passes_opcheck():
    q, k, v, scale, _ = op_args("rows_attention")
    running = ops.rows_attention_running(q, k[:4], v[:4], scale, True)
    torch.library.opcheck(torch.ops.swarm.rows_attention.default, (q, k[4:], v[4:], scale, True, True, running),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_torch_compile_takes_the_cascade_as_one_graph_of_opaque_ops():
    seen = []

    def recording(graph_module, example_inputs):
        seen.extend(node.target for node in graph_module.graph.nodes if node.op == "call_function")
        return graph_module

    def cascade(q, k_cache, v_cache, tables, lengths, prefix_k, prefix_v):
        paged = native_attention.paged_decode_with_lse(q, k_cache, v_cache, tables, lengths, 0.25)
        shared = native_attention.prefix_attention(q, prefix_k, prefix_v, 0.25)
        return native_attention.merge_attention(*shared, *paged)

    args = (*paged_args(), randn(40, 2, 16, seed=3), randn(40, 2, 16, seed=4))
    compiled = torch.compile(cascade, fullgraph=True, backend=recording)(*args)
    eager = cascade(*args)
    assert {torch.ops.swarm.paged_decode.default, torch.ops.swarm.prefix_attention.default,
            torch.ops.swarm.merge_attention.default} <= set(seen)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])
    oracle = cascade_attention.merge_attention(*cascade_attention.prefix_attention(args[0], *args[5:], 0.25),
                                               *cascade_attention.paged_decode_with_lse(*args[:5], 0.25))
    torch.testing.assert_close(compiled[0], oracle[0], atol=1e-5, rtol=1e-5)


def with_arg(name, index, value):
    args = list(op_args(name))
    args[index] = value(args[index]) if callable(value) else value
    return args


def quant_matmul_of(x, blocks, format, cols, bias):
    """quant_matmul.quant_matmul with the op's arguments."""
    return quant_matmul.quant_matmul(x, QuantizedTensor(blocks, format, cols), bias)


PAGED, PREFIX = native_attention.paged_decode_with_lse, native_attention.prefix_attention
# (the wrapper the engine calls, its op, argument index, replacement, message): what the C code used to read past
WRAPPER_MISTAKES = [
    (fused_ops.rms_norm, "rms_norm", 1, lambda t: t[:32], r"weight must have shape \[64\], got \[32\]"),
    (fused_ops.rotary, "rotary", 1, lambda t: t[:5], r"cos must have shape \[7, 64\]"),
    (quant_matmul_of, "quant_matmul", 0, lambda t: t[:, :64], r"x has 64 columns, the weight 320"),
    (quant_matmul_of, "quant_matmul", 4, lambda t: t[:50], r"bias must have shape \[96\]"),
    (PAGED, "paged_decode", 3, lambda t: t[:2], r"block_tables must have a row for each of q's 3 rows, got 2"),
    (PAGED, "paged_decode", 4, lambda t: t[:1], r"lengths must have shape \[3\]"),
    (PAGED, "paged_decode", 2, lambda t: t[:4], r"v_cache must have shape \[10, 4, 2, 16\]"),
    (PREFIX, "prefix_attention", 2, lambda t: t[:30], r"v must have shape \[40, 2, 16\]"),
    (PREFIX, "prefix_attention", 0, randn(3, 5, 16), r"q must have a multiple of the 2 KV heads"),
    (native_attention.rows_attention, "rows_attention", 1, randn(9, 2, 24), r"k must have q's head width 16, got 24"),
]


@pytest.mark.parametrize("wrapper,name,index,value,message", WRAPPER_MISTAKES,
                         ids=[f"{m[1]}-{m[4].split()[0]}" for m in WRAPPER_MISTAKES])
def test_an_argument_the_c_code_would_read_past_raises_kernel_error_naming_it(wrapper, name, index, value, message):
    with pytest.raises(KernelError, match=rf"swarm::{name}: {message}"):
        wrapper(*with_arg(name, index, value))


# (op, argument index, replacement, message): a dtype, a rank, a layout the wrappers never pass
OP_MISTAKES = [
    ("paged_decode", 3, lambda t: t.int(), r"block_tables must be torch.int64, got torch.int32"),
    ("paged_decode", 0, lambda t: t.transpose(0, 1).contiguous().transpose(0, 1), r"q must be contiguous"),
    ("paged_decode", 1, lambda t: t[:, :, 0], r"k_cache must have 4 dimensions, got \[10, 4, 16\]"),
    ("quant_matmul", 0, lambda t: t.double(), r"x must be torch.float32, got torch.float64"),
    ("quant_matmul", 2, "Q2_K", r"format must be one of Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K, got 'Q2_K'"),
    ("quant_matmul", 3, 100, r"cols must be a positive multiple of 32 for Q4_1, got 100"),
    ("quant_matmul", 1, lambda t: t[:, :100].contiguous(), r"blocks must have shape \[96, 200\], got \[96, 100\]"),
    ("quant_matmul", 1, lambda t: t.view(torch.int8), r"blocks must be torch.uint8, got torch.int8"),
    ("quant_matmul_many", 2, lambda codes: [codes[0], 99], r"codes holds \[99\], not a format the kernel reads"),
    ("quant_matmul_many", 4, lambda biases: biases[:1],
     r"blocks holds 2 weights: codes and biases need as many, got 2 and 1"),
    ("quant_matmul_many", 4, lambda biases: [biases[0][:9], None], r"bias must have shape \[96\], got \[9\]"),
    ("quant_matmul_many", 0, lambda t: t[:, :64].contiguous(), r"x has 64 columns, the weight 320"),
    ("quant_dequantize", 3, lambda t: t[:, :64], r"out must have shape \[7, 320\], got \[7, 64\]"),
    ("quant_dequantize", 1, "Q4_K", r"cols must be a positive multiple of 256 for Q4_K, got 320"),
    ("rms_norm", 0, lambda t: t.t(), r"x must be contiguous"),
    ("rotary", 1, lambda t: t.half(), r"cos must be torch.float32"),
    ("prefix_attention", 1, lambda t: t[:0], r"v must have shape \[0, 2, 16\], got \[40, 2, 16\]"),
    ("rows_attention", 1, lambda t: t[:4], r"v must have shape \[4, 2, 16\]"),
    ("merge_attention", 3, lambda t: t[:2], r"lse_b must have shape \[3, 6\]"),
    ("merge_attention", 2, lambda t: t.to("meta"), r"out_b must be on the CPU"),
]


@pytest.mark.parametrize("name,index,value,message", OP_MISTAKES,
                         ids=[f"{m[0]}-{m[3].split()[0]}" for m in OP_MISTAKES])
def test_the_op_refuses_what_its_c_function_cannot_take(name, index, value, message):
    args = with_arg(name, index, value)
    with pytest.raises(KernelError, match=rf"swarm::{name}: {message}"):
        getattr(ops, name)(*args)
    with pytest.raises(KernelError, match=rf"swarm::{name}: {message}"):   # through torch's dispatcher
        getattr(torch.ops.swarm, name)(*args)


def test_the_fake_refuses_the_same_shapes_while_tracing():
    with FakeTensorMode():
        x, cos, sin = torch.empty(7, 3, 64), torch.empty(5, 64), torch.empty(7, 64)
        with pytest.raises(KernelError, match=r"swarm::rotary: cos must have shape \[7, 64\]"):
            torch.ops.swarm.rotary(x, cos, sin)


def test_too_few_keys_are_refused():
    q, k, v, scale = op_args("prefix_attention")
    with pytest.raises(KernelError, match="prefix_attention: k must hold at least one key"):
        ops.prefix_attention(q, k[:0], v[:0], scale)
    q, k, v, scale, _ = op_args("rows_attention")
    with pytest.raises(KernelError, match="rows_attention: k must hold at least as many keys as q has tokens"):
        ops.rows_attention(q, k[:3], v[:3], scale, True)
    out, lse = ops.rows_attention(q, k[:3], v[:3], scale, False)   # every token sees the 3 keys
    assert out.shape == (5, 6, 16) and lse.shape == (5, 6)
