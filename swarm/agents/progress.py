"""What an agent has done so far, whichever engine runs it: its state, turns, tokens, tool calls
and times, and the `AgentEvent`s that record each step for the transcript and the views.

`Agent` (the local engine, one sequence per agent) and `RemoteAgent` (an OpenAI-compatible
server, one chat request per turn) both build on `AgentProgress`, so the dashboard, the summary
and the transcript read the same fields and the same events from either.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Callable

from swarm.agents.throughput import Throughput
from swarm.agents.tool_calls import ParseResult, ToolCall
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
class ToolJob:
    """A turn's calls, run off the loop's thread; `results` is filled in by `run()`."""

    turn: int
    calls: list[ToolCall]
    errors: list[str]
    end_token: int | None
    results: list[ToolResult] = field(default_factory=list)
    seconds: float = 0.0

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


class AgentProgress:
    def __init__(self, name: str, toolbox: ToolBox, emit: Callable[[AgentEvent], None],
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.toolbox = toolbox
        self.emit = emit
        self.clock = clock
        self.state = AgentState.QUEUED
        self.turn = 0
        self.end_reason = ""
        self.error = ""
        self.generated_tokens = 0
        self.tool_tokens = 0
        self.tool_calls = 0
        self.tool_seconds = 0.0
        self.last_tool = ""
        self.started_at: float | None = None
        self.first_token_at: float | None = None
        self.ended_at: float | None = None
        self.throughput = Throughput()

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def context_tokens(self) -> int:
        raise NotImplementedError

    @property
    def seconds(self) -> float:
        if self.started_at is None:
            return 0.0
        return (self.ended_at or self.clock()) - self.started_at

    def limit_reason(self, parsed: ParseResult, max_turns: int, max_tokens: int, cut: str | None = None) -> str | None:
        """Why the agent ends after this turn, or None when it goes on to run the calls.
        `cut`: the limit that cut the turn short (see `cut_reason`); a turn without calls is a
        final answer only when the model itself stopped."""
        if not parsed.calls and not parsed.errors:
            return cut or "final_answer"
        if self.turn >= max_turns:
            return "max_turns"
        if self.generated_tokens >= max_tokens:
            return "max_tokens"
        return None

    def cut_reason(self, finish_reason: str | None, max_tokens: int) -> str | None:
        """What cut a turn that finished with `length`: the agent's token limit (`max_tokens`),
        else the turn's own, sampling.max_tokens (`length`); None when the model stopped."""
        if finish_reason != "length":
            return None
        return "max_tokens" if self.generated_tokens >= max_tokens else "length"

    def record_partial_turn(self, content: str, tokens: int, reason: str) -> None:
        """The turn the run stopped (wall time, a signal): it counts, marked `partial`."""
        self.turn += 1
        self._event("assistant", turn=self.turn, content=content, tokens=tokens, finish_reason=reason,
                    partial=True, context_tokens=self.context_tokens)

    def announce_calls(self, parsed: ParseResult) -> None:
        for call in parsed.calls:
            self._event("tool_call", turn=self.turn, name=call.name, arguments=call.arguments)
        for error in parsed.errors:
            self._event("tool_error", turn=self.turn, error=error)
        self.last_tool = parsed.calls[-1].name if parsed.calls else "(malformed)"

    def record_results(self, job: ToolJob, appended_tokens: int | None) -> None:
        """appended_tokens: what this turn's results add to the context (None: not known here)."""
        self.tool_seconds += job.seconds
        self.tool_calls += len(job.calls)
        for result in job.results:
            self._event("tool_result", turn=job.turn, name=result.name, ok=result.ok, output=result.output,
                        truncated=result.truncated, seconds=round(job.seconds, 4), appended_tokens=appended_tokens)

    def record_end(self, state: AgentState, reason: str, error: str = "") -> None:
        self.state = state
        self.end_reason = reason
        self.error = error
        self.ended_at = self.clock()
        data = dict(status=state.value, reason=reason, turns=self.turn, generated_tokens=self.generated_tokens,
                    tool_calls=self.tool_calls, context_tokens=self.context_tokens, seconds=round(self.seconds, 3),
                    **self.end_details())
        if error:
            data["error"] = error
        self._event("end", **data)

    def end_details(self) -> dict:
        """More figures for the end event, where a backend has them."""
        return {}

    def _event(self, kind: str, **data) -> None:
        self.emit(AgentEvent(self.name, kind, data, self.clock()))
