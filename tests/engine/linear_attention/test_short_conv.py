"""The packed causal convolution: each sequence convolved as if alone (torch's zero-padded conv1d is the
oracle), its state carried across cuts, and the one-token step equal to the packed form."""
import torch
import torch.nn.functional as F

from engine.linear_attention.short_conv import causal_conv1d, causal_conv1d_step

CHANNELS, KERNEL = 10, 4


def random(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def conv_alone(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """One sequence from a zero state: a depthwise conv1d padded on the left, then SiLU."""
    out = F.conv1d(x.T.unsqueeze(0), weight.unsqueeze(1), padding=KERNEL - 1, groups=CHANNELS)
    return F.silu(out[0, :, :x.shape[0]].T)


def fresh_states(count: int) -> torch.Tensor:
    return torch.zeros(count, CHANNELS, KERNEL - 1)


def test_a_packed_batch_equals_each_sequence_alone():
    weight, lengths = random(CHANNELS, KERNEL, seed=0), [5, 1, 2, 9]
    x = random(sum(lengths), CHANNELS, seed=1)
    out, states = causal_conv1d(x, lengths, weight, fresh_states(len(lengths)))
    for tokens, got, state in zip(x.split(lengths), out.split(lengths), states):
        torch.testing.assert_close(got, conv_alone(tokens, weight))
        padded = torch.cat([torch.zeros(KERNEL - 1, CHANNELS), tokens])
        assert torch.equal(state, padded[-(KERNEL - 1):].T)


def test_a_sequence_cut_into_pieces_sees_the_same_windows():
    weight, x = random(CHANNELS, KERNEL, seed=2), random(12, CHANNELS, seed=3)
    states, pieces = fresh_states(1), []
    for tokens in x.split([2, 1, 6, 3]):
        out, states = causal_conv1d(tokens, [tokens.shape[0]], weight, states)
        pieces.append(out)
    torch.testing.assert_close(torch.cat(pieces), conv_alone(x, weight))


def test_the_step_equals_the_packed_form_for_one_token_each():
    weight, x, states = random(CHANNELS, KERNEL, seed=4), random(3, CHANNELS, seed=5), random(3, CHANNELS, 3, seed=6)
    step_out, step_states = causal_conv1d_step(x, weight, states)
    packed_out, packed_states = causal_conv1d(x, [1, 1, 1], weight, states)
    torch.testing.assert_close(step_out, packed_out)
    assert torch.equal(step_states, packed_states)
