"""What sharing the trunk saves, from the model's config alone (no weights needed).

For N agents and a trunk of T tokens at B bytes per KV token (2 x layers x KV heads x
head dim x dtype bytes):

    one copy  = T x B            N copies = N x T x B
    freed     = (N - 1) x T x B  share    = freed / KV budget

Headroom says what the freed bytes buy: `freed_tokens / N` more context tokens for every
agent, or `freed_tokens / private` more agents, where `private` is the context each agent
has beyond the trunk (by default what it would get unshared: budget / N - T).
"""
from __future__ import annotations

from dataclasses import dataclass

REFERENCE_TRUNKS = (2000, 3000, 4000, 6000)


@dataclass(slots=True)
class MemoryRow:
    label: str
    trunk_tokens: int
    one_copy_bytes: int
    all_copies_bytes: int
    freed_bytes: int
    budget_share: float | None
    freed_tokens: int
    more_context_per_agent: int
    private_tokens_per_agent: int | None
    more_agents: int | None


@dataclass(slots=True)
class MemoryTable:
    bytes_per_token: int
    dtype: str
    agents: int
    budget_bytes: int | None
    rows: list[MemoryRow]

    @property
    def budget_tokens(self) -> int | None:
        return None if self.budget_bytes is None else self.budget_bytes // self.bytes_per_token


def memory_table(bytes_per_token: int, agents: int, trunk_tokens: int | None = None,
                 budget_bytes: int | None = None, dtype: str = "float16",
                 references: tuple[int, ...] = REFERENCE_TRUNKS,
                 private_tokens: int | None = None) -> MemoryTable:
    """One row for this swarm's trunk (when given), then one per reference trunk length."""
    assert bytes_per_token > 0 and agents > 0
    lengths = [("this swarm", trunk_tokens)] if trunk_tokens is not None else []
    lengths += [("reference", length) for length in references]
    rows = [memory_row(label, length, bytes_per_token, agents, budget_bytes, private_tokens)
            for label, length in lengths]
    return MemoryTable(bytes_per_token, dtype, agents, budget_bytes, rows)


def memory_row(label: str, trunk_tokens: int, bytes_per_token: int, agents: int,
               budget_bytes: int | None, private_tokens: int | None = None) -> MemoryRow:
    one_copy = trunk_tokens * bytes_per_token
    freed_tokens = (agents - 1) * trunk_tokens
    private = private_tokens if private_tokens is not None else _private_tokens(
        trunk_tokens, bytes_per_token, agents, budget_bytes)
    return MemoryRow(
        label=label,
        trunk_tokens=trunk_tokens,
        one_copy_bytes=one_copy,
        all_copies_bytes=agents * one_copy,
        freed_bytes=(agents - 1) * one_copy,
        budget_share=None if not budget_bytes else (agents - 1) * one_copy / budget_bytes,
        freed_tokens=freed_tokens,
        more_context_per_agent=freed_tokens // agents,
        private_tokens_per_agent=private,
        more_agents=freed_tokens // private if private else None,
    )


def _private_tokens(trunk_tokens: int, bytes_per_token: int, agents: int,
                    budget_bytes: int | None) -> int | None:
    """Context beyond the trunk each agent gets when every agent stores its own trunk copy."""
    if not budget_bytes:
        return None
    private = budget_bytes // bytes_per_token // agents - trunk_tokens
    return private if private > 0 else None
