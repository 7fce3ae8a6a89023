"""Turns a step's logits into one token per row, for the whole batch at once, on the logits' device.

A row is drawn by the Gumbel-max trick: argmax(logits / T + g), with g = -log(-log(u)) for uniform
u, picks token i with probability softmax(logits / T)_i (exactly, but for u's grain of 2**-23);
top-k and top-p first set the logits they cut to -inf. The uniforms come from a counter-based
hash, SplitMix64, of (the row's seed, the row's sample index, the token id), so a seeded row's
draw depends on its seed, how many tokens it has sampled and its own logits, and on nothing else:
not its row, the batch size or the other rows. Per-row torch generators would give the same
guarantee, but each fills its own tensor: a launch per row on a GPU, and on the CPU's generators
a copy of the logits to the host. The hash is a dozen elementwise int64 ops over the whole batch,
bit for bit the same on every device torch runs on (a CPU and a GPU draw the same tokens from the
same logits, but for rounding at near-ties of the scores). Unseeded rows take a fresh seed each
step from one generator on the device.

Nothing reads the device before the chosen ids' one `.tolist()`: the rows' parameters go up in two
small copies (pinned, on a GPU), and every branch depends on the parameters, never on the logits.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.sampling import SamplingParams

_GOLDEN = 0x9E3779B97F4A7C15 - 2**64   # SplitMix64's constants, as the int64 values torch holds
_MIX_1 = 0xBF58476D1CE4E5B9 - 2**64
_MIX_2 = 0x94D049BB133111EB - 2**64
_UNIFORM_BITS = 23   # (k + 0.5) / 2**23 is exact in float32 and never 0 or 1, so -log(-log(u)) is finite
_KEEP_ALL = 2.0      # a top_p no cumulative probability reaches


class Sampler:
    """Samples one token per row. The sample index of a row is how many tokens this sampler has
    drawn for its sequence so far; `forget` ends the count when the sequence is released."""

    def __init__(self):
        self.num_sampled: dict[int, int] = {}
        self.generator: torch.Generator | None = None

    def sample(self, logits: torch.Tensor, rows: list[tuple[int, SamplingParams]]) -> list[int]:
        return self.choose(logits, rows).tolist()

    def choose(self, logits: torch.Tensor, rows: list[tuple[int, SamplingParams]]) -> torch.Tensor:
        """The chosen ids, still on the logits' device: nothing here waits for the device."""
        logits = logits.float()
        greedy = logits.argmax(dim=-1)
        params = [p for _, p in rows]
        sample_indices = [self.num_sampled.get(seq_id, 0) for seq_id, _ in rows]
        for (seq_id, _), index in zip(rows, sample_indices):
            self.num_sampled[seq_id] = index + 1
        if all(p.greedy for p in params):
            return greedy
        step = StepParams.build(params, sample_indices, logits.shape[-1], logits.device)
        scores = _filtered(_scaled(logits, step), step)
        scores += gumbel_noise(self._seeds(step), step.sample_index, logits.shape[-1])
        return torch.where(step.greedy, greedy, scores.argmax(dim=-1))

    def forget(self, seq_id: int) -> None:
        self.num_sampled.pop(seq_id, None)

    def _seeds(self, step: StepParams) -> torch.Tensor:
        if not step.any_unseeded:
            return step.seed
        drawn = torch.empty_like(step.seed).random_(generator=self._generator(step.seed.device))
        return torch.where(step.seeded, step.seed, drawn)

    def _generator(self, device: torch.device) -> torch.Generator:
        if self.generator is None or self.generator.device != device:
            self.generator = torch.Generator(device)
        return self.generator


@dataclass(slots=True)
class StepParams:
    """One step's per-row sampling parameters, as tensors on the logits' device."""
    temperature: torch.Tensor   # float32; 1 for greedy rows
    top_p: torch.Tensor         # float32; _KEEP_ALL for rows without a limit
    top_k: torch.Tensor         # int64; the vocabulary size for rows without a limit, 1 for greedy rows
    seed: torch.Tensor          # int64; 0 for unseeded rows
    seeded: torch.Tensor        # bool
    greedy: torch.Tensor        # bool
    sample_index: torch.Tensor  # int64
    max_top_k: int
    any_top_k: bool
    any_top_p: bool
    any_unseeded: bool

    @classmethod
    def build(cls, params: list[SamplingParams], sample_indices: list[int], vocab_size: int,
              device: torch.device) -> StepParams:
        sampled = [p for p in params if not p.greedy]
        tiny = torch.finfo(torch.float32).tiny   # a temperature float32 rounds to 0 would divide 0 by 0
        top_k = [1 if p.greedy else p.top_k if 0 < p.top_k < vocab_size else vocab_size for p in params]
        floats = _upload([[max(p.temperature, tiny) if p.temperature else 1.0,
                           p.top_p if p.top_p < 1 else _KEEP_ALL] for p in params], torch.float32, device)
        ints = _upload([[_as_int64(p.seed), p.seed is not None, p.greedy, index, k]
                        for p, index, k in zip(params, sample_indices, top_k)], torch.int64, device)
        return cls(temperature=floats[:, 0], top_p=floats[:, 1], top_k=ints[:, 4], seed=ints[:, 0],
                   seeded=ints[:, 1].bool(), greedy=ints[:, 2].bool(), sample_index=ints[:, 3],
                   max_top_k=max(top_k), any_top_k=any(0 < p.top_k < vocab_size for p in sampled),
                   any_top_p=any(p.top_p < 1 for p in sampled),
                   any_unseeded=any(p.seed is None for p in sampled))


def gumbel_noise(seeds: torch.Tensor, sample_indices: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, vocab_size] float32 Gumbel(0, 1) noise; row r's is a function of seeds[r] and
    sample_indices[r] alone."""
    row_keys = splitmix64(splitmix64(seeds, 1) ^ sample_indices, 1)
    bits = splitmix64(row_keys[:, None], torch.arange(1, vocab_size + 1, device=seeds.device))
    uniform = _shift_right(bits, 64 - _UNIFORM_BITS, out=bits).float()
    return uniform.add_(0.5).mul_(2.0 ** -_UNIFORM_BITS).log_().neg_().log_().neg_()


def splitmix64(seed: torch.Tensor, n: torch.Tensor | int) -> torch.Tensor:
    """The n-th output (counting from 1) of SplitMix64 seeded with `seed`, elementwise: uint64
    arithmetic in int64 tensors, whose multiplication wraps the same way. In place after the first
    op: a fresh tensor per op would cost most of the time on a CPU."""
    z = seed + n * _GOLDEN
    shifted = torch.empty_like(z)
    z ^= _shift_right(z, 30, out=shifted)
    z *= _MIX_1
    z ^= _shift_right(z, 27, out=shifted)
    z *= _MIX_2
    z ^= _shift_right(z, 31, out=shifted)
    return z


def _shift_right(z: torch.Tensor, bits: int, out: torch.Tensor) -> torch.Tensor:
    """A logical shift: torch's >> on int64 copies the sign bit in."""
    return torch.bitwise_right_shift(z, bits, out=out).bitwise_and_((1 << (64 - bits)) - 1)


def _scaled(logits: torch.Tensor, step: StepParams) -> torch.Tensor:
    # shifting the maximum to 0 first keeps a vanishing temperature from making inf - inf
    return (logits - logits.amax(dim=-1, keepdim=True)).div_(step.temperature[:, None])


def _filtered(scaled: torch.Tensor, step: StepParams) -> torch.Tensor:
    """top-k, then top-p over what top-k kept (vLLM's order): what they cut becomes -inf, in place.
    Ties with the k-th value stay; top-p keeps the tokens whose higher-ranked mass is below top_p."""
    if step.any_top_p:
        return _nucleus(scaled, step)
    if step.any_top_k:
        top = scaled.topk(step.max_top_k, dim=-1).values
        scaled.masked_fill_(scaled < top.gather(1, (step.top_k - 1)[:, None]), float("-inf"))
    return scaled


def _nucleus(scaled: torch.Tensor, step: StepParams) -> torch.Tensor:
    ranked, order = scaled.sort(dim=-1, descending=True, stable=True)
    cut = ranked < ranked.gather(1, (step.top_k - 1)[:, None])
    probs = ranked.masked_fill_(cut, float("-inf")).softmax(dim=-1)
    cut |= probs.cumsum(dim=-1).sub_(probs) >= step.top_p[:, None]
    return scaled.masked_fill_(torch.empty_like(cut).scatter_(1, order, cut), float("-inf"))


def _upload(rows: list[list], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    host = torch.tensor(rows, dtype=dtype)
    if device.type == "cuda":   # a pinned copy does not wait for the step's kernels
        return host.pin_memory().to(device, non_blocking=True)
    return host.to(device)


def _as_int64(seed: int | None) -> int:
    """The int64 with the seed's 64 low bits (the API takes seeds in [-2**63, 2**64))."""
    wrapped = (seed or 0) % 2**64
    return wrapped - 2**64 if wrapped >= 2**63 else wrapped
