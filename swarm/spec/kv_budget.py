"""The KV budget: how much memory the swarm may spend on KV cache, in tokens or in bytes.

`8GB` and `8.09GB` are decimal (10^9 bytes), `8GiB` is binary (2^30), a bare number
or `20000 tokens` counts tokens of the model's KV cache. A card's memory (`--card 16GB`) is
written the same way, as a size only.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

UNITS = {
    "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


@dataclass(frozen=True, slots=True)
class KvBudget:
    """Exactly one of `bytes` and `tokens` is set; `unit` is the one the user wrote (GB, GiB...)."""

    bytes: int | None = None
    tokens: int | None = None
    unit: str = field(default="", compare=False)

    def to_bytes(self, bytes_per_token: int) -> int:
        return self.bytes if self.bytes is not None else self.tokens * bytes_per_token

    def pool_tokens(self, bytes_per_token: int, block_size: int) -> int:
        """The tokens of the KV pool the engine makes of this budget: whole blocks, at least one
        (engine/kv/cache.py, blocks_for_budget)."""
        if self.tokens is not None:
            blocks = -(-self.tokens // block_size)
        else:
            blocks = self.bytes // (bytes_per_token * block_size)
        return max(1, blocks) * block_size

    def in_my_unit(self, tokens: int, bytes_per_token: int) -> str:
        """`tokens` written the way this budget was, rounded up: "1,616 tokens" or "238.29MB"."""
        if self.tokens is not None or self.unit.lower() not in UNITS:
            return f"{tokens:,} tokens"
        amount = math.ceil(tokens * bytes_per_token * 100 / UNITS[self.unit.lower()]) / 100
        return f"{amount:,.2f}".rstrip("0").rstrip(".") + self.unit

    def __str__(self) -> str:
        if self.tokens is not None:
            return f"{self.tokens} tokens"
        return format_bytes(self.bytes)


def parse_kv_budget(value: int | str) -> KvBudget:
    """Raise ValueError with a hint when `value` is neither a token count nor a size."""
    if isinstance(value, bool):
        raise ValueError("expected a token count like 20000 or a size like 8GB")
    if isinstance(value, int):
        return _positive(KvBudget(tokens=value), value)
    match = _PATTERN.match(str(value))
    if not match:
        raise ValueError(f"{value!r} is not a token count like 20000 or a size like 8GB")
    number, unit = float(match.group(1)), match.group(2).lower()
    if unit in ("", "tok", "token", "tokens"):
        return _positive(KvBudget(tokens=int(number)), value)
    if unit not in UNITS:
        raise ValueError(f"unknown unit {match.group(2)!r} in {value!r}; use B, KB, MB, GB, GiB or tokens")
    return _positive(KvBudget(bytes=int(round(number * UNITS[unit])), unit=match.group(2)), value)


def parse_card_size(value: str) -> int:
    """A card's memory in bytes, written as a size like 16GB or 16GiB; ValueError with a hint otherwise."""
    budget = parse_kv_budget(value)
    if budget.bytes is None:
        raise ValueError(f"{value!r} is a token count; give the card's memory as a size like 16GB or 16GiB")
    return budget.bytes


def min_pool_tokens(trunk_tokens: int, longest_prompt: int, block_size: int) -> int:
    """The smallest KV pool that holds the pinned trunk and one agent's prompt plus its first new
    token. The agent shares the trunk's full blocks; from the trunk's last partial block on, its
    blocks are its own, plus one spare: where agents' prompts share part of a block, the scheduler
    admits the next only once the block it copies that part into fits too (engine/scheduler.py):

        trunk (pinned)  [ full ][ full ][ part ]
        agent           [ full ][ full ][ own  ][ own ... up to prompt + 1 ] + [ copy ]
    """
    trunk_blocks = -(-trunk_tokens // block_size)
    own_blocks = -(-(longest_prompt + 1) // block_size) - trunk_tokens // block_size
    return (trunk_blocks + own_blocks + 1) * block_size


def run_sequences(agents: int) -> int:
    """The sequences a run of `agents` agents holds at once: each agent's, and the trunk's (kept, pinned): what a
    GPU engine sizes its profile step and a hybrid model's state reserve by."""
    return agents + 1


def format_bytes(n: int | float) -> str:
    """Decimal units, two decimals, the way the article writes them: 0.59 GB."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"


def _positive(budget: KvBudget, raw) -> KvBudget:
    amount = budget.bytes if budget.bytes is not None else budget.tokens
    if amount <= 0:
        raise ValueError(f"{raw!r} must be more than zero")
    return budget
