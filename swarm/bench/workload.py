"""What `swarm bench` runs and what it measures: one swarm workload, one measurement per system.

    agent 0:  [ trunk: T ids ............ ][ suffix 0: S ids ][ G new tokens ]
    agent 1:  [ the same T ids .......... ][ suffix 1: S ids ][ G new tokens ]
    ...                                     ^ each suffix starts with its own token,
                                              so the agents diverge right after the trunk
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from engine import DEFAULT_MODEL, SwarmError

FIRST_ID = 3  # leave the usual special ids (unk, bos, eos) out of the random text
SYSTEMS = {"swarm": "swarm (sharing)", "swarm_no_sharing": "swarm (no sharing)",
           "hf": "transformers", "llamacpp": "llama.cpp"}
PEERS = ("hf", "llamacpp")
KV_SLACK_TOKENS = 64


class BenchError(SwarmError):
    exit_code = 2


@dataclass(slots=True)
class BenchOptions:
    model: str = DEFAULT_MODEL
    agents: tuple[int, ...] = (1, 2, 4, 8)
    trunks: tuple[int, ...] = (512, 2048, 4096)
    suffix: int = 64
    new_tokens: int = 64
    peers: tuple[str, ...] = PEERS
    device: str = "auto"
    dtype: str = "auto"
    hf_dtype: str = "float32"
    repeats: int = 1
    seed: int = 0
    busy: int = 0            # --busy K: each measurement again beside K busy-loop processes
    graphs: bool = True      # --no-graphs: swarm decodes eagerly on a GPU
    reprobe: bool = False    # --reprobe: measure the machine again, not from its cached probe

    @property
    def configurations(self) -> list[tuple[int, int]]:
        return [(trunk, agents) for trunk in self.trunks for agents in self.agents]

    @property
    def largest_kv_tokens(self) -> int:
        """KV slots the largest configuration can take unshared, with room for each agent's
        partly filled last block and a copied one."""
        return max(self.agents) * (max(self.trunks) + self.suffix + self.new_tokens + KV_SLACK_TOKENS)


@dataclass(frozen=True, slots=True)
class Workload:
    agents: int
    trunk: list[int]
    suffixes: list[list[int]]
    new_tokens: int

    @property
    def trunk_tokens(self) -> int:
        return len(self.trunk)

    @property
    def suffix_tokens(self) -> int:
        return len(self.suffixes[0])

    @property
    def prompts(self) -> list[list[int]]:
        return [self.trunk + suffix for suffix in self.suffixes]


def make_workload(agents: int, trunk: int, suffix: int, new_tokens: int, vocab_size: int,
                  seed: int | str) -> Workload:
    """Random token ids: a fresh seed gives a trunk no cache has seen before."""
    assert agents >= 1 and trunk >= 1 and suffix >= 1 and new_tokens >= 1
    ids = range(FIRST_ID, vocab_size)
    assert len(ids) >= agents, "the vocabulary is too small to give every agent its own first token"
    rng = random.Random(seed)
    trunk_ids = [rng.choice(ids) for _ in range(trunk)]
    firsts = rng.sample(ids, agents)
    suffixes = [[first] + [rng.choice(ids) for _ in range(suffix - 1)] for first in firsts]
    return Workload(agents, trunk_ids, suffixes, new_tokens)


@dataclass(slots=True)
class Measurement:
    """One system's run of one workload. Times are seconds from the moment it got the prompts."""

    kv_bytes_peak: int
    bytes_per_token: int
    prompt_tokens_computed: int
    ttft_last_s: float
    decode_tokens: int
    decode_s: float
    wall_s: float
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def decode_tok_s(self) -> float | None:
        return self.decode_tokens / self.decode_s if self.decode_tokens and self.decode_s > 0 else None

    def metric(self, name: str) -> float | None:
        return self.decode_tok_s if name == "decode_tok_s" else getattr(self, name)


METRICS = ("kv_bytes_peak", "prompt_tokens_computed", "ttft_last_s", "decode_tok_s", "wall_s")


class Stopwatch:
    """perf_counter with the time spent probing (reading KV stats) taken out."""

    def __init__(self):
        import time

        self._now = time.perf_counter
        self.start = self._now()
        self.paused = 0.0

    def elapsed(self) -> float:
        return self._now() - self.start - self.paused

    def probe(self, read):
        before = self._now()
        try:
            return read()
        finally:
            self.paused += self._now() - before


def agreement(outputs: list[list[int]], reference: list[list[int]]) -> float | None:
    """The share of agents whose new tokens equal the reference's, token for token."""
    if not outputs or len(outputs) != len(reference):
        return None
    return sum(a == b for a, b in zip(outputs, reference)) / len(reference)
