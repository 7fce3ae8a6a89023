"""One agent: a conversation with the model, turn after turn, whichever backend carries it.

    queued -> prefill -> decoding -> tool -> prefill -> decoding -> ... -> done | error | interrupted
              (turn      (tokens     (worker    (results
               sent)      arrive)     thread)    sent)

The agent is the state machine only. Its backend (swarm/run/backend.py) carries each turn to the
model and reports back in `TurnEvent`s; `handle` turns them into state, counts and `AgentEvent`s
for the transcript and the views. A finished turn's text (or the server's structured calls) is
parsed for tool calls: none is the final answer; calls, and malformed calls as error messages,
become a `ToolJob` that the run runs in a worker thread while the other agents go on.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

from engine import SamplingParams
from swarm.agents.progress import ENDED, AgentEvent, AgentState, PartialTurn, PromptUsage, Reply, ToolJob, TurnEvent
from swarm.agents.throughput import Throughput
from swarm.agents.tool_calls import ParseResult, parse_structured_call, parse_tool_calls
from swarm.agents.tools import ToolBox

__all__ = ["ENDED", "Agent", "AgentEvent", "AgentLimits", "AgentState", "ToolJob"]


@dataclass(slots=True)
class AgentLimits:
    max_turns: int
    max_tokens: int
    """Tokens the agent may generate over all its turns."""
    max_context: int | None = None
    """Tokens its conversation may hold, where the backend knows it (the model's context length);
    a server enforces its own."""


class Agent:
    def __init__(self, name: str, toolbox: ToolBox, params: SamplingParams, limits: AgentLimits,
                 emit: Callable[[AgentEvent], None], clock: Callable[[], float] = time.monotonic,
                 prompt_tokens: int | None = None, usage: bool = False):
        self.name = name
        self.toolbox = toolbox
        self.params = params
        self.limits = limits
        self.emit = emit
        self.clock = clock
        self.state = AgentState.QUEUED
        self.queued = False
        """The turn sent waits for the engine to admit it: shown as queued."""
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
        self.prompt_tokens = prompt_tokens
        """The first turn's prompt: counted before it is sent (swarm's engine), or by the first usage."""
        self.context = prompt_tokens or 0
        """The conversation's tokens up to the turn in flight, as last counted."""
        self.turn_tokens = 0
        """Tokens of the turn in flight that have arrived."""
        self.usage = PromptUsage() if usage else None
        """What the server's usage says of the prompts; None where the backend sends no usage."""

    # --- what the run does with it ----------------------------------------------------------

    def start(self, messages: list[dict]) -> None:
        """The run begins: `messages` (system, first user message) go to the transcript."""
        self.started_at = self.clock()
        for message in messages:
            self._event("message", **message)

    def on_submitted(self) -> None:
        self.state = AgentState.PREFILL

    def handle(self, event: TurnEvent, now: float) -> ToolJob | None:
        """What the backend reports of this agent's turn; returns the tool work a finished turn asks for."""
        if self.ended:
            return None
        if event.kind == "queued":
            self.queued = event.queued
        elif event.kind == "prefilled":
            self._prefilled(event.context_tokens)
        elif event.kind == "tokens":
            self._add_tokens(event.tokens, now)
        elif event.kind == "turn_end":
            return self._end_turn(event.reply)
        elif event.kind == "failed":
            self.fail(event.reason, event.error)
        else:
            raise AssertionError(f"unknown turn event {event.kind!r}")
        return None

    def on_results(self, job: ToolJob, appended: int | None) -> None:
        """The results of `job` went back to the model, adding `appended` tokens (None: counted by
        the next turn's usage); the next turn is under way."""
        self.record_results(job, appended)
        if appended:
            self.tool_tokens += appended
            self.context += appended
        self.state = AgentState.PREFILL

    def fail(self, reason: str, error: str = "") -> None:
        """The backend could not run the turn: `context_full` (an agent that had turns is done) or `error`."""
        state = AgentState.DONE if reason == "context_full" and self.turn else AgentState.ERROR
        self.record_end(state, reason, error)

    def cut_turn(self, partial: PartialTurn | None, reason: str) -> None:
        """The run stops the turn in flight (wall time, a signal): what the model wrote of it counts, marked partial."""
        if partial is None or self.state is not AgentState.DECODING or not partial.tokens:
            return
        self.turn += 1
        self._event("assistant", turn=self.turn, content=partial.text, tokens=partial.tokens, finish_reason=reason,
                    partial=True, context_tokens=self.context_tokens)

    def stop(self, reason: str) -> None:
        """End early: wall time, or interrupted (Ctrl-C, SIGTERM)."""
        if not self.ended:
            self.record_end(AgentState.INTERRUPTED if reason == "interrupted" else AgentState.DONE, reason)

    def turn_params(self, context: int | None = None) -> SamplingParams:
        """The next turn's sampling: its max_tokens capped by what is left of the agent's tokens and,
        where the backend knows the context (`context` tokens sent), of the model's context."""
        room = self.limits.max_tokens - self.generated_tokens
        if context is not None and self.limits.max_context is not None:
            room = min(room, self.limits.max_context - context)
        return replace(self.params, max_tokens=max(1, min(self.params.max_tokens, room)))

    def record_end(self, state: AgentState, reason: str, error: str = "") -> None:
        self.state = state
        self.end_reason = reason
        self.error = error
        self.ended_at = self.clock()
        data = dict(status=state.value, reason=reason, turns=self.turn, generated_tokens=self.generated_tokens,
                    tool_calls=self.tool_calls, context_tokens=self.context_tokens, seconds=round(self.seconds, 3))
        if self.usage is not None:
            data.update(prompt_tokens=self.usage.prompt_tokens_total, cached_tokens=self.usage.cached_tokens_total)
        if error:
            data["error"] = error
        self._event("end", **data)

    def record_results(self, job: ToolJob, appended_tokens: int | None) -> None:
        """appended_tokens: what this turn's results add to the context (None: not known here)."""
        self.tool_seconds += job.seconds
        self.tool_calls += len(job.calls)
        for result in job.results:
            self._event("tool_result", turn=job.turn, name=result.name, ok=result.ok, output=result.output,
                        truncated=result.truncated, seconds=round(job.seconds, 4), appended_tokens=appended_tokens)

    # --- what the dashboard and the summary read --------------------------------------------

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def display_state(self) -> AgentState:
        return AgentState.QUEUED if self.state is AgentState.PREFILL and self.queued else self.state

    @property
    def context_tokens(self) -> int:
        """The conversation, with what has arrived of the turn in flight; on a server, before the
        first turn's usage, only what has streamed."""
        return self.context + self.turn_tokens

    @property
    def seconds(self) -> float:
        if self.started_at is None:
            return 0.0
        return (self.ended_at or self.clock()) - self.started_at

    # --- a turn -----------------------------------------------------------------------------

    def _prefilled(self, context_tokens: int | None) -> None:
        if self.state is not AgentState.PREFILL:
            return
        self.state = AgentState.DECODING
        self._event("prefilled", **({"turn": self.turn + 1} if context_tokens is None
                                    else {"context_tokens": context_tokens}))

    def _add_tokens(self, count: int, now: float) -> None:
        self.generated_tokens += count
        self.turn_tokens += count
        self.throughput.add(now, count)
        if self.first_token_at is None:
            self.first_token_at = now

    def _end_turn(self, reply: Reply) -> ToolJob | None:
        self.turn += 1
        self.state = AgentState.TOOL
        self.generated_tokens += reply.tokens - self.turn_tokens  # a server's usage replaces the pieces counted
        self.turn_tokens = 0
        self._count_context(reply)
        self._event("assistant", turn=self.turn, content=reply.text, tokens=reply.tokens,
                    finish_reason=reply.finish_reason, context_tokens=self.context_tokens, **self._usage_fields(reply),
                    **({"tool_calls": reply.tool_calls} if reply.tool_calls else {}))
        parsed, call_ids = self._parse_calls(reply)
        reason = self._end_reason(parsed, reply.finish_reason)
        if reason is not None:
            self.record_end(AgentState.DONE, reason)
            return None
        self._announce_calls(parsed)
        return ToolJob(self.turn, parsed.calls, parsed.errors, reply.end_token, call_ids=call_ids)

    def _count_context(self, reply: Reply) -> None:
        if reply.prompt_tokens is not None:
            self._count_usage(reply)
        elif reply.context_tokens is not None:
            self.context = reply.context_tokens
        else:
            self.context += reply.tokens

    def _count_usage(self, reply: Reply) -> None:
        assert self.usage is not None, "a backend that sends usage says so (BackendFacts.cached_tokens)"
        if self.prompt_tokens is None:
            self.prompt_tokens = reply.prompt_tokens
        else:  # what the last turn's results (and their chat framing) added to the context
            self.tool_tokens += max(0, reply.prompt_tokens - self.context)
        self.usage.add(reply.prompt_tokens, reply.cached_tokens)
        self.context = reply.prompt_tokens + reply.tokens

    def _usage_fields(self, reply: Reply) -> dict:
        if self.usage is None:
            return {}
        return {"prompt_tokens": reply.prompt_tokens, "cached_tokens": reply.cached_tokens}

    def _parse_calls(self, reply: Reply) -> tuple[ParseResult, list[str]]:
        """The calls and the ids their results answer: the server's, or made up for text calls."""
        if not reply.tool_calls:
            parsed = parse_tool_calls(reply.text)
            count = len(parsed.calls) + len(parsed.errors)
            return parsed, [f"call_{self.turn}_{number}" for number in range(1, count + 1)]
        parsed, call_ids, error_ids = ParseResult(content=reply.text), [], []
        for number, call in enumerate(reply.tool_calls, start=1):
            one = parse_structured_call(call["function"]["name"], call["function"]["arguments"], number)
            parsed.calls += one.calls
            parsed.errors += one.errors
            (call_ids if one.calls else error_ids).append(call["id"] or f"call_{self.turn}_{number}")
        return parsed, call_ids + error_ids  # results first, then errors: the order of job.outputs

    def _end_reason(self, parsed: ParseResult, finish_reason: str | None) -> str | None:
        """Why the agent ends after this turn, or None when it goes on to run the calls. A turn
        without calls is a final answer only when the model itself stopped."""
        full = self._context_is_full()
        if not parsed.calls and not parsed.errors:
            cut = "context_full" if finish_reason == "length" and full else self._cut_reason(finish_reason)
            return cut or "final_answer"
        if self.turn >= self.limits.max_turns:
            return "max_turns"
        if self.generated_tokens >= self.limits.max_tokens:
            return "max_tokens"
        return "context_full" if full else None

    def _cut_reason(self, finish_reason: str | None) -> str | None:
        """What cut a turn that finished with `length`: the agent's token limit (`max_tokens`),
        else the turn's own, sampling.max_tokens (`length`); None when the model stopped."""
        if finish_reason != "length":
            return None
        return "max_tokens" if self.generated_tokens >= self.limits.max_tokens else "length"

    def _context_is_full(self) -> bool:
        return self.limits.max_context is not None and self.context_tokens >= self.limits.max_context - 1

    def _announce_calls(self, parsed: ParseResult) -> None:
        for call in parsed.calls:
            self._event("tool_call", turn=self.turn, name=call.name, arguments=call.arguments)
        for error in parsed.errors:
            self._event("tool_error", turn=self.turn, error=error)
        self.last_tool = parsed.calls[-1].name if parsed.calls else "(malformed)"

    def _event(self, kind: str, **data) -> None:
        self.emit(AgentEvent(self.name, kind, data, self.clock()))
