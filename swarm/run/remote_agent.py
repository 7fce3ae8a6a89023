"""One agent on a remote OpenAI-compatible server: its conversation, re-sent in full every turn.

    prefill -> decoding -> tool -> prefill -> decoding -> ... -> done | error | interrupted
    (request   (pieces     (worker
     sent)      arrive)     thread)

Every agent sends the same system message (the trunk's rules) and the same `tools` list in
canonical order; everything volatile is in its first user message. The server's chat template
therefore renders a byte-identical prefix for every agent and its prefix cache hits, and since
messages only grow, each turn also hits on all of the previous one. The usage of each turn
says how many prompt tokens the server found cached.

Tool calls come as structured `tool_calls` (servers with a tool parser) or as `<tool_call>`
text (servers without one); either way each result goes back as a `tool` message.
"""
from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from typing import Callable

from engine import SamplingParams
from swarm.agents.progress import AgentEvent, AgentProgress, AgentState, ToolJob
from swarm.agents.tool_calls import ParseResult, parse_structured_call, parse_tool_calls
from swarm.agents.tools import ToolBox
from swarm.run.openai_client import AssistantReply, ChatClient, ContextFullError, RemoteError
from swarm.spec.schema import LimitsSpec


class RemoteAgent(AgentProgress):
    def __init__(self, name: str, messages: list[dict], tools: list[dict], toolbox: ToolBox,
                 params: SamplingParams, limits: LimitsSpec, emit: Callable[[AgentEvent], None],
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(name, toolbox, emit, clock)
        self.messages = list(messages)
        self.tools = tools
        self.params = params
        self.limits = limits
        self.reply: AssistantReply | None = None
        """The turn in flight."""
        self.stop_reason = ""
        """Why the run cancels this agent's task (wall_time); a bare cancel means Ctrl-C."""
        self.prompt_tokens: int | None = None
        """The first turn's prompt, as the server counted it."""
        self.prompt_tokens_total = 0
        self.cached_tokens_total: int | None = None
        """None until the server reports cached tokens (vLLM needs --enable-prompt-tokens-details)."""
        self.first_cached_tokens: int | None = None
        self.last_prompt_tokens: int | None = None
        self.last_cached_tokens: int | None = None
        self.context = 0
        """Prompt and completion tokens of the last finished turn."""
        self.first_token = asyncio.Event()
        """Set when the server has computed this agent's first prompt (or the agent ended)."""

    async def run(self, client: ChatClient, after: asyncio.Event | None = None) -> None:
        """The whole conversation; it ends the agent whatever happens, and never raises.
        `after`: wait for it before the first request (another agent's first token, so the
        server has the shared prefix cached by then)."""
        self.started_at = self.clock()
        for message in self.messages:
            self._event("message", **message, **({"tools": _names(self.tools)} if message["role"] == "system" else {}))
        try:
            if after is not None:
                await after.wait()
            await self._converse(client)
        except asyncio.CancelledError:
            self.stop(self.stop_reason or "interrupted")
        except ContextFullError as err:
            self.record_end(AgentState.DONE if self.turn else AgentState.ERROR, "context_full", str(err))
        except RemoteError as err:
            self.record_end(AgentState.ERROR, "error", str(err))
        finally:
            self.first_token.set()  # whoever waits on this agent must not wait forever

    def stop(self, reason: str) -> None:
        """End early (wall time, Ctrl-C), keeping what the model wrote of its current turn."""
        if self.ended:
            return
        reply = self.reply
        if reply is not None and self.state is AgentState.DECODING and reply.pieces:
            self.record_partial_turn(reply.content, reply.pieces, reason)
        self.record_end(AgentState.INTERRUPTED if reason == "interrupted" else AgentState.DONE, reason)

    # --- what the dashboard and the summary read --------------------------------------------

    @property
    def display_state(self) -> AgentState:
        return self.state

    @property
    def context_tokens(self) -> int:
        """The conversation as the server last counted it (prompt and reply), plus the turn in
        flight; before the first turn's usage, only what has streamed."""
        return self.context + (self.reply.pieces if self.reply is not None else 0)

    def end_details(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens_total, "cached_tokens": self.cached_tokens_total}

    # --- a turn -----------------------------------------------------------------------------

    async def _converse(self, client: ChatClient) -> None:
        while True:
            self.state = AgentState.PREFILL
            self.reply = reply = AssistantReply()
            await client.stream_turn(self.messages, self.tools, self._turn_params(), reply, self._on_pieces)
            self.reply = None
            job, call_ids = self._end_turn(reply)
            if job is None:
                return
            await _run_in_thread(job, self.toolbox)
            self.record_results(job, appended_tokens=None)  # known from the next turn's usage
            self.messages.append(reply.message())
            self.messages += [{"role": "tool", "tool_call_id": call_id, "content": output}
                              for call_id, output in zip(call_ids, job.outputs)]

    def _on_pieces(self, count: int) -> None:
        now = self.clock()
        if self.state is AgentState.PREFILL:
            self.state = AgentState.DECODING
            self.first_token.set()
            self._event("prefilled", turn=self.turn + 1)
        self.generated_tokens += count
        self.throughput.add(now, count)
        if self.first_token_at is None:
            self.first_token_at = now

    def _end_turn(self, reply: AssistantReply) -> tuple[ToolJob | None, list[str]]:
        self.turn += 1
        self.state = AgentState.TOOL
        self.generated_tokens += reply.tokens - reply.pieces  # the usage's count replaces the estimate
        self._count_usage(reply)
        self._event("assistant", turn=self.turn, content=reply.content, tokens=reply.tokens,
                    finish_reason=reply.finish_reason, context_tokens=self.context_tokens,
                    prompt_tokens=reply.prompt_tokens, cached_tokens=reply.cached_tokens,
                    **({"tool_calls": reply.message()["tool_calls"]} if reply.tool_calls else {}))
        parsed, call_ids = self._parse_calls(reply)
        reason = self.limit_reason(parsed, self.limits.max_turns, self.limits.max_tokens,
                                   self.cut_reason(reply.finish_reason, self.limits.max_tokens))
        if reason is not None:
            self.record_end(AgentState.DONE, reason)
            return None, []
        self.announce_calls(parsed)
        return ToolJob(self.turn, parsed.calls, parsed.errors, end_token=None), call_ids

    def _parse_calls(self, reply: AssistantReply) -> tuple[ParseResult, list[str]]:
        """The calls and the ids their results answer: the server's, or made up for text calls."""
        if not reply.tool_calls:
            parsed = parse_tool_calls(reply.content)
            count = len(parsed.calls) + len(parsed.errors)
            return parsed, [f"call_{self.turn}_{number}" for number in range(1, count + 1)]
        parsed, call_ids, error_ids = ParseResult(content=reply.content), [], []
        for number, call in enumerate(reply.tool_calls, start=1):
            one = parse_structured_call(call.name, call.arguments, number)
            parsed.calls += one.calls
            parsed.errors += one.errors
            (call_ids if one.calls else error_ids).append(call.id or f"call_{self.turn}_{number}")
        return parsed, call_ids + error_ids  # results first, then errors: the order of job.outputs

    def _count_usage(self, reply: AssistantReply) -> None:
        if reply.prompt_tokens is None:
            self.context += reply.pieces
            return
        if self.prompt_tokens is None:
            self.prompt_tokens = reply.prompt_tokens
        else:  # what the last turn's results (and their chat framing) added to the context
            self.tool_tokens += max(0, reply.prompt_tokens - self.context)
        self.prompt_tokens_total += reply.prompt_tokens
        self.last_prompt_tokens, self.last_cached_tokens = reply.prompt_tokens, reply.cached_tokens
        if reply.cached_tokens is not None:
            self.cached_tokens_total = (self.cached_tokens_total or 0) + reply.cached_tokens
            if self.first_cached_tokens is None:
                self.first_cached_tokens = reply.cached_tokens
        self.context = reply.prompt_tokens + reply.tokens

    def _turn_params(self) -> SamplingParams:
        room = self.limits.max_tokens - self.generated_tokens
        return replace(self.params, max_tokens=max(1, min(self.params.max_tokens, room)), stop=[])


async def _run_in_thread(job: ToolJob, toolbox: ToolBox) -> None:
    """Runs the tools in a daemon thread: a cancelled agent does not wait for them, nor does exit."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def work() -> None:
        job.run_safely(toolbox)
        try:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))
        except RuntimeError:  # the run ended meanwhile and closed its loop
            pass

    threading.Thread(target=work, name="tools", daemon=True).start()
    await done


def _names(tools: list[dict]) -> list[str]:
    return [tool["function"]["name"] for tool in tools]
