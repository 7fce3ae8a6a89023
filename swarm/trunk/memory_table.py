"""What sharing the trunk saves, from the model's config alone (no weights needed).

For N agents and a trunk of T tokens at B bytes per KV token (2 x layers x KV heads x
head dim x dtype bytes):

    one copy  = T x B            N copies = N x T x B
    freed     = (N - 1) x T x B  share    = freed / KV budget

Headroom says what the freed bytes buy: `freed_tokens / N` more context tokens for every
agent, or `freed_tokens / private` more agents, where `private` is the context each agent
has beyond the trunk (by default what it would get unshared: budget / N - T).

A hybrid (Qwen3.5) keeps KV in its full-attention layers only (B counts those), and beside it S bytes
of linear-attention state per sequence, which no two agents can share: each agent holds its own, shared
trunk or not (N x S either way). Sharing adds one: the snapshot of the state at the trunk's end, which
every agent starts from. So, with S = 0 for every other model:

    one copy  = T x B + S        (the trunk's KV and its snapshot, held once)
    N copies  = N x T x B        (each agent's own trunk KV; their states are the same N x S either way)
    freed     = (N - 1) x T x B - S
    private   = budget / B / N - T,   more agents = freed / (private x B + S)

The budget is the KV pool's, as the engine's kv_budget is: the states lie beside it (the engine holds them back
from a card's memory before it sizes the pool, swarm/trunk/card_budget.py).
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
    state_bytes_per_agent: int = 0
    """A hybrid's linear-attention state per sequence (0: a model with KV only)."""

    @property
    def budget_tokens(self) -> int | None:
        return None if self.budget_bytes is None else self.budget_bytes // self.bytes_per_token

    @property
    def agent_state_bytes(self) -> int:
        """What the agents' own states take, trunk shared or not."""
        return self.agents * self.state_bytes_per_agent


def memory_table(bytes_per_token: int, agents: int, trunk_tokens: int | None = None,
                 budget_bytes: int | None = None, dtype: str = "float16",
                 references: tuple[int, ...] = REFERENCE_TRUNKS,
                 private_tokens: int | None = None, state_bytes: int = 0) -> MemoryTable:
    """One row for this swarm's trunk (when given), then one per reference trunk length; `state_bytes`: a
    hybrid's linear-attention state per sequence."""
    assert bytes_per_token > 0 and agents > 0 and state_bytes >= 0
    lengths = [("this swarm", trunk_tokens)] if trunk_tokens is not None else []
    lengths += [("reference", length) for length in references]
    rows = [memory_row(label, length, bytes_per_token, agents, budget_bytes, private_tokens, state_bytes)
            for label, length in lengths]
    return MemoryTable(bytes_per_token, dtype, agents, budget_bytes, rows, state_bytes)


def memory_row(label: str, trunk_tokens: int, bytes_per_token: int, agents: int,
               budget_bytes: int | None, private_tokens: int | None = None, state_bytes: int = 0) -> MemoryRow:
    trunk_kv = trunk_tokens * bytes_per_token
    freed = (agents - 1) * trunk_kv - state_bytes   # the snapshot is the one state sharing adds
    freed_tokens = max(freed, 0) // bytes_per_token
    private = private_tokens if private_tokens is not None else _private_tokens(
        trunk_tokens, bytes_per_token, agents, budget_bytes)
    return MemoryRow(
        label=label,
        trunk_tokens=trunk_tokens,
        one_copy_bytes=trunk_kv + state_bytes,
        all_copies_bytes=agents * trunk_kv,
        freed_bytes=freed,
        budget_share=None if not budget_bytes else freed / budget_bytes,
        freed_tokens=freed_tokens,
        more_context_per_agent=freed_tokens // agents,
        private_tokens_per_agent=private,
        more_agents=max(freed, 0) // (private * bytes_per_token + state_bytes) if private else None,
    )


def _private_tokens(trunk_tokens: int, bytes_per_token: int, agents: int, budget_bytes: int | None) -> int | None:
    """Context beyond the trunk each agent gets when every agent stores its own trunk copy."""
    if not budget_bytes:
        return None
    private = budget_bytes // bytes_per_token // agents - trunk_tokens
    return private if private > 0 else None
