"""The KV budget a card leaves once the weights and the runtime have their share (`inspect-prefix --card`):

    KV budget       = card - weights - runtime reserve - linear state (a hybrid model's: Qwen3.5)
    runtime reserve = RUNTIME_RESERVE_BYTES (1 GiB, engine.options: the GPU driver's context with the
                      kernels loaded, workspaces, fragmentation, logits; the engine reserves the same)
                    + the activations of one prefill step (the engine's max_num_batched_tokens, 2,048):
                      tokens x (2 x hidden + 3 x intermediate + 2 x (q width + 2 x kv width)) x dtype bytes

The activation term estimates from the config what the engine measures at start (engine.kv.sizing's
profile step): what one step holds beside the weights and the KV pool at its peak, the residual
stream and its normed copy (2 x hidden), the MLP's gate, up and their product (3 x intermediate),
and q, k, v with their rotated copies (2 x (q + 2 x kv width)). Nothing holds every layer's
activations at once: a layer's are freed before the next one's are made. It leaves out what
attention materializes over a long context, which the engine's profile counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine import RUNTIME_RESERVE_BYTES
from swarm.spec.kv_budget import format_bytes, run_sequences

if TYPE_CHECKING:
    from engine import ModelConfig, WeightMemory


class CardTooSmall(ValueError):
    """The card holds no KV cache beside the weights and the runtime reserve."""


@dataclass(frozen=True, slots=True)
class CardBudget:
    card_bytes: int
    weights: WeightMemory
    runtime_bytes: int
    activation_bytes: int
    prefill_tokens: int
    state_bytes: int = 0     # a hybrid's linear state for the run's sequences
    state_slots: int = 0

    @property
    def reserve_bytes(self) -> int:
        return self.runtime_bytes + self.activation_bytes

    @property
    def budget_bytes(self) -> int:
        return self.card_bytes - self.weights.total_bytes - self.reserve_bytes - self.state_bytes

    def to_json(self, bytes_per_token: int) -> dict:
        return {"card_bytes": self.card_bytes, "weights_bytes": self.weights.total_bytes,
                "reserve_bytes": self.reserve_bytes, "runtime_bytes": self.runtime_bytes,
                "activation_bytes": self.activation_bytes, "prefill_tokens": self.prefill_tokens,
                "state_bytes": self.state_bytes, "state_slots": self.state_slots,
                "budget_bytes": self.budget_bytes, "budget_tokens": self.budget_bytes // bytes_per_token}


def card_budget(card_bytes: int, weights: WeightMemory, config: ModelConfig, dtype_bytes: int,
                agents: int = 1) -> CardBudget:
    """What `card_bytes` leaves for KV beside a run of `agents` agents; CardTooSmall (one line, what to change)
    when it leaves nothing."""
    from engine import EngineOptions, state_reserve_bytes, state_reserve_slots

    tokens = EngineOptions().max_num_batched_tokens
    sequences = run_sequences(agents)
    state = state_reserve_bytes(config, sequences, dtype_bytes)
    card = CardBudget(card_bytes, weights, RUNTIME_RESERVE_BYTES,
                      prefill_activation_bytes(config, dtype_bytes, tokens), tokens, state,
                      state_reserve_slots(config, sequences))
    if card.budget_bytes <= 0:
        state_note = f" and {agents} agents' linear state ({format_bytes(state)})" if state else ""
        raise CardTooSmall(f"{format_bytes(card_bytes)} holds no KV cache beside the weights "
                         f"({format_bytes(weights.total_bytes)}, {weights.label}), the runtime reserve "
                         f"({format_bytes(card.reserve_bytes)}){state_note}; give a bigger card, fewer agents, "
                         "or smaller weights with --weights")
    return card


def prefill_activation_bytes(config: ModelConfig, dtype_bytes: int, tokens: int) -> int:
    """The most one prefill step of `tokens` tokens holds in activations at once (see the module's doc)."""
    q_width, kv_width = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    per_token = 2 * config.hidden_size + 3 * config.intermediate_size + 2 * (q_width + 2 * kv_width)
    return tokens * per_token * dtype_bytes
