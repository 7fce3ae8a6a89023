"""Sampling parameters (vLLM's names) and the sampler that turns logits into tokens."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")
        if not self.temperature >= 0:  # also refuses NaN
            raise ValueError(f"temperature must be a number >= 0 (0 means greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 means no limit)")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


class Sampler:
    """Samples one token per row. A seeded request draws from its own generator, so its
    tokens do not depend on what else is in the batch."""

    def __init__(self):
        self.generators: dict[int, torch.Generator] = {}
        self.shared = torch.Generator()

    def sample(self, logits: torch.Tensor, rows: list[tuple[int, SamplingParams]]) -> list[int]:
        logits = logits.float()
        tokens = logits.argmax(dim=-1).tolist()
        for i, (seq_id, params) in enumerate(rows):
            if not params.greedy:
                probs = _probabilities(logits[i], params).cpu()
                tokens[i] = int(torch.multinomial(probs, 1, generator=self._generator(seq_id, params)))
        return tokens

    def forget(self, seq_id: int) -> None:
        self.generators.pop(seq_id, None)

    def _generator(self, seq_id: int, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self.shared
        if seq_id not in self.generators:
            self.generators[seq_id] = torch.Generator().manual_seed(params.seed)
        return self.generators[seq_id]


def _probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.numel():
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs
        sorted_probs[before >= params.top_p] = 0
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
    return probs / probs.sum()
