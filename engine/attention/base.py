"""The attention interface the model depends on: a step's `AttentionBatch`, and the `AttentionBackend`
that plans it once and then attends in every layer.

    runner:  batch = AttentionBatch(...)        where this step's tokens go, what they attend to
             backend.plan(batch)                once a step: the cascade split, as device tensors
    model:   backend.forward(q, k, v, layer, batch)   in every layer: write K/V, attend

The model never names a kernel: which rows query is said by the batch (`queries`), and how the
shared trunk and the private tails are split is the plan's business.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal, Protocol

import torch

from engine.attention.plan import StepPlan


@dataclass(slots=True)
class AttentionBatch:
    """Where this step's tokens go and what they attend to.

    queries: "all", every new token queries (the layers of a prefill); "last", only each sequence's
    last new token does (every layer of a decode step, and a prefill's last layer, whose other rows
    nothing reads). Every new token's K/V is written either way.
    """

    is_prefill: bool                        # prompt chunks run in this step (beside decode rows, if num_decode)
    slot_mapping: torch.Tensor              # [tokens] flat KV slot of each new token
    context_lens: list[int]                 # tokens in each sequence's context after this step
    query_lens: list[int]                   # new tokens per sequence
    block_tables: list[list[int]]           # each sequence's blocks
    last_rows: torch.Tensor | None = None   # prefill: the row of each sequence's last new token in the step
    queries: Literal["all", "last"] = "all"
    num_decode: int = 0                     # the first sequences decode one token each (a mixed step)
    plan: StepPlan | None = None            # set by AttentionBackend.plan

    def last_tokens(self) -> AttentionBatch:
        """This batch with only each sequence's last new token querying (a prefill's last layer)."""
        return self if self.queries == "last" else replace(self, queries="last")

    @property
    def decode_split(self) -> int | None:
        """In a mixed step, the row where decode rows end and prompt rows begin (among the query rows
        and among all rows alike: decode rows come first); None in a decode-only or prefill-only step."""
        return self.num_decode if self.is_prefill and self.num_decode else None

    @property
    def query_rows(self) -> torch.Tensor | None:
        """The rows of this step's tokens whose queries attend; None: every row."""
        return self.last_rows if self.queries == "last" else None


class AttentionBackend(Protocol):
    """Attention over the paged KV pool the backend holds (engine.attention.cascade implements it)."""

    name: str   # the kernel set, as SWARM_ATTENTION_BACKEND names it

    def use_cascade(self, on: bool) -> None:
        """Shared prefixes read once for the rows that share them, or not at all, from the next plan."""

    def use_prompt_attention(self, precision: str) -> None:
        """Prompt rows' attention products in `precision` ("bfloat16" or "float32", engine.prompt_matmul's
        choose_attention) in steps whose matmuls take bfloat16, where the kernel set has such products."""

    def prompt_attention(self) -> str:
        """The precision prompt rows' attention products take in steps whose matmuls take bfloat16."""

    def use_decode_attention(self, precision: str) -> None:
        """Last-token rows' attention products (decode steps, a prefill's last layer) in `precision` ("bfloat16"
        or "float32", engine.prompt_matmul's choose_decode_attention), where the kernel set has such products."""

    def decode_attention(self) -> str:
        """The precision last-token rows' attention products take."""

    def plan(self, batch: AttentionBatch) -> None:
        """Once a step, before the model runs: the cascade split of `batch` (shared prefixes and private
        tables for the last-token queries, prefill groups over a cached trunk), stored on `batch.plan`."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int,
                batch: AttentionBatch) -> torch.Tensor:
        """Writes this step's k, v ([tokens, kv_heads, dim]) into layer `layer`'s cache, then attends
        with q ([rows, heads, dim]: `batch.query_rows`' queries); returns [rows, heads, dim] in q's dtype."""
