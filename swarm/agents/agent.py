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
from dataclasses import dataclass, replace
from typing import Callable, Protocol

from engine import SamplingParams, Sequence, Tokenizer
from swarm.agents.progress import ENDED, AgentEvent, AgentProgress, AgentState, ToolJob
from swarm.agents.tool_calls import parse_tool_calls
from swarm.agents.tool_response import ToolResponseFormat
from swarm.agents.tools import ToolBox

__all__ = ["ENDED", "Agent", "AgentEvent", "AgentLimits", "AgentState", "Engine", "ToolJob"]


class Engine(Protocol):
    tokenizer: Tokenizer
    eos_token_ids: set[int]

    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str = "",
                    keep_kv: bool = False) -> Sequence: ...
    def extend(self, seq: Sequence, token_ids: list[int], params: SamplingParams | None = None) -> None: ...
    def release(self, seq: Sequence) -> None: ...


@dataclass(slots=True)
class AgentLimits:
    max_turns: int
    max_tokens: int
    """Tokens the agent may generate over all its turns."""
    max_context: int
    """Tokens its sequence may hold: the model's context length."""


class Agent(AgentProgress):
    def __init__(self, name: str, prompt_ids: list[int], toolbox: ToolBox, responses: ToolResponseFormat,
                 params: SamplingParams, limits: AgentLimits, emit: Callable[[AgentEvent], None],
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(name, toolbox, emit, clock)
        self.prompt_ids = list(prompt_ids)
        self.responses = responses
        self.params = params
        self.limits = limits
        self.seq: Sequence | None = None

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
        reason = self.limit_reason(parsed, self.limits.max_turns, self.limits.max_tokens, self._cut_reason(seq))
        if reason is None and self._context_is_full(seq):
            reason = "context_full"
        if reason is not None:
            return self._end(engine, AgentState.DONE, reason)
        self.announce_calls(parsed)
        last = seq.token_ids[-1]
        end_token = last if last in engine.eos_token_ids or last in seq.params.stop_token_ids else None
        return ToolJob(self.turn, parsed.calls, parsed.errors, end_token)

    def resume(self, engine: Engine, job: ToolJob) -> None:
        """The tools of `job` ran: append their results and let the model go on."""
        if self.state is not AgentState.TOOL:
            return  # ended while its tools ran (wall time, Ctrl-C)
        ids = self.responses.continuation_ids(job.outputs, job.end_token)
        context = len(self.seq) + len(ids)
        fits = context < self.limits.max_context - 1
        self.record_results(job, appended_tokens=len(ids) if fits else 0)
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
            self.record_partial_turn(engine.tokenizer.decode(seq.output_token_ids), seq.num_output_tokens, reason)
        state = AgentState.INTERRUPTED if reason == "interrupted" else AgentState.DONE
        self._end(engine, state, reason)

    # --- what the dashboard and the summary read --------------------------------------------

    @property
    def display_state(self) -> AgentState:
        if self.state is AgentState.PREFILL and self.seq is not None and not self.seq.num_computed_tokens:
            return AgentState.QUEUED
        return self.state

    @property
    def context_tokens(self) -> int:
        return len(self.seq) if self.seq is not None else len(self.prompt_ids)

    # --- inside -----------------------------------------------------------------------------

    def _cut_reason(self, seq: Sequence) -> str | None:
        if seq.finish_reason == "length" and self._context_is_full(seq):
            return "context_full"
        return self.cut_reason(seq.finish_reason, self.limits.max_tokens)

    def _context_is_full(self, seq: Sequence) -> bool:
        return len(seq) >= self.limits.max_context - 1

    def _turn_params(self, context: int) -> SamplingParams:
        room = min(self.limits.max_context - context, self.limits.max_tokens - self.generated_tokens)
        return replace(self.params, max_tokens=max(1, min(self.params.max_tokens, room)))

    def _end(self, engine: Engine, state: AgentState, reason: str, error: str = "") -> None:
        if self.seq is not None:
            engine.release(self.seq)
        self.record_end(state, reason, error)
