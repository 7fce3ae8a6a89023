"""The gated delta rule against transformers' PyTorch reference, and its two forms against each other: chunked
equals recurrent, and a run cut into pieces continues exactly where it stopped."""
import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import (
    torch_chunk_gated_delta_rule,
    torch_recurrent_gated_delta_rule,
)

from engine.linear_attention.gated_delta_rule import (
    chunked_gated_delta_rule,
    l2_normalize,
    recurrent_gated_delta_step,
)

KEY_HEADS, VALUE_HEADS, K_DIM, V_DIM = 2, 6, 8, 12
CLOSE = {"atol": 1e-5, "rtol": 1e-5}


def random_tokens(length: int, seed: int = 0, batch: tuple[int, ...] = ()) -> dict[str, torch.Tensor]:
    """Inputs as the layer makes them: unit q and k, β in (0, 1), g <= 0."""
    gen = torch.Generator().manual_seed(seed)
    shape = (*batch, length)
    return {
        "q": l2_normalize(torch.randn(*shape, KEY_HEADS, K_DIM, generator=gen)),
        "k": l2_normalize(torch.randn(*shape, KEY_HEADS, K_DIM, generator=gen)),
        "v": torch.randn(*shape, VALUE_HEADS, V_DIM, generator=gen),
        "g": -torch.nn.functional.softplus(torch.randn(*shape, VALUE_HEADS, generator=gen)) * 0.5,
        "beta": torch.rand(*shape, VALUE_HEADS, generator=gen),
    }


def random_state(seed: int = 1, batch: tuple[int, ...] = ()) -> torch.Tensor:
    return torch.randn(*batch, VALUE_HEADS, K_DIM, V_DIM, generator=torch.Generator().manual_seed(seed))


def token_slice(tokens: dict[str, torch.Tensor], start: int, stop: int) -> dict[str, torch.Tensor]:
    return {name: x[start:stop] for name, x in tokens.items()}


def run_recurrent(tokens: dict[str, torch.Tensor], state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    outputs = []
    for t in range(tokens["v"].shape[0]):
        step = {name: x[t:t + 1] for name, x in tokens.items()}
        out, state = recurrent_gated_delta_step(**step, state=state.unsqueeze(0))
        outputs.append(out)
        state = state.squeeze(0)
    return torch.cat(outputs), state


@pytest.mark.parametrize("length", [1, 63, 64, 100, 150])
def test_chunked_matches_transformers(length):
    tokens, state = random_tokens(length), random_state()
    out, final = chunked_gated_delta_rule(**tokens, initial_state=state)
    batched = {name: x.unsqueeze(0) for name, x in tokens.items()}
    ref_out, ref_final = torch_chunk_gated_delta_rule(
        batched["q"], batched["k"], batched["v"], g=batched["g"], beta=batched["beta"],
        initial_state=state.unsqueeze(0), output_final_state=True)
    torch.testing.assert_close(out, ref_out[0], **CLOSE)
    torch.testing.assert_close(final, ref_final[0], **CLOSE)


def test_recurrent_step_matches_transformers_over_a_batch():
    tokens, state = random_tokens(1, batch=(3,)), random_state(batch=(3,))
    out, new_state = recurrent_gated_delta_step(**{name: x[:, 0] for name, x in tokens.items()}, state=state)
    ref_out, ref_state = torch_recurrent_gated_delta_rule(
        tokens["q"], tokens["k"], tokens["v"], g=tokens["g"], beta=tokens["beta"],
        initial_state=state, output_final_state=True)
    torch.testing.assert_close(out, ref_out[:, 0], **CLOSE)
    torch.testing.assert_close(new_state, ref_state, **CLOSE)


def test_recurrent_step_leaves_the_given_state_alone():
    tokens, state = random_tokens(1, batch=(2,)), random_state(batch=(2,))
    before = state.clone()
    recurrent_gated_delta_step(**{name: x[:, 0] for name, x in tokens.items()}, state=state)
    assert torch.equal(state, before)


@pytest.mark.parametrize("chunk_size", [64, 16])
def test_chunked_equals_recurrent(chunk_size):
    tokens, state = random_tokens(90, seed=3), random_state(seed=4)
    out, final = chunked_gated_delta_rule(**tokens, initial_state=state, chunk_size=chunk_size)
    step_out, step_final = run_recurrent(tokens, state)
    torch.testing.assert_close(out, step_out, **CLOSE)
    torch.testing.assert_close(final, step_final, **CLOSE)


def test_a_run_cut_into_pieces_continues_where_it_stopped():
    tokens, state = random_tokens(100, seed=5), torch.zeros(VALUE_HEADS, K_DIM, V_DIM)
    whole, whole_final = chunked_gated_delta_rule(**tokens, initial_state=state)
    pieces, start = [], 0
    for length in (37, 50, 13):
        out, state = chunked_gated_delta_rule(**token_slice(tokens, start, start + length), initial_state=state)
        pieces.append(out)
        start += length
    torch.testing.assert_close(torch.cat(pieces), whole, **CLOSE)
    torch.testing.assert_close(state, whole_final, **CLOSE)
