"""flash-linear-attention's gated delta rule kernels, through swarm's adapter (kernels.triton.gated_delta_rule),
against the PyTorch rule (engine.linear_attention.gated_delta_rule, itself checked against transformers'):
packed prompts of several sequences in one varlen call, and decode steps, both from given states.

Without a GPU they run under TRITON_INTERPRET=1 on CPU tensors (set here unless already set); with one,
compiled on CUDA tensors.
"""
import os

import pytest
import torch
import torch.nn.functional as F

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")     # before fla's kernels are defined
pytest.importorskip("triton")
pytest.importorskip("fla")

from engine.linear_attention.delta_rule_kernels import TORCH_KERNELS  # noqa: E402
from engine.linear_attention.gated_delta_rule import l2_normalize  # noqa: E402
from kernels.triton import gated_delta_rule as fla  # noqa: E402
from kernels.triton import interpreted  # noqa: E402

DEVICE = "cpu" if interpreted() else "cuda"
pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                reason="TRITON_INTERPRET=0 needs a GPU")
# (key heads, value heads, k_dim, v_dim): value heads sharing key heads 1, 2 and 3 to one; odd head sizes
SHAPES = [(2, 2, 16, 16), (2, 4, 16, 32), (1, 3, 32, 24)]


def inputs(tokens: int, shape: tuple[int, int, int, int], seed: int):
    key_heads, value_heads, k_dim, v_dim = shape
    gen = torch.Generator().manual_seed(seed)
    q, k = (l2_normalize(torch.randn(tokens, key_heads, k_dim, generator=gen)) for _ in range(2))
    v = torch.randn(tokens, value_heads, v_dim, generator=gen)
    g = F.logsigmoid(torch.randn(tokens, value_heads, generator=gen) + 2)   # decays near 1, as trained gates
    beta = torch.rand(tokens, value_heads, generator=gen)
    return [x.to(DEVICE) for x in (q, k, v, g, beta)]


def states(n: int, shape: tuple[int, int, int, int], seed: int) -> torch.Tensor:
    _, value_heads, k_dim, v_dim = shape
    gen = torch.Generator().manual_seed(seed)
    return (0.3 * torch.randn(n, value_heads, k_dim, v_dim, generator=gen)).to(DEVICE)


@pytest.mark.parametrize("shape", SHAPES)
def test_packed_prompts_of_three_sequences_match_the_pytorch_rule_one_by_one(shape):
    seq_lens = [5, 70, 2]   # 70 crosses fla's 64-token chunk and the PyTorch rule's
    q, k, v, g, beta = inputs(sum(seq_lens), shape, seed=1)
    before = states(len(seq_lens), shape, seed=2)
    out, after = fla.prompts(q, k, v, g, beta, seq_lens, before)
    want_out, want_after = TORCH_KERNELS.prompts(q, k, v, g, beta, seq_lens, before)
    assert out.dtype == v.dtype and after.dtype == torch.float32
    torch.testing.assert_close(out, want_out, atol=2e-5, rtol=1e-4)
    torch.testing.assert_close(after, want_after, atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", SHAPES)
def test_decode_steps_of_four_sequences_match_the_pytorch_step(shape):
    state = states(4, shape, seed=3)
    want = state.clone()
    for step in range(3):
        q, k, v, g, beta = inputs(4, shape, seed=10 + step)
        out, state = fla.step(q, k, v, g, beta, state)
        want_out, want = TORCH_KERNELS.step(q, k, v, g, beta, want)
        torch.testing.assert_close(out, want_out, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(state, want, atol=1e-5, rtol=1e-4)


def test_a_prompt_then_its_steps_continue_one_state():
    """A prompt through the chunked kernel and two tokens through the step give what one prompt of all gives."""
    shape = SHAPES[1]
    q, k, v, g, beta = inputs(12, shape, seed=4)
    start = states(1, shape, seed=5)
    whole, whole_state = fla.prompts(q, k, v, g, beta, [12], start)
    head, state = fla.prompts(q[:10], k[:10], v[:10], g[:10], beta[:10], [10], start)
    tail = []
    for t in (10, 11):
        out, state = fla.step(q[t:t + 1], k[t:t + 1], v[t:t + 1], g[t:t + 1], beta[t:t + 1], state)
        tail.append(out)
    torch.testing.assert_close(torch.cat([head, *tail]), whole, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(state, whole_state, atol=1e-5, rtol=1e-4)
