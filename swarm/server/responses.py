"""One generation, answered the OpenAI way: a whole response, or server-sent events.

    data: {"object": "chat.completion.chunk", "choices": [{"delta": {...}}]}\\n\\n    (repeated)
    data: {... "choices": [], "usage": {...}}\\n\\n         with stream_options.include_usage
    data: [DONE]\\n\\n

A client that goes away cancels its request: a stream's task is cancelled by the server on
disconnect, and a whole-response request watches for the disconnect itself. Either way the
generator over the engine closes, which releases the sequence and its blocks.
"""
from __future__ import annotations

import asyncio
import json
import logging
from contextlib import aclosing
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from starlette.requests import Request

from engine import AsyncEngine, GenerationDelta, RequestFailed, SamplingParams
from swarm.server.chat_output import ChatOutput, OutputText
from swarm.server.protocol import ApiError, error_body

DONE = "data: [DONE]\n\n"
log = logging.getLogger("swarm.serve")


@dataclass(slots=True)
class Finished:
    finish_reason: str           # as the client gets it: tool_calls when the reply holds calls
    num_cached_tokens: int
    output: ChatOutput


@dataclass(slots=True)
class ClientReply:
    """A finished reply in its API's words: the finish reason and tool calls its client got."""

    finish_reason: str
    text: str
    tool_calls: list[dict]


def chat_reply(finished: Finished) -> ClientReply:
    """OpenAI's chat and completions words, which are swarm's own."""
    return ClientReply(finished.finish_reason, finished.output.content or "", finished.output.tool_calls)


@dataclass(slots=True)
class Job:
    """A validated request, ready for the engine."""

    request_id: str
    created: int
    model: str
    prompt_ids: list[int]
    params: SamplingParams
    output: OutputText
    include_usage: bool
    chat: bool
    on_finish: Callable[[str], None] = lambda finish_reason: None
    finished: Finished | None = None
    forced_tokens: int = 0       # the prompt's last tokens that start a forced call (swarm/server/forced_call.py)
    agent: str | None = None     # whose key the request came with (swarm/server/app.py)
    client_reply: Callable[[Finished], ClientReply] = chat_reply   # each API sets its own words
    num_cached_tokens: int = 0   # as the engine last said, also when the request never finishes
    error: str | None = None     # why the engine failed it

    def generated_tokens(self) -> int:
        """The reply's tokens the model wrote: a forced call's start is the prompt's, not generated."""
        return max(len(self.output.token_ids) - self.forced_tokens, 0)


class ClientGone(Exception):
    """The client disconnected before its whole response was ready."""


async def generate_all(engine: AsyncEngine, job: Job, request: Request) -> dict:
    """The whole response, or ApiError; the request is cancelled if its client disconnects."""
    work = asyncio.ensure_future(_run(engine, job))
    watch = asyncio.ensure_future(_until_disconnect(request))
    try:
        await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
    if not work.done() or work.cancelled():
        raise ClientGone()
    try:
        finished = work.result()
    except RequestFailed as err:
        raise ApiError(500 if err.internal else 400, str(err)) from None
    return _chat_response(job, finished) if job.chat else _completion_response(job, finished)


async def generate_events(engine: AsyncEngine, job: Job) -> AsyncIterator[str]:
    """The response as server-sent events; a failure after the headers went out is an error event."""
    async with aclosing(stream_with_errors(_events(engine, job), job, _error_events)) as events:
        async for event in events:
            yield event


async def stream_with_errors(events: AsyncIterator[str], job: Job,
                             error_events: Callable[[int, str], list[str]]) -> AsyncIterator[str]:
    """`events`; if they fail once the headers went out, the API's own error events (`error_events(status,
    message)`, status 400 for the request's fault, 500 for ours) end the stream instead of a dropped connection."""
    try:
        async with aclosing(events) as inner:
            async for event in inner:
                yield event
    except RequestFailed as err:
        for event in error_events(500 if err.internal else 400, str(err)):
            yield event
    except Exception as err:
        log.exception("stream %s failed", job.request_id)
        for event in error_events(500, f"internal error: {type(err).__name__}: {err}"):
            yield event


def _error_events(status: int, message: str) -> list[str]:
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return [_sse(error_body(message, kind, code=status)), DONE]


async def _events(engine: AsyncEngine, job: Job) -> AsyncIterator[str]:
    if job.chat:
        yield _sse(_chunk(job, {"role": "assistant", "content": ""}))
    async with aclosing(text_pieces(engine, job)) as pieces:
        async for piece in pieces:
            yield _sse(_chunk(job, {"content": piece}) if job.chat else _chunk(job, text=piece))
    for chunk in _final_chunks(job, job.finished):
        yield _sse(chunk)
    if job.include_usage:
        yield _sse({**_envelope(job), "choices": [], "usage": _usage(job, job.finished)})
    yield DONE


async def engine_deltas(engine: AsyncEngine, job: Job) -> AsyncIterator[GenerationDelta]:
    """The engine's deltas for the job, which notes its cached tokens and, before it propagates, a failure."""
    try:
        async with aclosing(engine.generate(job.prompt_ids, job.params, job.request_id)) as deltas:
            async for delta in deltas:
                job.num_cached_tokens = delta.num_cached_tokens
                yield delta
    except RequestFailed as err:
        job.error = str(err)
        raise


async def text_pieces(engine: AsyncEngine, job: Job) -> AsyncIterator[str]:
    """The text as it becomes safe to send; the finish is left on job.finished."""
    async with aclosing(engine_deltas(engine, job)) as deltas:
        async for delta in deltas:
            piece = job.output.add(delta.token_ids)
            if piece:
                yield piece
            note_finish(job, delta)


def note_finish(job: Job, delta: GenerationDelta) -> None:
    if not delta.finish_reason:
        return
    output = job.output.finish()
    reason = "tool_calls" if output.tool_calls else delta.finish_reason
    job.finished = Finished(reason, delta.num_cached_tokens, output)
    job.on_finish(reason)


async def _run(engine: AsyncEngine, job: Job) -> Finished:
    async with aclosing(text_pieces(engine, job)) as pieces:
        async for _ in pieces:
            pass
    return job.finished


async def _until_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _final_chunks(job: Job, finished: Finished) -> list[dict]:
    output, reason = finished.output, finished.finish_reason
    rest = job.output.unsent(output)
    if not job.chat:
        return ([_chunk(job, text=rest)] if rest else []) + [_chunk(job, text="", finish_reason=reason)]
    chunks = [_chunk(job, {"content": rest})] if rest else []
    for index, call in enumerate(output.tool_calls):
        chunks.append(_chunk(job, {"tool_calls": [{"index": index, **call}]}))
    return chunks + [_chunk(job, {}, finish_reason=reason)]


def _chat_response(job: Job, finished: Finished) -> dict:
    output = finished.output
    message = {"role": "assistant", "content": output.content}
    if output.tool_calls:
        message["tool_calls"] = output.tool_calls
    return {**_envelope(job, "chat.completion"), "usage": _usage(job, finished),
            "choices": [{"index": 0, "message": message, "finish_reason": finished.finish_reason,
                         "logprobs": None}]}


def _completion_response(job: Job, finished: Finished) -> dict:
    choice = {"index": 0, "text": finished.output.content or "", "finish_reason": finished.finish_reason,
              "logprobs": None}
    return {**_envelope(job, "text_completion"), "choices": [choice], "usage": _usage(job, finished)}


def _chunk(job: Job, delta: dict | None = None, text: str | None = None, finish_reason: str | None = None) -> dict:
    choice = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
    if job.chat:
        choice["delta"] = delta or {}
    else:
        choice["text"] = text or ""
    return {**_envelope(job), "choices": [choice]}


def _envelope(job: Job, kind: str | None = None) -> dict:
    kind = kind or ("chat.completion.chunk" if job.chat else "text_completion")
    return {"id": job.request_id, "object": kind, "created": job.created, "model": job.model}


def _usage(job: Job, finished: Finished) -> dict:
    prompt, completion = len(job.prompt_ids), job.generated_tokens()
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": finished.num_cached_tokens}}


def _sse(payload: dict) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"
