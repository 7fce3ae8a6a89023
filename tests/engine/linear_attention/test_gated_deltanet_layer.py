"""The Gated DeltaNet layer against transformers' `Qwen3_5GatedDeltaNet` (random weights, float32, offline): a
prompt then 20 decode steps through the reference's own cache, a prompt cut as the scheduler cuts it, and a
packed batch of sequences that each come out as they would alone."""
import re

import pytest
import torch
from transformers import DynamicCache, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet
from transformers.utils import logging

from engine.errors import UnsupportedArchitectureError
from engine.linear_attention.gated_deltanet_layer import GatedDeltaNet, LinearState

HIDDEN = 48
CLOSE = {"atol": 1e-5, "rtol": 1e-5}
SHAPES = {   # (key heads, value heads, k_dim, v_dim)
    "value_heads_share_key_heads": (2, 6, 8, 12),
    "odd_heads": (3, 3, 16, 8),
    "one_key_head_for_five": (1, 5, 8, 4),
    "odd_shared": (3, 9, 4, 8),
}


def reference_layer(shape: tuple[int, int, int, int], seed: int = 0) -> tuple[Qwen3_5TextConfig, Qwen3_5GatedDeltaNet]:
    """A transformers layer with every parameter random, not only the projections."""
    logging.set_verbosity_error()   # its note that fla and causal_conv1d are absent, once per function
    key_heads, value_heads, k_dim, v_dim = shape
    config = Qwen3_5TextConfig(hidden_size=HIDDEN, linear_num_key_heads=key_heads, linear_num_value_heads=value_heads,
                               linear_key_head_dim=k_dim, linear_value_head_dim=v_dim, linear_conv_kernel_dim=4,
                               num_hidden_layers=1, layer_types=["linear_attention"])
    torch.manual_seed(seed)
    layer = Qwen3_5GatedDeltaNet(config, layer_idx=0).eval()
    with torch.no_grad():
        layer.norm.weight.normal_(1.0, 0.2)
        layer.dt_bias.normal_(0.0, 1.0)
    return config, layer


def swarm_layer(config: Qwen3_5TextConfig, reference: Qwen3_5GatedDeltaNet) -> GatedDeltaNet:
    layer = GatedDeltaNet(config.to_dict()).eval()
    layer.load_state_dict(reference.state_dict())
    return layer


def hidden_states(length: int, seed: int) -> torch.Tensor:
    return torch.randn(length, HIDDEN, generator=torch.Generator().manual_seed(seed))


def run_in_pieces(layer: GatedDeltaNet, x: torch.Tensor, lengths: list[int],
                  state: LinearState) -> tuple[torch.Tensor, LinearState]:
    outputs = []
    for piece in x.split(lengths):
        out, (state,) = layer(piece, [piece.shape[0]], [state])
        outputs.append(out)
    return torch.cat(outputs), state


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@torch.no_grad()
def test_prompt_then_20_decode_steps_match_transformers(shape):
    config, reference = reference_layer(shape)
    layer = swarm_layer(config, reference)
    prompt, steps = hidden_states(70, seed=1), hidden_states(20, seed=2)
    cache = DynamicCache(config=config)
    out, states = layer(prompt, [70], [layer.initial_state()])
    torch.testing.assert_close(out, reference(prompt.unsqueeze(0), cache=cache)[0], **CLOSE)
    torch.testing.assert_close(states[0].recurrent, cache.layers[0].recurrent_states[0][0], **CLOSE)
    for token in steps.split(1):
        out, states = layer(token, [1], states)
        torch.testing.assert_close(out, reference(token.unsqueeze(0), cache=cache)[0], **CLOSE)


@pytest.mark.parametrize("shape, lengths", [
    (SHAPES["value_heads_share_key_heads"], [37, 50, 13]),   # the scheduler's prefill chunks
    (SHAPES["odd_shared"], [1] * 30),                         # one token at a time: the recurrent step
], ids=["scheduler_chunks", "token_by_token"])
@torch.no_grad()
def test_a_prompt_in_pieces_equals_one_chunk(shape, lengths):
    config, reference = reference_layer(shape)
    layer = swarm_layer(config, reference)
    prompt = hidden_states(sum(lengths), seed=3)
    whole, (whole_state,) = layer(prompt, [sum(lengths)], [layer.initial_state()])
    pieces, state = run_in_pieces(layer, prompt, lengths, layer.initial_state())
    torch.testing.assert_close(pieces, whole, **CLOSE)
    torch.testing.assert_close(state.recurrent, whole_state.recurrent, **CLOSE)
    torch.testing.assert_close(state.conv, whole_state.conv, **CLOSE)
    torch.testing.assert_close(whole, reference(prompt.unsqueeze(0))[0], **CLOSE)


@torch.no_grad()
def test_a_packed_batch_equals_each_sequence_alone():
    config, reference = reference_layer(SHAPES["one_key_head_for_five"])
    layer = swarm_layer(config, reference)
    lengths = [23, 1, 70]
    _, warm = run_in_pieces(layer, hidden_states(9, seed=5), [9], layer.initial_state())   # one mid-sequence
    starting = [layer.initial_state(), warm, layer.initial_state()]
    x = hidden_states(sum(lengths), seed=6)
    out, states = layer(x, lengths, starting)
    for tokens, got, start, state in zip(x.split(lengths), out.split(lengths), starting, states):
        alone, (alone_state,) = layer(tokens, [tokens.shape[0]], [start])
        torch.testing.assert_close(got, alone, **CLOSE)
        torch.testing.assert_close(state.recurrent, alone_state.recurrent, **CLOSE)
        torch.testing.assert_close(state.conv, alone_state.conv, **CLOSE)


@torch.no_grad()
def test_the_states_given_are_not_changed():
    config, reference = reference_layer(SHAPES["odd_heads"])
    layer = swarm_layer(config, reference)
    _, (state,) = layer(hidden_states(5, seed=7), [5], [layer.initial_state()])
    before = LinearState(state.conv.clone(), state.recurrent.clone())
    layer(hidden_states(1, seed=8), [1], [state])
    layer(hidden_states(4, seed=9), [4], [state])
    assert torch.equal(state.conv, before.conv) and torch.equal(state.recurrent, before.recurrent)


@pytest.mark.parametrize("change, message", [
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"linear_num_key_heads": 4}, "must be a multiple of linear_num_key_heads (4)"),
])
def test_a_config_it_cannot_run_says_what_is_wrong(change, message):
    config = {"linear_num_key_heads": 2, "linear_num_value_heads": 6, "linear_key_head_dim": 8,
              "linear_value_head_dim": 8, "linear_conv_kernel_dim": 4, "hidden_size": HIDDEN, "rms_norm_eps": 1e-6}
    with pytest.raises(UnsupportedArchitectureError, match=re.escape(message)):
        GatedDeltaNet({**config, **change})
