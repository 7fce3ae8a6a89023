"""The records an agent's life is made of, whichever backend runs it (swarm/run/backend.py):

    backend -> TurnEvent (queued, prefilled, tokens, turn_end with its Reply, failed) -> Agent
    Agent   -> AgentEvent (message, prefilled, assistant, tool_call, tool_error, tool_result, end)
               -> the transcript and the views
    Agent   -> ToolJob (a turn's calls, run in a worker thread) -> the backend, as the next turn

A backend reports only what it can know: a figure it does not have is None, never 0.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum

from swarm.agents.tool_calls import ToolCall
from swarm.agents.tools import ToolBox, ToolResult


class AgentState(str, Enum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODING = "decoding"
    TOOL = "tool"
    DONE = "done"
    ERROR = "error"
    INTERRUPTED = "interrupted"


ENDED = (AgentState.DONE, AgentState.ERROR, AgentState.INTERRUPTED)


@dataclass(slots=True)
class AgentEvent:
    agent: str
    kind: str  # message, assistant, tool_call, tool_error, tool_result, prefilled, end
    data: dict
    time: float


@dataclass(slots=True)
class Reply:
    """A finished turn, as its backend saw it."""

    text: str
    finish_reason: str | None
    tokens: int
    """Tokens generated: the engine's count, or the server's usage (pieces received without one)."""
    context_tokens: int | None = None
    """The context after the turn, where the backend counts it (swarm's engine)."""
    end_token: int | None = None
    """The stop token that ended the turn, which the next turn's chat framing follows (swarm's engine)."""
    prompt_tokens: int | None = None
    """The turn's prompt, as a server's usage counts it."""
    cached_tokens: int | None = None
    """Of those, the tokens the server found in its prefix cache (None: it does not say)."""
    tool_calls: list[dict] | None = None
    """Calls a server's tool parser found, as its chat message gives them: {"id", "type", "function"}."""


@dataclass(slots=True)
class TurnEvent:
    """What a backend reports of one agent's turn."""

    agent: str
    kind: str  # queued, prefilled, tokens, turn_end, failed
    queued: bool = False
    """queued: the turn waits for the engine to admit it (True) or is being computed (False)."""
    tokens: int = 0
    """tokens: how many arrived."""
    context_tokens: int | None = None
    """prefilled: the tokens with KV now, where the backend knows them (swarm's engine)."""
    reply: Reply | None = None
    """turn_end: the finished turn."""
    reason: str = ""
    """failed: context_full or error."""
    error: str = ""
    """failed: what went wrong, in a line."""


@dataclass(frozen=True, slots=True)
class PartialTurn:
    """What the model wrote of a turn that the run stopped (wall time, a signal)."""

    text: str
    tokens: int


@dataclass(slots=True)
class PromptUsage:
    """What a server's usage said of an agent's prompts, turn after turn."""

    prompt_tokens_total: int = 0
    cached_tokens_total: int | None = None
    """None until the server reports cached tokens (vLLM needs --enable-prompt-tokens-details)."""
    first_cached_tokens: int | None = None
    last_prompt_tokens: int | None = None
    last_cached_tokens: int | None = None

    def add(self, prompt_tokens: int, cached_tokens: int | None) -> None:
        self.prompt_tokens_total += prompt_tokens
        self.last_prompt_tokens, self.last_cached_tokens = prompt_tokens, cached_tokens
        if cached_tokens is None:
            return
        self.cached_tokens_total = (self.cached_tokens_total or 0) + cached_tokens
        if self.first_cached_tokens is None:
            self.first_cached_tokens = cached_tokens


@dataclass(slots=True)
class ToolJob:
    """A turn's calls, run off the loop's thread; `results` is filled in by `run()`."""

    turn: int
    calls: list[ToolCall]
    errors: list[str]
    end_token: int | None
    results: list[ToolResult] = field(default_factory=list)
    seconds: float = 0.0
    call_ids: list[str] = field(default_factory=list)
    """The id each output answers, in the order of `outputs` (a server's, or made up for text calls)."""

    def run(self, toolbox: ToolBox) -> "ToolJob":
        start = time.monotonic()
        self.results = [toolbox.run(call) for call in self.calls]
        self.seconds = time.monotonic() - start
        return self

    def run_safely(self, toolbox: ToolBox) -> "ToolJob":
        """`run`, with a tool that raises reported to the model: never leave an agent waiting forever."""
        try:
            return self.run(toolbox)
        except BaseException as err:
            self.results = [ToolResult(call.name, False, f"error: the tool failed: {err}") for call in self.calls]
            return self

    @property
    def outputs(self) -> list[str]:
        """What goes back to the model: each call's result, then each malformed call's message."""
        return [result.output for result in self.results] + self.errors
