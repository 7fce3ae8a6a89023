"""What every API of `swarm serve` shares: the serving context, the request limits, and the
generation job each route starts and answers (its body is the API's own; the engine work is one).

    route:   body -> ChatInputs (messages, tools, tool_choice)       the API's converter
             start_chat_job(ctx, body, inputs, ...) -> Job            one rendering for every API
             answer(...) -> reply                                     in the API's own shapes
"""
from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from engine import AsyncEngine, Tokenizer
from swarm.server.chat_output import OutputText
from swarm.server.chat_prompt import ChatPrompter
from swarm.server.exchanges import Exchanges
from swarm.server.forced_call import forced_call_start
from swarm.server.metrics import ReplyCounts
from swarm.server.protocol import ApiError, ChatMessage, GenerationRequest
from swarm.server.responses import ClientGone, Job, generate_all, generate_events
from swarm.server.served_model import ServedModel

log = logging.getLogger("swarm.serve")


@dataclass(slots=True)
class ChatInputs:
    """A conversation as every API converts it, before rendering: swarm's chat messages, the tools
    offered (OpenAI function-tool dicts) and the tool choice."""

    messages: list[ChatMessage]
    tools: list[dict] | None = None
    tool_choice: str | dict | None = None


@dataclass(slots=True)
class ServeContext:
    """The one engine and model every route serves, and what the routes share."""

    engine: AsyncEngine
    model: ServedModel
    limits: Limits
    tokenizer: Tokenizer
    prompter: ChatPrompter
    replies: ReplyCounts
    exchanges: Exchanges | None = None   # None: nobody listens, and no records are made


@dataclass(slots=True)
class Limits:
    context: int
    kv_tokens: int
    vocab_size: int
    max_output: int | None = None   # the most tokens any reply gets (swarm run's sampling.max_tokens)

    @classmethod
    def of(cls, engine: AsyncEngine, max_output: int | None = None) -> "Limits":
        llm = engine.engine
        return cls(llm.config.max_position_embeddings, llm.kv_capacity_tokens, llm.config.vocab_size, max_output)

    async def room(self, engine: AsyncEngine, prompt_ids: list[int], param: str) -> int:
        """How many tokens may follow the prompt; a 400 before any compute when it alone does not fit."""
        prompt = len(prompt_ids)
        if prompt >= self.context:
            raise ApiError(400, f"this model's maximum context length is {self.context} tokens, and the "
                                f"{param} have {prompt}; shorten them", param=param, code="context_length_exceeded")
        held = await engine.max_request_tokens(prompt_ids)
        if prompt >= held:
            raise ApiError(400, self._kv_full(prompt, held, param), param=param, code="context_length_exceeded")
        room = min(self.context, held) - prompt
        return room if self.max_output is None else min(room, self.max_output)

    def _kv_full(self, prompt: int, held: int, param: str) -> str:
        pinned = self.kv_tokens - held
        pool = (f"the pool holds {self.kv_tokens} tokens and the pinned trunk keeps {pinned} of them (a prompt "
                "that starts with the trunk shares those)") if pinned else f"the pool holds {self.kv_tokens} tokens"
        return (f"the {param} have {prompt} tokens, but at most {held - 1} fit in this server's KV cache: {pool}; "
                "shorten them or restart with a larger --kv-budget")

    def check_token_ids(self, ids: list) -> list[int]:
        bad = next((i for i, t in enumerate(ids) if type(t) is not int or not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ApiError(400, f"prompt: token ids must be integers from 0 to {self.vocab_size - 1}; item {bad} "
                                f"is {json.dumps(ids[bad])}", param="prompt")
        return ids


def check_model(body: GenerationRequest, model: ServedModel, hint: str = "") -> None:
    """`hint`: how the API's usual client is told the model's name."""
    if body.model not in model.aliases | {model.name}:
        raise ApiError(404, f"the model {body.model!r} does not exist; this server serves {model.name!r}{hint}",
                       param="model", code="model_not_found")
    body.check_supported()


async def start_chat_job(ctx: ServeContext, body: GenerationRequest, inputs: ChatInputs, param: str) -> Job:
    """The job for a conversation, rendered as every API renders it; a tool_choice that forces a call ends
    the prompt with the call's start, which the reply is parsed with."""
    start = forced_call_start(inputs.tool_choice, inputs.tools)
    prompt = await run_in_threadpool(ctx.prompter.build, inputs.messages, inputs.tools, inputs.tool_choice)
    forced = ctx.tokenizer.encode(start) if start else []
    output = OutputText(ctx.tokenizer, body.stop_strings(), prompt.parse_tool_calls)
    output.add(forced)
    job = await start_job(ctx, body, prompt.token_ids + forced, param, output, chat=True)
    job.forced_tokens = len(forced)
    return job


async def start_job(ctx: ServeContext, body: GenerationRequest, prompt_ids: list[int], param: str,
                    output: OutputText, chat: bool) -> Job:
    """The job for `prompt_ids`: a 400 before any compute when they do not fit; `max_tokens` above what
    fits, or none, is clamped to what fits, and the reply ends with the API's length reason."""
    room = await ctx.limits.room(ctx.engine, prompt_ids, param)
    wanted = body.requested_max_tokens()
    try:  # more than fits, or none asked: up to what fits, ending with "length" (as llama.cpp does)
        params = body.sampling_params(min(wanted or room, room))
    except ValueError as err:
        raise ApiError(400, str(err)) from None
    prefix = "chatcmpl" if chat else "cmpl"
    return Job(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), body.model, prompt_ids, params, output,
               body.include_usage, chat, on_finish=ctx.replies.add)


class EventStream(StreamingResponse):
    """Closes its events however the response ends, so a client that left cancels its request now;
    then `on_close()`."""

    def __init__(self, *args, on_close: Callable[[], None] = lambda: None, **kwargs):
        super().__init__(*args, **kwargs)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()
            self.on_close()


async def answer(ctx: ServeContext, job: Job, stream: bool, request: Request,
                 events: AsyncIterator[str] | None = None, whole: Callable[[], dict] | None = None) -> Response:
    """The job's reply, streamed or whole, in an API's shapes: `events`, its event stream (chat and
    completions chunks by default); `whole()`, its body once the job is done (the chat body by default).
    A client that leaves before a whole reply gets a 499, and its request is cancelled. The job is the
    agent's whose key the request carried, and the listeners hear of it here, for every API alike."""
    job.agent = getattr(request.state, "agent", None)
    finish = await _report_start(ctx.exchanges, job, request)
    if stream:
        return EventStream(generate_events(ctx.engine, job) if events is None else events,
                           media_type="text/event-stream", headers={"Cache-Control": "no-cache",
                                                                    "X-Accel-Buffering": "no"}, on_close=finish)
    try:
        body = await generate_all(ctx.engine, job, request)
    except ClientGone:
        log.info("client of %s went away; request cancelled", job.request_id)
        return Response(status_code=499)
    finally:
        finish()
    return JSONResponse(body if whole is None else whole())


async def _report_start(exchanges: Exchanges | None, job: Job, request: Request) -> Callable[[], None]:
    """Tells the listeners the job started; what tells them, once, that it finished."""
    if exchanges is None:
        return lambda: None
    path = request.url.path
    exchanges.started(job, path, await request.json())
    told = False

    def finish() -> None:
        nonlocal told
        if not told:
            told = True
            exchanges.finished(job, path)
    return finish
