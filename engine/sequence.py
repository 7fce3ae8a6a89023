"""One request's state: its tokens, how many have KV written, and its block table."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from enum import Enum

from engine.sampling import SamplingParams


class SequenceStatus(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PAUSED = "paused"      # a finished turn whose KV is kept so the caller can extend it
    FINISHED = "finished"


_ids = itertools.count()


@dataclass(slots=True)
class Sequence:
    token_ids: list[int]
    params: SamplingParams
    request_id: str = ""
    seq_id: int = field(default_factory=lambda: next(_ids))
    status: SequenceStatus = SequenceStatus.WAITING
    num_prompt_tokens: int = 0
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    keep_kv: bool = False
    prefill_only: bool = False
    arrival: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self):
        if not self.request_id:
            self.request_id = str(self.seq_id)
        if not self.num_prompt_tokens:
            self.num_prompt_tokens = len(self.token_ids)

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_uncomputed_tokens(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status == SequenceStatus.FINISHED
