"""One agent: a conversation that lives in one engine sequence, turn after turn.

    queued -> prefill -> decoding -> tool -> prefill -> decoding -> ... -> done | error | interrupted
               (prompt)   (a turn)    (worker thread)  (results)

A turn ends when the model stops. Its text is parsed for tool calls: none is the final answer;
calls (and malformed calls, as error messages) go to a worker thread, so the other agents keep
decoding meanwhile. The results are appended to the same sequence with `engine.extend`: the
history is never re-rendered, only the new tokens are computed. Every step is an `AgentEvent`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Callable, Protocol

from engine.sampling import SamplingParams
from engine.sequence import Sequence
from engine.tokenizer import Tokenizer
from swarm.throughput import Throughput
from swarm.tool_calls import ToolCall, parse_tool_calls
from swarm.tool_response import ToolResponseFormat
from swarm.tools import ToolBox, ToolResult


class AgentState(str, Enum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODING = "decoding"
    TOOL = "tool"
    DONE = "done"
    ERROR = "error"
    INTERRUPTED = "interrupted"


ENDED = (AgentState.DONE, AgentState.ERROR, AgentState.INTERRUPTED)


class Engine(Protocol):
    tokenizer: Tokenizer
    eos_token_ids: set[int]

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str = "",
                    keep_kv: bool = False) -> Sequence: ...
    def extend(self, seq: Sequence, token_ids: list[int], params: SamplingParams | None = None) -> None: ...
    def release(self, seq: Sequence) -> None: ...


@dataclass(slots=True)
class AgentEvent:
    agent: str
    kind: str  # message, assistant, tool_call, tool_error, tool_result, prefilled, end
    data: dict
    time: float


@dataclass(slots=True)
class AgentLimits:
    max_turns: int
    max_tokens: int
    """Tokens the agent may generate over all its turns."""
    max_context: int
    """Tokens its sequence may hold: the model's context length."""


@dataclass(slots=True)
class ToolJob:
    """A turn's calls, run off the main thread; `results` is filled in by `run()`."""

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


class Agent:
    def __init__(self, name: str, prompt_ids: list[int], toolbox: ToolBox, responses: ToolResponseFormat,
                 params: SamplingParams, limits: AgentLimits, emit: Callable[[AgentEvent], None],
                 clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.prompt_ids = list(prompt_ids)
        self.toolbox = toolbox
        self.responses = responses
        self.params = params
        self.limits = limits
        self.emit = emit
        self.clock = clock
        self.seq: Sequence | None = None
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

    # --- the protocol the orchestrator drives ---------------------------------------------

    def start(self, engine: Engine, messages: list[dict] = ()) -> None:
        """Submit the prompt; `messages` (system, first user message) go to the transcript."""
        self.started_at = self.clock()
        for message in messages:
            self._event("message", **message)
        if len(self.prompt_ids) >= self.limits.max_context:
            self._end(engine, AgentState.ERROR, "context_full",
                      f"the prompt has {len(self.prompt_ids)} tokens, the model's context is "
                      f"{self.limits.max_context}; shorten the rules, tools or task")
            return
        self.seq = engine.add_request(self.prompt_ids, self._turn_params(len(self.prompt_ids)),
                                      request_id=self.name, keep_kv=True)
        self.state = AgentState.PREFILL

    def on_prefilled(self) -> None:
        if self.state is AgentState.PREFILL:
            self.state = AgentState.DECODING
            self._event("prefilled", context_tokens=self.seq.num_computed_tokens)  # tokens with KV now

    def on_token(self, now: float) -> None:
        self.generated_tokens += 1
        self.throughput.add(now)
        if self.first_token_at is None:
            self.first_token_at = now

    def on_turn_end(self, engine: Engine) -> ToolJob | None:
        """The model stopped: end the agent, or return the tool work its turn asks for."""
        seq = self.seq
        if seq.finish_reason == "error":
            self._end(engine, AgentState.ERROR, "error", seq.error or "the engine failed this request")
            return None
        self.turn += 1
        self.state = AgentState.TOOL
        text = engine.tokenizer.decode(seq.output_token_ids)
        self._event("assistant", turn=self.turn, content=text, tokens=seq.num_output_tokens,
                    finish_reason=seq.finish_reason, context_tokens=self.context_tokens)
        parsed = parse_tool_calls(text)
        if not parsed.calls and not parsed.errors:
            return self._end(engine, AgentState.DONE, "final_answer")
        if self.turn >= self.limits.max_turns:
            return self._end(engine, AgentState.DONE, "max_turns")
        if self.generated_tokens >= self.limits.max_tokens:
            return self._end(engine, AgentState.DONE, "max_tokens")
        if len(seq) >= self.limits.max_context - 1:
            return self._end(engine, AgentState.DONE, "context_full")
        for call in parsed.calls:
            self._event("tool_call", turn=self.turn, name=call.name, arguments=call.arguments)
        for error in parsed.errors:
            self._event("tool_error", turn=self.turn, error=error)
        self.last_tool = parsed.calls[-1].name if parsed.calls else "(malformed)"
        last = seq.token_ids[-1]
        end_token = last if last in engine.eos_token_ids or last in seq.params.stop_token_ids else None
        return ToolJob(self.turn, parsed.calls, parsed.errors, end_token)

    def resume(self, engine: Engine, job: ToolJob) -> None:
        """The tools of `job` ran: append their results and let the model go on."""
        if self.state is not AgentState.TOOL:
            return  # ended while its tools ran (wall time, Ctrl-C)
        self.tool_seconds += job.seconds
        self.tool_calls += len(job.calls)
        outputs = [result.output for result in job.results] + job.errors
        ids = self.responses.continuation_ids(outputs, job.end_token)
        context = len(self.seq) + len(ids)
        fits = context < self.limits.max_context - 1
        for result in job.results:  # appended_tokens: what this turn's results add to the context
            self._event("tool_result", turn=job.turn, name=result.name, ok=result.ok, output=result.output,
                        truncated=result.truncated, seconds=round(job.seconds, 4),
                        appended_tokens=len(ids) if fits else 0)
        if not fits:
            self._end(engine, AgentState.DONE, "context_full")
            return
        self.tool_tokens += len(ids)
        engine.extend(self.seq, ids, self._turn_params(context))
        self.state = AgentState.PREFILL

    def stop(self, engine: Engine, reason: str) -> None:
        """End early (wall time, Ctrl-C), keeping what the model wrote of its current turn."""
        if self.state in ENDED:
            return
        seq = self.seq
        if seq is not None and self.state is AgentState.DECODING and seq.num_output_tokens:
            self._event("assistant", turn=self.turn + 1, content=engine.tokenizer.decode(seq.output_token_ids),
                        tokens=seq.num_output_tokens, finish_reason=reason, partial=True,
                        context_tokens=self.context_tokens)
        state = AgentState.INTERRUPTED if reason == "interrupted" else AgentState.DONE
        self._end(engine, state, reason)

    # --- what the dashboard and the summary read --------------------------------------------

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def display_state(self) -> AgentState:
        if self.state is AgentState.PREFILL and self.seq is not None and not self.seq.num_computed_tokens:
            return AgentState.QUEUED
        return self.state

    @property
    def context_tokens(self) -> int:
        return len(self.seq) if self.seq is not None else len(self.prompt_ids)

    @property
    def seconds(self) -> float:
        if self.started_at is None:
            return 0.0
        return (self.ended_at or self.clock()) - self.started_at

    # --- inside -----------------------------------------------------------------------------

    def _turn_params(self, context: int) -> SamplingParams:
        room = min(self.limits.max_context - context, self.limits.max_tokens - self.generated_tokens)
        return replace(self.params, max_tokens=max(1, min(self.params.max_tokens, room)))

    def _end(self, engine: Engine, state: AgentState, reason: str, error: str = "") -> None:
        self.state = state
        self.end_reason = reason
        self.error = error
        self.ended_at = self.clock()
        if self.seq is not None:
            engine.release(self.seq)
        data = dict(status=state.value, reason=reason, turns=self.turn, generated_tokens=self.generated_tokens,
                    tool_calls=self.tool_calls, context_tokens=self.context_tokens, seconds=round(self.seconds, 3))
        if error:
            data["error"] = error
        self._event("end", **data)

    def _event(self, kind: str, **data) -> None:
        self.emit(AgentEvent(self.name, kind, data, self.clock()))
